package idemfiber_test

import (
	"net"
	"net/http"
	"testing"

	"github.com/gofiber/fiber/v3"
	"github.com/gofiber/fiber/v3/middleware/recover"

	"github.com/idemkit/idem/idemfiber"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/adaptertest"
)

// TestCrashTakeover SIGKILLs a real Fiber server process between the
// handler's write and the stored response, restarts it and retries the key
// (adaptertest.CrashTakeover says what each mode must do).
func TestCrashTakeover(t *testing.T) {
	t.Parallel()
	adaptertest.CrashTakeover(t)
}

// TestCrashChild is the Fiber server of TestCrashTakeover; run by the test
// alone it does nothing.
func TestCrashChild(t *testing.T) {
	adaptertest.CrashChild(t, func(ln net.Listener, mw *idempotency.Middleware, effect adaptertest.Effect) error {
		guard, err := idemfiber.New(mw, &idemfiber.Config{Scope: principal})
		if err != nil {
			return err
		}
		app := fiber.New()
		app.Post("/effects", recover.New(), guard, func(c fiber.Ctx) error {
			tx, _ := idemfiber.Tx(c)
			id, err := effect(c.Context(), tx)
			if err != nil {
				return c.Status(http.StatusInternalServerError).SendString(err.Error())
			}
			return c.Status(http.StatusCreated).JSON(fiber.Map{"effect": id})
		})
		return app.Listener(ln, fiber.ListenConfig{DisableStartupMessage: true})
	})
}
