package idemclient

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"mime"
	"net/http"
	"strconv"
	"time"
)

// Header names of the idempotency contract.
const (
	HeaderKey      = "Idempotency-Key"
	HeaderReplayed = "Idempotent-Replayed"
)

// Defaults for Config.
const (
	MaxAttemptsDefault   = 5
	BaseDelayDefault     = 100 * time.Millisecond
	MaxDelayDefault      = 10 * time.Second
	MaxRetryAfterDefault = time.Minute
)

// errorBodyLimit bounds how much of a failed response is kept in a
// StatusError (and drained so the connection can be reused).
const errorBodyLimit = 64 << 10

// Config tunes retries. The zero value and nil mean all defaults.
type Config struct {
	// MaxAttempts caps the attempts of one Do call, the first included.
	// Defaults to MaxAttemptsDefault (5).
	MaxAttempts int
	// BaseDelay is the backoff ceiling before the second attempt; it
	// doubles per attempt up to MaxDelay, and the actual wait is drawn
	// uniformly from [0, ceiling) ("full jitter"), so that clients that
	// failed together do not retry together. Defaults to BaseDelayDefault
	// (100ms).
	BaseDelay time.Duration
	// MaxDelay caps the backoff ceiling. Defaults to MaxDelayDefault (10s).
	MaxDelay time.Duration
	// MaxRetryAfter is the longest Retry-After this client waits for; a
	// longer one ends Do with ErrRetryAfterTooLong. Defaults to
	// MaxRetryAfterDefault (1m).
	MaxRetryAfter time.Duration
	// Retry500 makes Do retry a 500 Internal Server Error too. It is safe
	// with a key, but a 500 is often a deterministic bug that a retry only
	// repeats. Defaults to false.
	Retry500 bool
	// OnRetry, when set, is called before each wait with the attempt that
	// just failed (1-based), its error and the wait. For logs and metrics;
	// it must not block. Defaults to nil.
	OnRetry func(attempt int, err error, wait time.Duration)
}

func (c *Config) withDefaults() Config {
	var cfg Config
	if c != nil {
		cfg = *c
	}
	if cfg.MaxAttempts == 0 {
		cfg.MaxAttempts = MaxAttemptsDefault
	}
	if cfg.BaseDelay == 0 {
		cfg.BaseDelay = BaseDelayDefault
	}
	if cfg.MaxDelay == 0 {
		cfg.MaxDelay = MaxDelayDefault
	}
	if cfg.MaxRetryAfter == 0 {
		cfg.MaxRetryAfter = MaxRetryAfterDefault
	}
	return cfg
}

func (c *Config) validate() error {
	switch {
	case c.MaxAttempts < 1:
		return fmt.Errorf("idemclient: Config.MaxAttempts %d is not positive", c.MaxAttempts)
	case c.BaseDelay < 0:
		return fmt.Errorf("idemclient: Config.BaseDelay %v is negative", c.BaseDelay)
	case c.MaxDelay < c.BaseDelay:
		return fmt.Errorf("idemclient: Config.MaxDelay %v is below BaseDelay %v", c.MaxDelay, c.BaseDelay)
	case c.MaxRetryAfter < 0:
		return fmt.Errorf("idemclient: Config.MaxRetryAfter %v is negative", c.MaxRetryAfter)
	}
	return nil
}

// Client sends requests with one Idempotency-Key across all attempts. It is
// safe for concurrent use.
type Client struct {
	hc  *http.Client
	cfg Config
}

// New wraps hc (nil means http.DefaultClient). Give hc no Timeout, or one
// per attempt: the request's context bounds the whole call, retries and
// waits included. A nil cfg means all defaults.
func New(hc *http.Client, cfg *Config) (*Client, error) {
	if hc == nil {
		hc = http.DefaultClient
	}
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	return &Client{hc: hc, cfg: c}, nil
}

// CloseIdleConnections closes the idle keep-alive connections of the
// wrapped http.Client.
func (c *Client) CloseIdleConnections() { c.hc.CloseIdleConnections() }

// Response is a 2xx or 3xx answer. The caller closes Body.
type Response struct {
	*http.Response
	// Replayed is true when the server answered from its idempotency
	// store (header Idempotent-Replayed: true): the operation had already
	// been done, by an earlier attempt or an earlier call with this key.
	Replayed bool
	// Attempts is how many attempts this call made, the successful one
	// included.
	Attempts int
}

