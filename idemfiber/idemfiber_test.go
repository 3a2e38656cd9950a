package idemfiber_test

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"testing"

	"github.com/gofiber/fiber/v3"
	"github.com/gofiber/fiber/v3/middleware/recover"

	"github.com/idemkit/idem/idemfiber"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/adaptertest"
)

// principal is the suite's scope, read from the fiber.Ctx.
func principal(c fiber.Ctx) (string, error) {
	if a := c.Get("Authorization"); a != "" {
		return a, nil
	}
	return "", errors.New("no credentials")
}

// serve runs app on a loopback listener until the test ends.
func serve(t *testing.T, app *fiber.App) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = app.Listener(ln, fiber.ListenConfig{DisableStartupMessage: true})
	}()
	t.Cleanup(func() { _ = app.Shutdown(); <-done })
	return "http://" + ln.Addr().String()
}

// build serves adaptertest's contract behind idemfiber, which is one of
// each route's handlers (so that the route template is its scope).
func build(t *testing.T, a *adaptertest.App, mw *idempotency.Middleware) string {
	guard, err := idemfiber.New(mw, &idemfiber.Config{Scope: principal})
	if err != nil {
		t.Fatal(err)
	}
	app := fiber.New()
	rec := recover.New()
	gate := func(c fiber.Ctx) error {
		if !a.Gate.Wait(c.Context()) {
			return c.SendStatus(http.StatusServiceUnavailable)
		}
		return c.Next()
	}
	chain := []any{rec, guard}
	if a.RecoveryInside {
		chain = []any{guard, rec}
	}
	chain = append(chain, gate)
	effect := func(c fiber.Ctx) error {
		if c.Get("X-Bad") != "" {
			return fiber.NewError(http.StatusUnprocessableEntity, "refused")
		}
		if c.Get("X-Fault") != "" {
			return c.Status(http.StatusInternalServerError).SendString("injected fault")
		}
		ctx := c.Context()
		var id int64
		var err error
		if tx, ok := idemfiber.Tx(c); ok {
			err = tx.QueryRow(ctx, adaptertest.EffectSQL, c.Get("Authorization"), string(c.Body())).Scan(&id)
		} else {
			err = a.Pool.QueryRow(ctx, adaptertest.EffectSQL, c.Get("Authorization"), string(c.Body())).Scan(&id)
		}
		if err != nil {
			return c.Status(http.StatusInternalServerError).SendString(err.Error())
		}
		if c.Get("X-Panic") != "" {
			panic("injected panic")
		}
		if c.Get("X-Fail-After-Write") != "" {
			return c.Status(http.StatusServiceUnavailable).SendString("failed after the write")
		}
		if c.Get("X-No-Store") != "" {
			idemfiber.DoNotStore(c)
		}
		c.Set("Location", fmt.Sprintf("/effects/%d", id))
		return c.Status(http.StatusCreated).JSON(fiber.Map{"id": id})
	}
	for _, p := range []string{"/charges", "/refunds", "/orders/:id"} {
		app.Post(p, chain[0], append(chain[1:], effect)...)
	}
	return serve(t, app)
}

// TestAdapter runs the adapters' behaviour suite (idemtest's conformance
// suite in both modes with recover on either side, the 50-way race on one
// key, the route template scope, release and rollback, wait mode, a
// *fiber.Error stored) against a Fiber server behind idemfiber.
func TestAdapter(t *testing.T) {
	t.Parallel()
	adaptertest.Run(t, build)
}

// TestUseScopesByPath: registered with app.Use, idemfiber runs before
// Fiber has found the final route, so it scopes by the path: one key on
// /orders/1 and then /orders/2 is two operations (with the route template
// it would be a reused key, see the suite's route-template check). GET,
// which the middleware does not guard, passes through untouched.
func TestUseScopesByPath(t *testing.T) {
	t.Parallel()
	a := adaptertest.Setup(t, func(t *testing.T, a *adaptertest.App, mw *idempotency.Middleware) string {
		guard, err := idemfiber.New(mw, &idemfiber.Config{Scope: principal})
		if err != nil {
			t.Fatal(err)
		}
		app := fiber.New()
		app.Use(guard)
		app.Post("/orders/:id", func(c fiber.Ctx) error {
			var id int64
			if err := a.Pool.QueryRow(c.Context(), adaptertest.EffectSQL, c.Get("Authorization"), string(c.Body())).Scan(&id); err != nil {
				return err
			}
			return c.Status(http.StatusCreated).JSON(fiber.Map{"id": id})
		})
		app.Get("/orders/:id", func(c fiber.Ctx) error { return c.SendString("order " + c.Params("id")) })
		return serve(t, app)
	}, idempotency.ModeTwoStep, false, nil)
	for _, p := range []string{"/orders/1", "/orders/2"} {
		if r := a.Post(t, p, "k-use", `{}`); r.Status != http.StatusCreated || r.Replayed {
			t.Fatalf("%s: %+v, want its own 201", p, r)
		}
	}
	if r := a.Post(t, "/orders/2", "k-use", `{}`); r.Status != http.StatusCreated || !r.Replayed {
		t.Fatalf("/orders/2 again: %+v, want the replay", r)
	}
	resp, err := http.Get(a.URL + "/orders/7")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET without a key: %d, want 200", resp.StatusCode)
	}
	http.DefaultClient.CloseIdleConnections()
}

// TestNewNeedsScope: a Config without Scope is ErrNoScope.
func TestNewNeedsScope(t *testing.T) {
	t.Parallel()
	mw, err := idempotency.New(idempotency.NewMemoryStore(), &idempotency.Config{Scope: adaptertest.Principal})
	if err != nil {
		t.Fatal(err)
	}
	for _, cfg := range []*idemfiber.Config{nil, {}} {
		if _, err := idemfiber.New(mw, cfg); !errors.Is(err, idemfiber.ErrNoScope) {
			t.Errorf("New(%+v): %v, want ErrNoScope", cfg, err)
		}
	}
}
