// Package idemgin guards gin handlers with Idempotency-Key: the semantics
// of package idempotency (scope, fingerprint, replay with
// Idempotent-Replayed, 409 in progress with Retry-After, wait mode, both
// modes, release on 5xx, panic and disconnect) as a gin.HandlerFunc.
//
// It does not reimplement the protocol: every request goes through an
// idempotency.Middleware, whose engine decides, stores and replays. gin
// serves net/http, so the adapter hands the middleware gin's own
// *http.Request and runs the rest of the gin chain as the guarded handler,
// on a gin.ResponseWriter that writes into the middleware's buffer. What
// differs from net/http is only:
//
//   - the route scope is gin's route template, c.FullPath() ("/orders/:id"),
//     so /orders/1 and /orders/2 share a route, as r.Pattern does for
//     http.ServeMux (a request gin did not route, FullPath "", falls back
//     to the path, as the middleware's default Route does). A Config.Route
//     of the Middleware, when set, wins;
//   - a panic in a later handler is caught by the middleware, which
//     releases the key (or rolls the transaction back) and panics on, into
//     gin.Recovery placed before idemgin; a gin.Recovery placed after
//     idemgin turns the panic into a 500 inside the guarded chain, which
//     the middleware releases like any 5xx. Either order is safe;
//   - when the middleware answers by itself (a replay, a conflict, a
//     refusal) the rest of the chain is aborted: the handler does not run.
//
// In ModeTransactional the handler reaches the request's transaction with
// Tx(c) (or idempotency.TxFromContext(c.Request.Context())). A handler may
// refuse to have its response stored with DoNotStore(c).
//
// What it does not do: a streamed response (c.Stream, SSE, Flush) is
// buffered until the outcome is decided, as in the middleware, and a
// guarded response cannot be hijacked.
package idemgin

import (
	"bufio"
	"errors"
	"net"
	"net/http"

	"github.com/gin-gonic/gin"
	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idempotency"
)

// ErrHijack is returned by Hijack on a guarded response: its bytes are
// buffered until the middleware has stored (or released) them, so the
// connection cannot be handed over.
var ErrHijack = errors.New("idemgin: a guarded response cannot be hijacked")

// New returns mw as gin middleware: engine.Use(idemgin.New(mw)), or per
// route group. Methods that mw does not guard (by default all but POST and
// PATCH) pass through untouched.
func New(mw *idempotency.Middleware) gin.HandlerFunc {
	return func(c *gin.Context) {
		orig, origReq := c.Writer, c.Request
		r := origReq
		if p := c.FullPath(); p != "" && r.Pattern == "" {
			r = r.WithContext(r.Context())
			r.Pattern = p
		}
		ran := false
		guarded := http.HandlerFunc(func(w http.ResponseWriter, gr *http.Request) {
			ran = true
			// Restore gin's writer and request even if a later handler
			// panics: gin.Recovery (or gin's own cleanup) outside this
			// middleware must write to the client, not to the buffer.
			defer func() { c.Writer, c.Request = orig, origReq }()
			gw := &writer{rec: w, orig: orig, size: -1, status: http.StatusOK}
			c.Writer, c.Request = gw, gr
			c.Next()
			gw.WriteHeaderNow()
		})
		mw.Wrap(guarded).ServeHTTP(orig, r)
		if !ran {
			// The middleware answered by itself: the handler must not run.
			c.Abort()
		}
	}
}

// Tx returns the transaction ModeTransactional opened for the request:
// the handler's writes through it commit with the claim and the stored
// response, or not at all. ok is false outside ModeTransactional.
func Tx(c *gin.Context) (tx pgx.Tx, ok bool) {
	return idempotency.TxFromContext(c.Request.Context())
}

// DoNotStore is idempotency.DoNotStore for gin: the response the handler
// is writing is delivered once, unreplayed, and the key released. It
// reports whether the middleware's writer was found.
func DoNotStore(c *gin.Context) bool {
	return idempotency.DoNotStore(c.Writer)
}

// writer is the gin.ResponseWriter of the guarded chain: gin's status
// rules (the last WriteHeader before the first byte wins) over the
// middleware's buffer.
type writer struct {
	rec    http.ResponseWriter
	orig   gin.ResponseWriter
	status int
	size   int // -1 until the header is written
}

var _ gin.ResponseWriter = (*writer)(nil)

func (w *writer) Header() http.Header { return w.rec.Header() }

func (w *writer) WriteHeader(code int) {
	if code > 0 && !w.Written() {
		w.status = code
	}
}

func (w *writer) WriteHeaderNow() {
	if !w.Written() {
		w.size = 0
		w.rec.WriteHeader(w.status)
	}
}

func (w *writer) Write(b []byte) (int, error) {
	w.WriteHeaderNow()
	n, err := w.rec.Write(b)
	w.size += n
	return n, err
}

func (w *writer) WriteString(s string) (int, error) { return w.Write([]byte(s)) }

func (w *writer) Status() int   { return w.status }
func (w *writer) Size() int     { return w.size }
func (w *writer) Written() bool { return w.size != -1 }

// Flush is a no-op: the response is buffered until its outcome is known.
func (w *writer) Flush() {}

func (w *writer) Hijack() (net.Conn, *bufio.ReadWriter, error) { return nil, nil, ErrHijack }

// CloseNotify is the client connection's, for handlers that watch it.
func (w *writer) CloseNotify() <-chan bool { return w.orig.CloseNotify() }

func (w *writer) Pusher() http.Pusher { return nil }

// Unwrap returns the middleware's writer, for idempotency.DoNotStore and
// http.ResponseController.
func (w *writer) Unwrap() http.ResponseWriter { return w.rec }
