package idempotency

import (
	"bytes"
	"net/http"
)

// recorder buffers the handler's response: it is sent only after the
// outcome is decided (stored, committed or released), so that a client
// never sees a response whose transaction then fails to commit.
type recorder struct {
	w      http.ResponseWriter
	header http.Header
	status int
	body   bytes.Buffer
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
		h.Set(ReplayedHeader, "true")
	}
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}
