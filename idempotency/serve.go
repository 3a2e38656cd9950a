package idempotency

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/idemkit/idem"
)

// Request is a request as Middleware.Serve reads it, for an adapter of a
// framework that does not serve net/http (idemfiber, over fasthttp): the
// parts the middleware needs, which such a framework has at hand without
// building an *http.Request.
type Request struct {
	// Method is the request's method.
	Method string
	// Route is the route scope ("/orders/:id"), in place of Config.Route.
	Route string
	// Path is the escaped path and RawQuery the query without its '?',
	// both in the fingerprint.
	Path, RawQuery string
	// Header returns the values of a request header: the middleware reads
	// Idempotency-Key, Content-Type and Config.FingerprintHeaders.
	Header func(name string) []string
	// Body is the whole request body. One longer than
	// Config.MaxRequestBody answers 413.
	Body []byte
	// Scope returns the request's principal, in place of Config.Scope; an
	// error answers 401.
	Scope func() (string, error)
}

// Handler is the guarded handler of Middleware.Serve, in the adapter's
// framework.
type Handler interface {
	// Run runs the handler under ctx, which carries the request's
	// transaction (TxFromContext) and principal (PrincipalFromContext).
	// Its response must stay buffered until Send. A panic goes through
	// Run: the middleware releases the key (or rolls back) and panics on.
	Run(ctx context.Context)
	// Response returns what Run wrote (Status 0 when it wrote nothing),
	// with all its headers: the middleware keeps those of
	// Config.ReplayHeaders. noStore asks for DoNotStore's treatment.
	Response() (resp *Response, noStore bool)
	// Send delivers what Run wrote to the client.
	Send()
}

// Guards reports whether the middleware guards method (Config.Methods):
// an adapter passes other requests through untouched.
func (m *Middleware) Guards(method string) bool { return m.cfg.methods[method] }

// Serve is Wrap's engine for an adapter of a framework that does not serve
// net/http: the same checks, claim, run, store or release, in the same
// mode, with the same events, for req, running h as the guarded handler.
// ctx is the request's: it lends its values to the handler's context and
// its end counts as the client gone (Config.KeepOnClientGone). w takes the
// middleware's own answers (a replay, a refusal, a conflict, or one that
// replaces h's response after a failed commit); it needs Header,
// WriteHeader and Write only, and a WriteHeader after h's Run must
// replace whatever h wrote. Serve guards req whatever its method: check
// Guards first.
func (m *Middleware) Serve(ctx context.Context, req *Request, h Handler, w http.ResponseWriter) {
	rq := &request{begin: time.Now(), ev: Event{Method: req.Method, Route: req.Route, Mode: m.cfg.Mode}}
	begin := rq.ev
	begin.Kind = EventBegin
	rq.ctx = idem.CallHook(m.cfg.Hook, ctx, begin)
	reject := func(status int, code, detail string, err error) {
		e := rq.ev
		e.Kind, e.Status, e.Err = EventRejected, status, err
		m.hook(rq, e)
		writeProblem(w, status, code, detail)
	}
	key, err := keyFromValues(req.Header(idem.HeaderKey))
	if errors.Is(err, ErrKeyRequired) {
		reject(http.StatusBadRequest, idem.CodeKeyRequired, "this request needs an Idempotency-Key header", err)
		return
	}
	if err != nil {
		reject(http.StatusBadRequest, idem.CodeKeyInvalid, fmt.Sprintf("the Idempotency-Key must be 1 to %d visible ASCII characters, bare or as a quoted string, in one header", idem.MaxKeyLength), err)
		return
	}
	scope, err := req.Scope()
	if err != nil {
		reject(http.StatusUnauthorized, idem.CodeScopeUnknown, "the request has no principal to scope its Idempotency-Key", err)
		return
	}
	rq.ctx = context.WithValue(rq.ctx, principalKey{}, scope)
	if int64(len(req.Body)) > m.cfg.MaxRequestBody {
		reject(http.StatusRequestEntityTooLarge, idem.CodeBodyTooLarge, fmt.Sprintf("the request body exceeds %d bytes", m.cfg.MaxRequestBody), ErrBodyTooLarge)
		return
	}
	fp, err := m.cfg.fingerprintOf(req.Method, req.Path, req.RawQuery, req.Header, req.Body)
	if m.rejectBody(err, reject) {
		return
	}
	m.guard(w, rq, h, scope, key, fp)
}

// httpHandler is Wrap's Handler: next on a recorder.
type httpHandler struct {
	next http.Handler
	r    *http.Request
	rec  *recorder
}

func (h *httpHandler) Run(ctx context.Context) { h.next.ServeHTTP(h.rec, h.r.WithContext(ctx)) }

func (h *httpHandler) Response() (*Response, bool) {
	return &Response{Status: h.rec.status, Header: h.rec.header, Body: h.rec.body.Bytes()}, h.rec.noStore
}

func (h *httpHandler) Send() { h.rec.send() }
