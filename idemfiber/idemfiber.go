// Package idemfiber guards Fiber v3 handlers with Idempotency-Key: the
// semantics of package idempotency (scope, fingerprint, replay with
// Idempotent-Replayed, 409 in progress with Retry-After, wait mode, both
// modes, release on 5xx and panic) as a native fiber.Handler.
//
//	guard, err := idemfiber.New(mw, &idemfiber.Config{Scope: principalOf})
//	...
//	app.Post("/charges/:account", recover.New(), guard, func(c fiber.Ctx) error {
//		tx, _ := idemfiber.Tx(c) // ModeTransactional: commits with the stored response
//		...
//	})
//
// In ModeTransactional the handler reaches the request's transaction with
// Tx(c); DoNotStore(c) delivers a response once, unstored.
//
// # How it works
//
// It does not reimplement the protocol, and it does not adapt fasthttp to
// net/http: it hands the request's parts (method, route, path, headers,
// body) to idempotency.Middleware.Serve, the engine behind Wrap, and runs
// the rest of the Fiber chain as the guarded handler on the fiber.Ctx
// itself. fasthttp buffers a response until the handler returns, so the
// engine decides (store, commit, release) before a byte goes out. What is
// Fiber's own:
//
//   - the route scope is Fiber's route template, c.Route().Path
//     ("/orders/:id"), when idemfiber is one of the route's handlers
//     (app.Post("/orders/:id", guard, handler)). Registered with app.Use
//     it runs before routing has found the final route, so it scopes by
//     the request's path instead, as the middleware does for a request
//     with no pattern. Config.Route, when set, wins;
//   - the principal comes from Config.Scope, a function of the fiber.Ctx
//     (the Middleware's Config.Scope is net/http's and is not called);
//   - an error the handler returns is turned into its response by the
//     app's ErrorHandler inside the guarded chain, so that response is
//     what is stored (a *fiber.Error with a 4xx) or released (a 5xx);
//   - a panic goes through the engine, which releases the key (or rolls
//     back) and panics on, to a recover middleware placed before
//     idemfiber; one placed after it answers 500 inside the chain, which
//     is released like any 5xx.
//
// What it does not do: fasthttp does not tell a handler that its client
// hung up, so "client gone" (Config.KeepOnClientGone) is seen only when
// the context the app set with c.SetContext ends.
package idemfiber

import (
	"context"
	"errors"
	"net/http"

	"github.com/gofiber/fiber/v3"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idempotency"
)

// ErrNoScope is New's error for a Config without Scope.
var ErrNoScope = errors.New("idemfiber: Config.Scope is required")

// Config configures the Fiber handler. Scope is required.
type Config struct {
	// Scope returns the authenticated principal of the request; every key
	// is scoped by it (and by method and route). An error answers 401 and
	// the handler does not run. Required: there is no default.
	Scope func(c fiber.Ctx) (string, error)

	// Route returns the route scope of the request. Defaults to
	// c.Route().Path when idemfiber is a handler of the route, else the
	// request's path.
	Route func(c fiber.Ctx) string
}

// New returns mw as a Fiber handler: per route
// (app.Post("/charges/:account", guard, handler)), per group, or with
// app.Use (then scoped by path, see the package doc). Methods that mw does
// not guard (by default all but POST and PATCH) pass through untouched.
func New(mw *idempotency.Middleware, cfg *Config) (fiber.Handler, error) {
	if cfg == nil || cfg.Scope == nil {
		return nil, ErrNoScope
	}
	scope, route := cfg.Scope, cfg.Route
	if route == nil {
		route = defaultRoute
	}
	return func(c fiber.Ctx) error {
		if !mw.Guards(c.Method()) {
			return c.Next()
		}
		req := c.Request()
		g := &guarded{c: c}
		mw.Serve(c.Context(), &idempotency.Request{
			Method:   c.Method(),
			Route:    route(c),
			Path:     string(req.URI().PathOriginal()),
			RawQuery: string(req.URI().QueryString()),
			Header: func(name string) []string {
				vs := req.Header.PeekAll(name)
				if len(vs) == 0 {
					return nil
				}
				out := make([]string, len(vs))
				for i, v := range vs {
					out[i] = string(v)
				}
				return out
			},
			Body:  req.Body(),
			Scope: func() (string, error) { return scope(c) },
		}, g, (*answer)(g))
		// Whatever the engine did (ran the chain, or answered by itself
		// so that the chain must not run), the response is written.
		return nil
	}, nil
}

