// Package idemecho guards echo (v4) handlers with Idempotency-Key: the
// semantics of package idempotency (scope, fingerprint, replay with
// Idempotent-Replayed, 409 in progress with Retry-After, wait mode, both
// modes, release on 5xx, panic and disconnect) as an echo.MiddlewareFunc.
//
// It does not reimplement the protocol: every request goes through an
// idempotency.Middleware, whose engine decides, stores and replays. echo
// serves net/http, so the adapter hands the middleware echo's own
// *http.Request and runs the rest of the echo chain as the guarded
// handler, on an echo.Response over the middleware's buffer. What is
// echo's own:
//
//   - the route scope is echo's route path, c.Path() ("/orders/:id"), as
//     r.Pattern is for http.ServeMux; a Config.Route of the Middleware,
//     when set, wins;
//   - an error the handler returns is turned into its response by echo's
//     HTTPErrorHandler inside the guarded chain, so that response is what
//     is stored (an *echo.HTTPError with a 4xx) or released (a 5xx, or any
//     other error, which echo answers 500). The middleware then returns
//     nil: the error has been answered;
//   - a panic goes through the middleware, which releases the key (or
//     rolls back) and panics on, to a Recover middleware placed before
//     idemecho; a Recover placed after it answers 500 inside the chain,
//     which is released like any 5xx.
//
// In ModeTransactional the handler reaches the request's transaction with
// Tx(c). DoNotStore(c) delivers a response once, unstored.
package idemecho

import (
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/idemkit/idem/idempotency"
)

// New returns mw as echo middleware: e.Use(idemecho.New(mw)), or per
// group or route. Methods that mw does not guard pass through untouched.
func New(mw *idempotency.Middleware) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			origResp, origReq := c.Response(), c.Request()
			r := origReq
			if p := c.Path(); p != "" && r.Pattern == "" {
				r = r.WithContext(r.Context())
				r.Pattern = p
			}
			guarded := http.HandlerFunc(func(w http.ResponseWriter, gr *http.Request) {
				// Restore echo's response even if the handler panics: a
				// Recover outside this middleware must answer the client.
				defer func() { c.SetResponse(origResp); c.SetRequest(origReq) }()
				c.SetResponse(echo.NewResponse(w, c.Echo()))
				c.SetRequest(gr)
				if err := next(c); err != nil {
					// The error's response is the one stored or released.
					c.Error(err)
				}
			})
			// The middleware writes through echo's Response, so echo (and
			// its logger) see the status of what went out.
			mw.Wrap(guarded).ServeHTTP(origResp, r)
			return nil
		}
	}
}

// Tx returns the transaction ModeTransactional opened for the request;
// ok is false outside ModeTransactional.
func Tx(c echo.Context) (tx pgx.Tx, ok bool) {
	return idempotency.TxFromContext(c.Request().Context())
}

// DoNotStore is idempotency.DoNotStore for echo. It reports whether the
// middleware's writer was found.
func DoNotStore(c echo.Context) bool {
	return idempotency.DoNotStore(c.Response().Writer)
}
