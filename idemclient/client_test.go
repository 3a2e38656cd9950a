package idemclient_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemclient"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// attempt is what the test server saw of one request.
type attempt struct {
	method, key, body string
	at                time.Time
}

// script is a test server that answers the n-th request with reply[n]
// (the last one repeats) and records every request.
type script struct {
	t     *testing.T
	srv   *httptest.Server
	mu    sync.Mutex
	seen  []attempt
	reply []func(w http.ResponseWriter, r *http.Request)
}

func newScript(t *testing.T, reply ...func(w http.ResponseWriter, r *http.Request)) *script {
	t.Helper()
	s := &script{t: t, reply: reply}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		n := len(s.seen)
		s.seen = append(s.seen, attempt{r.Method, r.Header.Get("Idempotency-Key"), string(body), time.Now()})
		s.mu.Unlock()
		s.reply[min(n, len(s.reply)-1)](w, r)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *script) attempts() []attempt {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]attempt(nil), s.seen...)
}

func status(code int) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(code) }
}

func problem(code int, problemCode string, retryAfter string) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/problem+json")
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		w.WriteHeader(code)
		io.WriteString(w, `{"type":"about:blank","title":"conflict","status":409,"code":"`+problemCode+`","detail":"d-`+problemCode+`"}`)
	}
}

func created(w http.ResponseWriter, r *http.Request) {
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, `{"charge_id":"ch-1"}`)
}

// drop reads the request and closes the connection without a response.
func drop(w http.ResponseWriter, r *http.Request) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(err)
	}
	conn.Close()
}

// fastConfig keeps retry waits in the microseconds so that tests are quick.
func fastConfig() *idemclient.Config {
	return &idemclient.Config{MaxAttempts: 5, BackoffMin: time.Microsecond, BackoffMax: 10 * time.Microsecond}
}

func newClient(t *testing.T, cfg *idemclient.Config) *idemclient.Client {
	t.Helper()
	c, err := idemclient.New(&http.Client{Transport: &http.Transport{}}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

func post(t *testing.T, ctx context.Context, url, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func TestSameKeyAndBodyOnEveryAttempt(t *testing.T) {
	t.Parallel()
	s := newScript(t, status(503), problem(409, idem.CodeKeyInProgress, ""), status(502), created)
	c := newClient(t, fastConfig())

	resp, err := c.Do(post(t, t.Context(), s.srv.URL, `{"amount_kopecks":100}`), "o-1:charge:r-1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got := s.attempts()
	if resp.StatusCode != 201 || resp.Attempts != 4 || len(got) != 4 {
		t.Fatalf("status %d, Attempts %d, server saw %d; want 201, 4, 4", resp.StatusCode, resp.Attempts, len(got))
	}
	for i, a := range got {
		if a.key != "o-1:charge:r-1" || a.body != `{"amount_kopecks":100}` || a.method != "POST" {
			t.Errorf("attempt %d: %+v, want the same key and body every time", i+1, a)
		}
	}
}

func TestRetryRules(t *testing.T) {
	t.Parallel()
	testCases := []struct {
		name         string
		first        func(http.ResponseWriter, *http.Request)
		retry500     bool
		wantAttempts int // 2: retried then 201; 1: definitive
		wantStatus   int
		wantCode     string
	}{
		{"409 in progress", problem(409, idem.CodeKeyInProgress, ""), false, 2, 0, ""},
		{"409 reused is definitive", problem(409, idem.CodeKeyReused, ""), false, 1, 409, idem.CodeKeyReused},
		{"409 without problem code", status(409), false, 1, 409, ""},
		{"409 in-progress code but not problem+json", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(409)
			io.WriteString(w, `{"code":"IDEMPOTENCY_KEY_IN_PROGRESS"}`)
		}, false, 1, 409, ""},
		{"422 reused", problem(422, idem.CodeKeyReused, ""), false, 1, 422, idem.CodeKeyReused},
		{"429", status(429), false, 2, 0, ""},
		{"502", status(502), false, 2, 0, ""},
		{"503", status(503), false, 2, 0, ""},
		{"504", status(504), false, 2, 0, ""},
		{"500 by default", status(500), false, 1, 500, ""},
		{"500 with Retry500", status(500), true, 2, 0, ""},
		{"400", problem(400, "IDEMPOTENCY_KEY_INVALID", ""), false, 1, 400, "IDEMPOTENCY_KEY_INVALID"},
		{"401", status(401), false, 1, 401, ""},
		{"404", status(404), false, 1, 404, ""},
		{"transport error", drop, false, 2, 0, ""},
	}
	for _, tt := range testCases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newScript(t, tt.first, created)
			cfg := fastConfig()
			cfg.Retry500 = tt.retry500
			c := newClient(t, cfg)
			resp, err := c.Do(post(t, t.Context(), s.srv.URL, "{}"), "k-1")
			if n := len(s.attempts()); n != tt.wantAttempts {
				t.Fatalf("server saw %d attempts, want %d (err %v)", n, tt.wantAttempts, err)
			}
			if tt.wantStatus == 0 {
				if err != nil {
					t.Fatalf("err = %v, want success after a retry", err)
				}
				resp.Body.Close()
				if resp.Attempts != 2 {
					t.Errorf("Attempts = %d, want 2", resp.Attempts)
				}
				return
			}
			var se *idemclient.StatusError
			var ie *idemclient.Error
			if !errors.As(err, &se) || !errors.As(err, &ie) {
				t.Fatalf("err = %#v, want *Error wrapping *StatusError", err)
			}
			if se.StatusCode != tt.wantStatus || se.Code != tt.wantCode || ie.Attempts != 1 || ie.Cause != nil || ie.Key != "k-1" {
				t.Errorf("got status %d code %q attempts %d cause %v; want %d %q 1 <nil>", se.StatusCode, se.Code, ie.Attempts, ie.Cause, tt.wantStatus, tt.wantCode)
			}
			if tt.wantStatus != 500 && idemclient.IsRetryable(err) {
				t.Errorf("IsRetryable(%v) = true for a definitive answer", err)
			}
		})
	}
}

