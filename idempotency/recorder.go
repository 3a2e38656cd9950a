package idempotency

import (
	"bytes"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/idemkit/idem"
)

// recorder buffers the handler's response: it is sent only after the
// outcome is decided (stored, committed or released), so that a client
// never sees a response whose transaction then fails to commit.
type recorder struct {
	w      http.ResponseWriter
	header http.Header
	status int
	body   bytes.Buffer
	// noStore: the handler called DoNotStore.
	noStore bool
}

// DoNotStore tells the middleware not to store the response the handler is
// writing on w (or on a writer wrapping it with an Unwrap method): the
// response is delivered once, unreplayed, and the key is released as after
// a 5xx, so a retry runs the handler again. It is for a request refused
// before the handler acted, such as a validation failure: nothing happened
// that a retry must not repeat, so there is nothing to replay (Stripe's
// rule), and storing such a 4xx would let a client fill the store with
// whatever its refused requests echo. In ModeTransactional nothing of the
// request remains (the claim rolls back), so the client may also correct
// the body and resend it under the same key; in ModeTwoStep the released
// claim keeps its fingerprint, and another body under that key is still
// IDEMPOTENCY_KEY_REUSED. It reports whether the middleware's writer was
// found; outside the middleware it does nothing.
func DoNotStore(w http.ResponseWriter) bool {
	for {
		switch x := w.(type) {
		case *recorder:
			x.noStore = true
			return true
		case interface{ Unwrap() http.ResponseWriter }:
			w = x.Unwrap()
		default:
			return false
		}
	}
}

func newRecorder(w http.ResponseWriter) *recorder {
	return &recorder{w: w, header: make(http.Header)}
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.status != 0 || status < 200 {
		return // first final status wins; 1xx are not buffered
	}
	r.status = status
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(b)
}

// Flush is a no-op: the response is buffered until the outcome is known.
// It exists so that http.ResponseController stops here instead of
// flushing the underlying writer through Unwrap.
func (r *recorder) Flush() {}

// FlushError is Flush for http.ResponseController.
func (r *recorder) FlushError() error { return nil }

// Unwrap returns the underlying ResponseWriter, for
// http.ResponseController (deadlines and the like).
func (r *recorder) Unwrap() http.ResponseWriter { return r.w }

func (r *recorder) statusCode() int {
	if r.status == 0 {
		return http.StatusOK
	}
	return r.status
}

// send writes the buffered response to the client.
func (r *recorder) send() {
	h := r.w.Header()
	for k, v := range r.header {
		h[k] = v
	}
	r.w.WriteHeader(r.statusCode())
	_, _ = r.w.Write(r.body.Bytes())
}

// writeResponse replays a stored response.
func writeResponse(w http.ResponseWriter, resp *Response, replayed bool) {
	h := w.Header()
	for k, v := range resp.Header {
		if http.CanonicalHeaderKey(k) == "Set-Cookie" {
			continue
		}
		h[k] = append([]string(nil), v...)
	}
	if replayed {
		h.Set(idem.HeaderReplayed, "true")
	}
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}

// replayHeadersOf keeps the allow-listed headers of h, never Set-Cookie,
// and of their values only text a store can keep as it is: valid UTF-8
// without NUL. PostgreSQL refuses a NUL in jsonb (the whole completion
// would fail) and JSON turns invalid UTF-8 into U+FFFD (the replay would
// carry a value the handler never sent); such a value is left out.
func (c *config) replayHeadersOf(h http.Header) http.Header {
	out := http.Header{}
	for k, v := range h {
		ck := http.CanonicalHeaderKey(k)
		if ck == "Set-Cookie" || !c.replayHeaders[ck] {
			continue
		}
		var keep []string
		for _, s := range v {
			if utf8.ValidString(s) && !strings.Contains(s, "\x00") {
				keep = append(keep, s)
			}
		}
		if keep != nil {
			out[ck] = keep
		}
	}
	return out
}