func defaultRoute(c fiber.Ctx) string {
	// Matched: a route (not an app.Use prefix) holds this handler, so its
	// template is the final route's.
	if c.Matched() {
		return c.Route().Path
	}
	return string(c.Request().URI().PathOriginal())
}

// Tx returns the transaction ModeTransactional opened for the request:
// the handler's writes through it commit with the claim and the stored
// response, or not at all. ok is false outside ModeTransactional.
func Tx(c fiber.Ctx) (tx pgx.Tx, ok bool) {
	return idempotency.TxFromContext(c.Context())
}

// Principal returns the principal Config.Scope computed for the request.
func Principal(c fiber.Ctx) (principal string, ok bool) {
	return idempotency.PrincipalFromContext(c.Context())
}

// DoNotStore is idempotency.DoNotStore for Fiber: the response the
// handler is writing is delivered once, unreplayed, and the key released.
// It reports whether it is inside idemfiber's guarded chain.
func DoNotStore(c fiber.Ctx) bool {
	g, ok := c.Context().Value(guardedKey{}).(*guarded)
	if ok {
		g.noStore = true
	}
	return ok
}

type guardedKey struct{}

// guarded is the request's idempotency.Handler: the rest of the Fiber
// chain, on the fiber.Ctx, whose response fasthttp holds until the
// handler returns.
type guarded struct {
	c       fiber.Ctx
	ran     bool
	noStore bool
	header  http.Header // the middleware's own answer's headers
}

func (g *guarded) Run(ctx context.Context) {
	g.ran = true
	c := g.c
	prev := c.Context()
	// Restore the app's context even if a later handler panics: a
	// recover middleware outside idemfiber answers on it.
	defer c.SetContext(prev)
	c.SetContext(context.WithValue(ctx, guardedKey{}, g))
	if err := c.Next(); err != nil {
		// The error's response is the one stored or released, as Fiber
		// would answer it after the chain.
		if herr := c.App().ErrorHandler(c, err); herr != nil {
			_ = c.SendStatus(fiber.StatusInternalServerError)
		}
	}
}

func (g *guarded) Response() (*idempotency.Response, bool) {
	resp := g.c.Response()
	h := make(http.Header)
	for k, v := range resp.Header.All() {
		h.Add(string(k), string(v))
	}
	// The engine may keep the body (a MemoryStore does) beyond the
	// request, and fasthttp reuses its buffer: a copy.
	body := append([]byte(nil), resp.Body()...)
	return &idempotency.Response{Status: resp.StatusCode(), Header: h, Body: body}, g.noStore
}

// Send does nothing: the handler's response is already fasthttp's.
func (g *guarded) Send() {}

// answer is the http.ResponseWriter the engine writes its own answers to
// (a replay, a refusal, a conflict), straight into fasthttp's response.
type answer guarded

func (a *answer) Header() http.Header {
	if a.header == nil {
		a.header = make(http.Header)
	}
	return a.header
}

func (a *answer) WriteHeader(status int) {
	resp := a.c.Response()
	if a.ran {
		// The engine replaces what the handler wrote (its commit failed,
		// or a newer owner fenced it out): none of it may go out.
		resp.Reset()
	}
	for k, vs := range a.header {
		resp.Header.Del(k)
		for _, v := range vs {
			resp.Header.Add(k, v)
		}
	}
	resp.SetStatusCode(status)
	resp.ResetBody()
}

func (a *answer) Write(b []byte) (int, error) {
	a.c.Response().AppendBody(b)
	return len(b), nil
}