func TestRetryAfterIsHonoured(t *testing.T) {
	t.Parallel()
	s := newScript(t, problem(409, idem.CodeKeyInProgress, "1"), created)
	var waits []time.Duration
	cfg := fastConfig()
	cfg.Hook = func(ctx context.Context, e idemclient.Event) context.Context {
		if e.Kind == idemclient.EventRetry {
			waits = append(waits, e.Wait)
		}
		return ctx
	}
	c := newClient(t, cfg)

	resp, err := c.Do(post(t, t.Context(), s.srv.URL, "{}"), "k")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	got := s.attempts()
	if len(got) != 2 || len(waits) != 1 {
		t.Fatalf("attempts %d, waits %v; want 2 and one wait", len(got), waits)
	}
	// Lower bounds only: time cannot run faster than the wait, so these
	// never flake, and both fail if Retry-After is ignored (the backoff
	// alone is ≤10µs).
	if waits[0] < time.Second {
		t.Errorf("waited %v, want ≥ Retry-After 1s", waits[0])
	}
	if gap := got[1].at.Sub(got[0].at); gap < time.Second {
		t.Errorf("server saw the retry %v after the first attempt, want ≥ 1s", gap)
	}
}

func TestRetryAfterBeyondLimitStops(t *testing.T) {
	t.Parallel()
	s := newScript(t, problem(409, idem.CodeKeyInProgress, "3600"), created)
	cfg := fastConfig()
	cfg.MaxRetryAfter = time.Second
	c := newClient(t, cfg)
	_, err := c.Do(post(t, t.Context(), s.srv.URL, "{}"), "k")
	if !errors.Is(err, idemclient.ErrRetryAfterTooLong) || len(s.attempts()) != 1 {
		t.Fatalf("err = %v after %d attempts, want ErrRetryAfterTooLong after 1", err, len(s.attempts()))
	}
	if !idemclient.IsRetryable(err) {
		t.Errorf("IsRetryable = false; an in-progress conflict is worth a later retry")
	}
}

