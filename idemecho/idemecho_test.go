package idemecho_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/idemkit/idem/idemecho"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/adaptertest"
)

// build serves adaptertest's contract with echo behind idemecho, echo's
// Recover before or after it.
func build(t *testing.T, a *adaptertest.App, mw *idempotency.Middleware) string {
	e := echo.New()
	e.HideBanner = true
	e.Logger.SetOutput(io.Discard)
	recovery := middleware.RecoverWithConfig(middleware.RecoverConfig{DisablePrintStack: true})
	if !a.RecoveryInside {
		e.Use(recovery)
	}
	e.Use(idemecho.New(mw))
	if a.RecoveryInside {
		e.Use(recovery)
	}
	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if !a.Gate.Wait(c.Request().Context()) {
				return c.NoContent(http.StatusServiceUnavailable)
			}
			return next(c)
		}
	})
	effect := func(c echo.Context) error {
		h := c.Request().Header
		if h.Get("X-Bad") != "" {
			// A definitive refusal as echo's HTTPError: stored and replayed.
			return echo.NewHTTPError(http.StatusUnprocessableEntity, "refused")
		}
		if h.Get("X-Fault") != "" {
			// A plain error, which echo answers 500: released.
			return errors.New("injected fault")
		}
		body, err := io.ReadAll(c.Request().Body)
		if err != nil {
			return err
		}
		ctx := c.Request().Context()
		var id int64
		if tx, ok := idemecho.Tx(c); ok {
			err = tx.QueryRow(ctx, adaptertest.EffectSQL, h.Get("Authorization"), string(body)).Scan(&id)
		} else {
			err = a.Pool.QueryRow(ctx, adaptertest.EffectSQL, h.Get("Authorization"), string(body)).Scan(&id)
		}
		if err != nil {
			return err
		}
		if h.Get("X-Panic") != "" {
			panic("injected panic")
		}
		if h.Get("X-Fail-After-Write") != "" {
			// An HTTPError with a 5xx: released.
			return echo.NewHTTPError(http.StatusServiceUnavailable, "failed after the write")
		}
		if h.Get("X-No-Store") != "" {
			idemecho.DoNotStore(c)
		}
		c.Response().Header().Set("Location", fmt.Sprintf("/effects/%d", id))
		return c.JSON(http.StatusCreated, map[string]int64{"id": id})
	}
	e.POST("/charges", effect)
	e.POST("/refunds", effect)
	e.POST("/orders/:id", effect)
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestAdapter runs the adapters' behaviour suite (idemtest's conformance
// suite in both modes with Recover on either side, the 50-way race on one
// key, echo's route path as the scope, release and rollback, wait mode,
// an *echo.HTTPError stored) against an echo server behind idemecho.
func TestAdapter(t *testing.T) {
	t.Parallel()
	adaptertest.Run(t, build)
}
