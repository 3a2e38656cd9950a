package idemclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/backoff"
)

// Defaults for Config.
const (
	MaxAttemptsDefault   = 5
	BackoffMinDefault    = 100 * time.Millisecond
	BackoffMaxDefault    = 10 * time.Second
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
	// BackoffMin is the backoff ceiling after the first failed attempt; it
	// doubles per attempt up to BackoffMax, and the wait is drawn uniformly
	// from [0, ceiling] (full jitter, internal/backoff), so that clients
	// that failed together do not retry together. Defaults to
	// BackoffMinDefault (100ms).
	BackoffMin time.Duration
	// BackoffMax caps the backoff ceiling. Defaults to BackoffMaxDefault
	// (10s).
	BackoffMax time.Duration
	// MaxRetryAfter is the longest Retry-After this client waits for; a
	// longer one ends Do with ErrRetryAfterTooLong. Defaults to
	// MaxRetryAfterDefault (1m).
	MaxRetryAfter time.Duration
	// Retry500 makes Do retry a 500 Internal Server Error too. It is safe
	// with a key, but a 500 is often a deterministic bug that a retry only
	// repeats. Defaults to false.
	Retry500 bool
	// Hook, when set, is called for every Event of a Do call, for tracing,
	// metrics and logs, synchronously; it must be fast and safe for
	// concurrent use. For EventAttemptBegin the context it returns becomes
	// the attempt's (the request sent carries it: a tracer's client span);
	// for other kinds it is ignored. Events never carry the key or a body.
	// Defaults to nil.
	Hook func(ctx context.Context, e Event) context.Context
}

// newConfig fills in the defaults, then validates the result.
func newConfig(c *Config) (Config, error) {
	var cfg Config
	if c != nil {
		cfg = *c
	}
	if cfg.MaxAttempts == 0 {
		cfg.MaxAttempts = MaxAttemptsDefault
	}
	if cfg.BackoffMin == 0 {
		cfg.BackoffMin = BackoffMinDefault
	}
	if cfg.BackoffMax == 0 {
		cfg.BackoffMax = BackoffMaxDefault
	}
	if cfg.MaxRetryAfter == 0 {
		cfg.MaxRetryAfter = MaxRetryAfterDefault
	}
	return cfg, cfg.validate()
}

// validate checks a filled config; the error wraps ErrInvalidConfig and
// names the field.
func (c *Config) validate() error {
	switch {
	case c.MaxAttempts < 1:
		return fmt.Errorf("%w: MaxAttempts %d is not positive", ErrInvalidConfig, c.MaxAttempts)
	case c.BackoffMin < 0:
		return fmt.Errorf("%w: BackoffMin %v is negative", ErrInvalidConfig, c.BackoffMin)
	case c.BackoffMax < c.BackoffMin:
		return fmt.Errorf("%w: BackoffMax %v is below BackoffMin %v", ErrInvalidConfig, c.BackoffMax, c.BackoffMin)
	case c.MaxRetryAfter < 0:
		return fmt.Errorf("%w: MaxRetryAfter %v is negative", ErrInvalidConfig, c.MaxRetryAfter)
	}
	return nil
}

// Client sends requests with one Idempotency-Key across all attempts. It is
// safe for concurrent use.
type Client struct {
	hc      *http.Client
	cfg     Config
	backoff backoff.Policy
}

