package idemecho_test

import (
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idemkit/idem/idemecho"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/adaptertest"
)

// TestCrashTakeover SIGKILLs a real echo server process between the
// handler's write and the stored response, restarts it and retries the key
// (adaptertest.CrashTakeover says what each mode must do).
func TestCrashTakeover(t *testing.T) {
	t.Parallel()
	adaptertest.CrashTakeover(t)
}

// TestCrashChild is the echo server of TestCrashTakeover; run by the test
// alone it does nothing.
func TestCrashChild(t *testing.T) {
	adaptertest.CrashChild(t, func(ln net.Listener, mw *idempotency.Middleware, effect adaptertest.Effect) error {
		e := echo.New()
		e.HideBanner = true
		e.Use(idemecho.New(mw))
		e.POST("/effects", func(c echo.Context) error {
			tx, _ := idemecho.Tx(c)
			id, err := effect(c.Request().Context(), tx)
			if err != nil {
				return err
			}
			return c.JSON(http.StatusCreated, map[string]int64{"effect": id})
		})
		return (&http.Server{Handler: e, ReadHeaderTimeout: 10 * time.Second}).Serve(ln)
	})
}