func TestContextDeadlineStopsRetries(t *testing.T) {
	t.Parallel()
	t.Run("deadline during backoff", func(t *testing.T) {
		t.Parallel()
		s := newScript(t, status(503))
		c := newClient(t, &idemclient.Config{MaxAttempts: 1_000_000, BackoffMin: time.Millisecond, BackoffMax: 5 * time.Millisecond})
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		defer cancel()
		_, err := c.Do(post(t, ctx, s.srv.URL, "{}"), "k")
		var ie *idemclient.Error
		if !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &ie) {
			t.Fatalf("err = %v, want *Error with context.DeadlineExceeded", err)
		}
		// The deadline may cut the last attempt before the server records
		// it, so the server may have seen one fewer.
		if n := len(s.attempts()); (ie.Attempts != n && ie.Attempts != n+1) || ie.Attempts >= 1_000_000 || n < 1 {
			t.Errorf("Attempts %d, server saw %d; want equal (or one more), ≥1 and far below MaxAttempts", ie.Attempts, n)
		}
		if !idemclient.IsRetryable(err) {
			t.Errorf("IsRetryable = false; an unknown outcome is retryable later")
		}
	})
	t.Run("Retry-After past the deadline is not waited for", func(t *testing.T) {
		t.Parallel()
		s := newScript(t, problem(409, idem.CodeKeyInProgress, "30"), created)
		c := newClient(t, fastConfig())
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		_, err := c.Do(post(t, ctx, s.srv.URL, "{}"), "k")
		if !errors.Is(err, context.DeadlineExceeded) || len(s.attempts()) != 1 || ctx.Err() != nil {
			t.Fatalf("err = %v, %d attempts, ctx err %v; want DeadlineExceeded at once after 1 attempt", err, len(s.attempts()), ctx.Err())
		}
	})
	t.Run("cancel during wait", func(t *testing.T) {
		t.Parallel()
		s := newScript(t, status(503))
		ctx, cancel := context.WithCancel(t.Context())
		c := newClient(t, &idemclient.Config{MaxAttempts: 10, BackoffMin: time.Hour, BackoffMax: time.Hour,
			Hook: func(ctx context.Context, e idemclient.Event) context.Context {
				if e.Kind == idemclient.EventRetry {
					cancel()
				}
				return ctx
			}})
		_, err := c.Do(post(t, ctx, s.srv.URL, "{}"), "k")
		if !errors.Is(err, context.Canceled) || len(s.attempts()) != 1 {
			t.Fatalf("err = %v after %d attempts, want context.Canceled after 1", err, len(s.attempts()))
		}
	})
}

func TestAttemptsExhausted(t *testing.T) {
	t.Parallel()
	s := newScript(t, status(503))
	c := newClient(t, fastConfig())
	_, err := c.Do(post(t, t.Context(), s.srv.URL, "{}"), "k")
	var se *idemclient.StatusError
	if !errors.Is(err, idemclient.ErrAttemptsExhausted) || !errors.As(err, &se) || se.StatusCode != 503 {
		t.Fatalf("err = %v, want ErrAttemptsExhausted with the last 503", err)
	}
	if n := len(s.attempts()); n != 5 {
		t.Errorf("server saw %d attempts, want MaxAttempts 5", n)
	}
	if !idemclient.IsRetryable(err) {
		t.Error("IsRetryable = false for exhausted 503s")
	}
}