// New wraps hc (nil means http.DefaultClient). Give hc no Timeout, or one
// per attempt: the request's context bounds the whole call, retries and
// waits included. A nil cfg means all defaults; a bad one is an error
// wrapping ErrInvalidConfig that names the field.
func New(hc *http.Client, cfg *Config) (*Client, error) {
	if hc == nil {
		hc = http.DefaultClient
	}
	c, err := newConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &Client{hc: hc, cfg: c, backoff: backoff.Policy{Min: c.BackoffMin, Max: c.BackoffMax}}, nil
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

	method := methodOrGet(req.Method)
	start := time.Now()
	fail := func(attempts int, last, cause error, reason Reason) error {
		status := 0
		var se *StatusError
		if errors.As(last, &se) {
			status = se.StatusCode
		}
		c.hook(ctx, Event{Kind: EventGaveUp, Method: method, Attempt: attempts, Reason: reason, Status: status, Elapsed: time.Since(start), Err: last, Cause: cause})
		return &Error{Method: method, URL: req.URL.Redacted(), Key: key, Attempts: attempts, Err: last, Cause: cause}
	}
	for attempt := 1; ; attempt++ {
		actx := idem.CallHook(c.cfg.Hook, ctx, Event{Kind: EventAttemptBegin, Method: method, Attempt: attempt})
		areq, err := c.attemptRequest(actx, req, key, attempt)
		if err != nil {
			return nil, fail(attempt-1, err, nil, ReasonDefinitive)
		}
		sent := time.Now()
		resp, err := c.hc.Do(areq)
		ev := Event{Kind: EventAttempt, Method: method, Attempt: attempt}
		var retryAfter time.Duration
		var reason Reason
		if err == nil {
			ev.Status = resp.StatusCode
			if resp.StatusCode < 400 {
				replayed := resp.Header.Get(idem.HeaderReplayed) == "true"
				ev.Elapsed, ev.Replayed = time.Since(sent), replayed
				c.hook(actx, ev)
				if replayed {
					c.hook(ctx, Event{Kind: EventReplayed, Method: method, Attempt: attempt, Status: resp.StatusCode, Replayed: true, Elapsed: time.Since(start)})
				}
				return &Response{Response: resp, Replayed: replayed, Attempts: attempt}, nil
			}
			se := readStatusError(resp)
			retryAfter = se.RetryAfter
			err = se
			reason = classify(se, c.cfg.Retry500)
		} else if IsRetryable(err) {
			reason = ReasonTransport
		} else {
			reason = ReasonDefinitive
		}
		ev.Reason, ev.Err, ev.Elapsed = reason, err, time.Since(sent)
		c.hook(actx, ev)
		switch {
		case ev.Status != 0 && reason == ReasonDefinitive:
			return nil, fail(attempt, err, nil, reason)
		case ev.Status == 0 && ctx.Err() != nil:
			// The transport error is the context ending mid-attempt.
			return nil, fail(attempt, err, context.Cause(ctx), reason)
		case reason == ReasonDefinitive:
			return nil, fail(attempt, err, nil, reason)
		case attempt >= c.cfg.MaxAttempts:
			return nil, fail(attempt, err, ErrAttemptsExhausted, reason)
		case retryAfter > c.cfg.MaxRetryAfter:
			return nil, fail(attempt, err, ErrRetryAfterTooLong, reason)
		}
		wait := max(c.backoff.Delay(attempt), retryAfter)
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
			// Sleeping past the deadline only to fail then would hold the
			// caller for nothing.
			return nil, fail(attempt, err, context.DeadlineExceeded, reason)
		}
		c.hook(ctx, Event{Kind: EventRetry, Method: method, Attempt: attempt, Reason: reason, Status: ev.Status, Wait: wait, Err: err})
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fail(attempt, err, context.Cause(ctx), reason)
		case <-t.C:
		}
	}
}

func (c *Client) hook(ctx context.Context, e Event) { idem.CallHook(c.cfg.Hook, ctx, e) }

// classify tells why a failed status is retried, or that it is not.
func classify(se *StatusError, retry500 bool) Reason {
	switch {
	case se.StatusCode == http.StatusConflict && se.Code == idem.CodeKeyInProgress:
		return ReasonInProgress
	case retryableStatus(se.StatusCode, se.Code), retry500 && se.StatusCode == http.StatusInternalServerError:
		return ReasonStatus
	}
	return ReasonDefinitive
}

// checkRequest settles the key (the argument, else the request's header)
// and refuses what must not be sent: an unsafe method without a key, an
// invalid key, a body that a retry could not replay.
func checkRequest(req *http.Request, key *string) error {
	if hk := req.Header.Get(idem.HeaderKey); *key == "" {
		*key = hk
	} else if hk != "" && hk != *key {
		return fmt.Errorf("%w: argument %q differs from the request header %q", ErrKeyInvalid, *key, hk)
	}
	if *key == "" {
		if !safeMethod(req.Method) {
			return fmt.Errorf("%w: %s %s", ErrKeyRequired, methodOrGet(req.Method), req.URL.Redacted())
		}
	} else if err := idem.ValidateKey(*key); err != nil {
		return fmt.Errorf("%w: %s", ErrKeyInvalid, strings.TrimPrefix(err.Error(), idem.ErrKeyInvalid.Error()+": "))
	}
	if req.Body != nil && req.Body != http.NoBody && req.GetBody == nil {
		return fmt.Errorf("%w: %s %s", ErrBodyNotReplayable, methodOrGet(req.Method), req.URL.Redacted())
	}
	return nil
}

// attemptRequest returns the request for one attempt, on the attempt's
// context: a clone of the caller's with the key header set, with the
// caller's body for the first attempt and a fresh one from GetBody for the
// next ones, since the transport consumed and closed the previous body.
func (c *Client) attemptRequest(ctx context.Context, req *http.Request, key string, attempt int) (*http.Request, error) {
	areq := req.Clone(ctx)
	if key != "" {
		areq.Header.Set(idem.HeaderKey, key)
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
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == idem.ProblemContentType {
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