// Do sends req, retrying with the same Idempotency-Key until it gets a
// 2xx/3xx answer, a definitive failure, Config.MaxAttempts failures or the
// end of req's context, which governs every attempt and every wait.
//
// key is set as the Idempotency-Key header of every attempt; "" means the
// request's own header, if any. An unsafe method (anything but GET, HEAD,
// OPTIONS, TRACE) without a key fails with ErrKeyRequired and is not sent.
// A body without GetBody fails with ErrBodyNotReplayable and is not sent.
//
// Retried: transport errors, 409 with problem code
// IDEMPOTENCY_KEY_IN_PROGRESS, 429, 502, 503, 504, and 500 with
// Config.Retry500. A Retry-After header sets the minimum wait. Anything
// else not 2xx/3xx is definitive. After at least one attempt every error is
// an *Error whose Err is a *StatusError or a transport error.
func (c *Client) Do(req *http.Request, key string) (*Response, error) {
	ctx := req.Context()
	if err := checkRequest(req, &key); err != nil {
		// Like http.Client.Do, the body is closed even on errors.
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}

	fail := func(attempts int, last, cause error) error {
		return &Error{Method: methodOrGet(req.Method), URL: req.URL.Redacted(), Key: key, Attempts: attempts, Err: last, Cause: cause}
	}
	for attempt := 1; ; attempt++ {
		areq, err := c.attemptRequest(req, key, attempt)
		if err != nil {
			return nil, fail(attempt-1, err, nil)
		}
		resp, err := c.hc.Do(areq)
		var retryAfter time.Duration
		if err == nil {
			if resp.StatusCode < 400 {
				return &Response{Response: resp, Replayed: resp.Header.Get(HeaderReplayed) == "true", Attempts: attempt}, nil
			}
			se := readStatusError(resp)
			retryAfter = se.RetryAfter
			err = se
			if !(retryableStatus(se.StatusCode, se.Code) || c.cfg.Retry500 && se.StatusCode == http.StatusInternalServerError) {
				return nil, fail(attempt, err, nil)
			}
		} else if ctx.Err() != nil {
			// The transport error is the context ending mid-attempt.
			return nil, fail(attempt, err, context.Cause(ctx))
		} else if !IsRetryable(err) {
			return nil, fail(attempt, err, nil)
		}

		if attempt >= c.cfg.MaxAttempts {
			return nil, fail(attempt, err, ErrAttemptsExhausted)
		}
		if retryAfter > c.cfg.MaxRetryAfter {
			return nil, fail(attempt, err, ErrRetryAfterTooLong)
		}
		wait := max(c.backoff(attempt), retryAfter)
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
			// Sleeping past the deadline only to fail then would hold the
			// caller for nothing.
			return nil, fail(attempt, err, context.DeadlineExceeded)
		}
		if c.cfg.OnRetry != nil {
			c.cfg.OnRetry(attempt, err, wait)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fail(attempt, err, context.Cause(ctx))
		case <-t.C:
		}
	}
}

// checkRequest settles the key (the argument, else the request's header)
// and refuses what must not be sent: an unsafe method without a key, an
// invalid key, a body that a retry could not replay.
func checkRequest(req *http.Request, key *string) error {
	if hk := req.Header.Get(HeaderKey); *key == "" {
		*key = hk
	} else if hk != "" && hk != *key {
		return fmt.Errorf("%w: argument %q differs from the request header %q", ErrKeyInvalid, *key, hk)
	}
	if *key == "" {
		if !safeMethod(req.Method) {
			return fmt.Errorf("%w: %s %s", ErrKeyRequired, methodOrGet(req.Method), req.URL.Redacted())
		}
	} else if err := ValidateKey(*key); err != nil {
		return err
	}
	if req.Body != nil && req.Body != http.NoBody && req.GetBody == nil {
		return fmt.Errorf("%w: %s %s", ErrBodyNotReplayable, methodOrGet(req.Method), req.URL.Redacted())
	}
	return nil
}

// attemptRequest returns the request for one attempt: the caller's for the
// first (with the key header set on a clone), and a clone with a fresh body
// from GetBody for the next ones, since the transport consumed and closed
// the previous body.
func (c *Client) attemptRequest(req *http.Request, key string, attempt int) (*http.Request, error) {
	areq := req.Clone(req.Context())
	if key != "" {
		areq.Header.Set(HeaderKey, key)
	}
	if attempt > 1 && req.GetBody != nil {
		body, err := req.GetBody()
		if err != nil {
			return nil, fmt.Errorf("%w: GetBody: %w", ErrBodyNotReplayable, err)
		}
		areq.Body = body
	}
	return areq, nil
}

// backoff is the full-jitter wait after the failed attempt n (1-based):
// uniform in [0, min(MaxDelay, BaseDelay·2^(n-1))).
func (c *Client) backoff(n int) time.Duration {
	ceiling := c.cfg.BaseDelay
	for i := 1; i < n && ceiling < c.cfg.MaxDelay; i++ {
		ceiling *= 2
	}
	ceiling = min(ceiling, c.cfg.MaxDelay)
	if ceiling <= 0 {
		return 0
	}
	return rand.N(ceiling)
}

func safeMethod(m string) bool {
	switch methodOrGet(m) {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

func methodOrGet(m string) string {
	if m == "" {
		return http.MethodGet
	}
	return m
}

// readStatusError reads (a bounded part of) a failed response and closes
// it. Draining lets net/http reuse the connection.
func readStatusError(resp *http.Response) *StatusError {
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, errorBodyLimit))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, errorBodyLimit))
	se := &StatusError{StatusCode: resp.StatusCode, Body: body, RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After"), time.Now())}
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == "application/problem+json" {
		var p struct {
			Code   string `json:"code"`
			Title  string `json:"title"`
			Detail string `json:"detail"`
		}
		if json.Unmarshal(body, &p) == nil {
			se.Code, se.Detail = p.Code, p.Detail
			if se.Detail == "" {
				se.Detail = p.Title
			}
		}
	}
	return se
}

// parseRetryAfter reads delay-seconds or an HTTP-date (RFC 9110 10.2.3).
// Anything unparsable, or a date in the past, is 0.
func parseRetryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		if s <= 0 {
			return 0
		}
		if s > int64((1<<63-1)/time.Second) {
			return 1<<63 - 1
		}
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := t.Sub(now); d > 0 {
			return d
		}
	}
	return 0
}