func TestUnsafeMethodWithoutKeyIsNeverSent(t *testing.T) {
	t.Parallel()
	s := newScript(t, status(503))
	c := newClient(t, fastConfig())
	for _, m := range []string{"POST", "PUT", "PATCH", "DELETE", "CHARGE"} {
		req, _ := http.NewRequestWithContext(t.Context(), m, s.srv.URL, strings.NewReader("{}"))
		_, err := c.Do(req, "")
		if !errors.Is(err, idemclient.ErrKeyRequired) || idemclient.IsRetryable(err) {
			t.Errorf("%s without key: err = %v, want non-retryable ErrKeyRequired", m, err)
		}
	}
	if n := len(s.attempts()); n != 0 {
		t.Fatalf("server saw %d requests, want none", n)
	}
	// A safe method needs no key and is retried.
	req, _ := http.NewRequestWithContext(t.Context(), "GET", s.srv.URL, nil)
	_, err := c.Do(req, "")
	if !errors.Is(err, idemclient.ErrAttemptsExhausted) || len(s.attempts()) != 5 {
		t.Fatalf("GET: err = %v, %d attempts, want 5 attempts", err, len(s.attempts()))
	}
	if s.attempts()[0].key != "" {
		t.Error("GET without a key was sent with one")
	}
}

func TestKeyFromHeaderAndConflicts(t *testing.T) {
	t.Parallel()
	s := newScript(t, created)
	c := newClient(t, fastConfig())

	req := post(t, t.Context(), s.srv.URL, "{}")
	req.Header.Set("Idempotency-Key", "from-header")
	resp, err := c.Do(req, "")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := s.attempts()[0].key; got != "from-header" {
		t.Errorf("key sent %q, want the header's", got)
	}

	req = post(t, t.Context(), s.srv.URL, "{}")
	req.Header.Set("Idempotency-Key", "a")
	if _, err := c.Do(req, "b"); !errors.Is(err, idemclient.ErrKeyInvalid) {
		t.Errorf("conflicting keys: err = %v, want ErrKeyInvalid", err)
	}
	for _, bad := range []string{"has space", strings.Repeat("x", 256), "ключ", "tab\t"} {
		if _, err := c.Do(post(t, t.Context(), s.srv.URL, "{}"), bad); !errors.Is(err, idemclient.ErrKeyInvalid) {
			t.Errorf("key %q: err = %v, want ErrKeyInvalid", bad, err)
		}
	}
	if n := len(s.attempts()); n != 1 {
		t.Errorf("server saw %d requests, want only the valid one", n)
	}
}

func TestBodyWithoutGetBodyIsRefused(t *testing.T) {
	t.Parallel()
	s := newScript(t, created)
	c := newClient(t, fastConfig())
	req := post(t, t.Context(), s.srv.URL, "")
	body := &closeTracker{Reader: bytes.NewReader([]byte("{}"))} // hides the type from NewRequest
	req.Body = body
	req.GetBody = nil
	_, err := c.Do(req, "k")
	if !errors.Is(err, idemclient.ErrBodyNotReplayable) || idemclient.IsRetryable(err) {
		t.Fatalf("err = %v, want non-retryable ErrBodyNotReplayable", err)
	}
	if !body.closed {
		t.Error("the refused request's body was not closed (http.Client.Do closes it even on errors)")
	}
	if n := len(s.attempts()); n != 0 {
		t.Fatalf("server saw %d requests, want none", n)
	}

	// GetBody failing on a later attempt stops the call.
	s = newScript(t, status(503), created)
	req = post(t, t.Context(), s.srv.URL, "{}")
	req.GetBody = func() (io.ReadCloser, error) { return nil, errors.New("gone") }
	_, err = c.Do(req, "k")
	if !errors.Is(err, idemclient.ErrBodyNotReplayable) || len(s.attempts()) != 1 {
		t.Fatalf("err = %v after %d attempts, want ErrBodyNotReplayable after 1", err, len(s.attempts()))
	}
}

type closeTracker struct {
	io.Reader
	closed bool
}

func (c *closeTracker) Close() error { c.closed = true; return nil }

func TestReplayedIsReported(t *testing.T) {
	t.Parallel()
	s := newScript(t, created, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Idempotent-Replayed", "true")
		created(w, r)
	})
	c := newClient(t, fastConfig())
	for i, want := range []bool{false, true} {
		resp, err := c.Do(post(t, t.Context(), s.srv.URL, "{}"), "k")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.Replayed != want {
			t.Errorf("call %d: Replayed = %v, want %v", i+1, resp.Replayed, want)
		}
	}
}

func TestStatusErrorCarriesProblem(t *testing.T) {
	t.Parallel()
	s := newScript(t, problem(409, idem.CodeKeyReused, ""))
	c := newClient(t, fastConfig())
	_, err := c.Do(post(t, t.Context(), s.srv.URL, "{}"), "k")
	var se *idemclient.StatusError
	if !errors.As(err, &se) {
		t.Fatalf("err = %v", err)
	}
	if se.Code != idem.CodeKeyReused || se.Detail != "d-"+idem.CodeKeyReused || !bytes.Contains(se.Body, []byte(`"code"`)) {
		t.Errorf("StatusError = %+v", se)
	}
	for _, want := range []string{"POST", "409", idem.CodeKeyReused, `"k"`, "1 attempt"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

// TestTransportResendsKeyedPostOnDeadKeepAliveConn pins down the net/http
// behaviour the package doc describes: a POST carrying an Idempotency-Key
// is resent by the Transport itself, below idemclient, when a reused
// connection dies before the response; the same POST without the header
// is not.
func TestTransportResendsKeyedPostOnDeadKeepAliveConn(t *testing.T) {
	t.Parallel()
	for _, keyed := range []bool{true, false} {
		// Request 1 warms a keep-alive connection; request 2 is dropped
		// after the server has read it; request 3 answers.
		s := newScript(t, created, drop, created)
		tr := &http.Transport{}
		defer tr.CloseIdleConnections()
		hc := &http.Client{Transport: tr}
		for i := range 2 {
			req := post(t, t.Context(), s.srv.URL, "{}")
			if keyed {
				req.Header.Set("Idempotency-Key", "k")
			}
			resp, err := hc.Do(req)
			if i == 0 {
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				continue
			}
			if keyed {
				if err != nil {
					t.Fatalf("keyed POST: %v, want the Transport's silent resend to succeed", err)
				}
				resp.Body.Close()
				if n := len(s.attempts()); n != 3 {
					t.Fatalf("server saw %d requests, want 3 (one resent by net/http)", n)
				}
			} else if err == nil {
				resp.Body.Close()
				t.Fatalf("POST without key succeeded; net/http must not resend it")
			} else if n := len(s.attempts()); n != 2 {
				t.Fatalf("server saw %d requests, want 2", n)
			}
		}
	}
}

func TestNewValidatesConfig(t *testing.T) {
	t.Parallel()
	testCases := []struct {
		cfg  idemclient.Config
		want string
	}{
		{idemclient.Config{MaxAttempts: -1}, "MaxAttempts"},
		{idemclient.Config{BackoffMin: -1}, "BackoffMin"},
		{idemclient.Config{BackoffMin: time.Second, BackoffMax: time.Millisecond}, "BackoffMax"},
		{idemclient.Config{MaxRetryAfter: -1}, "MaxRetryAfter"},
	}
	for _, tt := range testCases {
		if _, err := idemclient.New(nil, &tt.cfg); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("New(%+v) = %v, want an error naming %s", tt.cfg, err, tt.want)
		}
	}
	if _, err := idemclient.New(nil, nil); err != nil {
		t.Errorf("New(nil, nil) = %v", err)
	}
}

func TestIsRetryable(t *testing.T) {
	t.Parallel()
	testCases := []struct {
		err  error
		want bool
	}{
		{nil, false},
		{errors.New("other"), false},
		{idemclient.ErrKeyRequired, false},
		{context.DeadlineExceeded, true},
		{context.Canceled, true},
		{&idemclient.StatusError{StatusCode: 409, Code: idem.CodeKeyInProgress}, true},
		{&idemclient.StatusError{StatusCode: 409, Code: idem.CodeKeyReused}, false},
		{&idemclient.StatusError{StatusCode: 409}, false},
		{&idemclient.StatusError{StatusCode: 429}, true},
		{&idemclient.StatusError{StatusCode: 500}, true},
		{&idemclient.StatusError{StatusCode: 501}, false},
		{&idemclient.StatusError{StatusCode: 503}, true},
		{&idemclient.StatusError{StatusCode: 400}, false},
		{&idemclient.Error{Err: &idemclient.StatusError{StatusCode: 422}}, false},
		{&idemclient.Error{Err: &idemclient.StatusError{StatusCode: 504}, Cause: idemclient.ErrAttemptsExhausted}, true},
	}
	for _, tt := range testCases {
		if got := idemclient.IsRetryable(tt.err); got != tt.want {
			t.Errorf("IsRetryable(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}

// TestHook: the hook sees every attempt from its begin to its end, the
// retries between them with their reason and wait, and how the call
// ended; the context it returns for an attempt's begin is the attempt's
// request context (where a tracer's span goes), and no event carries the
// key.
func TestHook(t *testing.T) {
	t.Parallel()
	type attemptKey struct{}
	replayed := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Idempotent-Replayed", "true")
		created(w, r)
	}
	s := newScript(t, status(503), problem(409, idem.CodeKeyInProgress, ""), replayed, problem(409, idem.CodeKeyReused, ""))
	var (
		mu     sync.Mutex
		events []idemclient.Event
		seen   []any // the attempt context's value, as the transport saw it
	)
	cfg := fastConfig()
	cfg.Hook = func(ctx context.Context, e idemclient.Event) context.Context {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
		if e.Kind == idemclient.EventAttemptBegin {
			return context.WithValue(ctx, attemptKey{}, e.Attempt)
		}
		return ctx
	}
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: roundTripper(func(r *http.Request) (*http.Response, error) {
		mu.Lock()
		seen = append(seen, r.Context().Value(attemptKey{}))
		mu.Unlock()
		return tr.RoundTrip(r)
	})}
	c, err := idemclient.New(hc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	const key = "secret-command-key"
	resp, err := c.Do(post(t, t.Context(), s.srv.URL, "{}"), key)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if _, err := c.Do(post(t, t.Context(), s.srv.URL, "{}"), key); err == nil {
		t.Fatal("the reused key succeeded")
	}
	type brief struct {
		kind    idemclient.EventKind
		attempt int
		status  int
		reason  idemclient.Reason
		replay  bool
	}
	var got []brief
	for _, e := range events {
		got = append(got, brief{e.Kind, e.Attempt, e.Status, e.Reason, e.Replayed})
		if strings.Contains(fmt.Sprintf("%+v", e), key) {
			t.Errorf("event %+v carries the key", e)
		}
		if e.Kind == idemclient.EventRetry && e.Wait < 0 {
			t.Errorf("retry with a negative wait: %+v", e)
		}
		if e.Kind == idemclient.EventGaveUp && (e.Err == nil || e.Cause != nil) {
			t.Errorf("gave up on a definitive 409 with Err %v, Cause %v; want the StatusError and no cause", e.Err, e.Cause)
		}
	}
	want := []brief{
		{idemclient.EventAttemptBegin, 1, 0, "", false}, {idemclient.EventAttempt, 1, 503, idemclient.ReasonStatus, false}, {idemclient.EventRetry, 1, 503, idemclient.ReasonStatus, false},
		{idemclient.EventAttemptBegin, 2, 0, "", false}, {idemclient.EventAttempt, 2, 409, idemclient.ReasonInProgress, false}, {idemclient.EventRetry, 2, 409, idemclient.ReasonInProgress, false},
		{idemclient.EventAttemptBegin, 3, 0, "", false}, {idemclient.EventAttempt, 3, 201, "", true}, {idemclient.EventReplayed, 3, 201, "", true},
		{idemclient.EventAttemptBegin, 1, 0, "", false}, {idemclient.EventAttempt, 1, 409, idemclient.ReasonDefinitive, false}, {idemclient.EventGaveUp, 1, 409, idemclient.ReasonDefinitive, false},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("events\n got %v\nwant %v", got, want)
	}
	if fmt.Sprint(seen) != "[1 2 3 1]" {
		t.Fatalf("attempt contexts the transport saw: %v, want [1 2 3 1]", seen)
	}
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
