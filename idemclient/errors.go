package idemclient

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/idemkit/idem"
)

// sentinel is an error of this package that is also one of package idem's,
// for errors.Is with either.
type sentinel struct {
	msg  string
	base error
}

func (e *sentinel) Error() string { return e.msg }
func (e *sentinel) Unwrap() error { return e.base }

// ErrInvalidConfig is wrapped by every error of New about its Config; the
// message names the field.
var ErrInvalidConfig = errors.New("idemclient: invalid config")

// Errors returned before anything is sent. None of them is retryable: the
// request as given can never be sent safely.
var (
	// ErrKeyRequired: an unsafe method (anything but GET, HEAD, OPTIONS,
	// TRACE) without an Idempotency-Key. Retrying such a request after a
	// timeout may charge twice (the first may have arrived), and sending it
	// once without a retry would silently give up the guarantee, so it is
	// not sent at all. It is also idem.ErrKeyRequired.
	ErrKeyRequired error = &sentinel{"idemclient: unsafe method without an Idempotency-Key", idem.ErrKeyRequired}
	// ErrKeyInvalid: the key breaks idem's key rule (idem.ValidateKey:
	// empty, longer than idem.MaxKeyLength, anything but visible ASCII) or
	// differs from the request's own Idempotency-Key header. It is also
	// idem.ErrKeyInvalid.
	ErrKeyInvalid error = &sentinel{"idemclient: invalid Idempotency-Key", idem.ErrKeyInvalid}
	// ErrBodyNotReplayable: the request has a body but no GetBody, so a
	// second attempt could not send the same bytes. http.NewRequest sets
	// GetBody for *bytes.Buffer, *bytes.Reader and *strings.Reader bodies.
	ErrBodyNotReplayable = errors.New("idemclient: request body cannot be replayed (no GetBody)")
)

// Reasons Do stopped retrying, carried by Error.Cause. A context error
// (context.Canceled, context.DeadlineExceeded) is the third reason.
var (
	// ErrAttemptsExhausted: Config.MaxAttempts attempts all failed with a
	// retryable error.
	ErrAttemptsExhausted = errors.New("idemclient: attempts exhausted")
	// ErrRetryAfterTooLong: the server asked to wait (Retry-After) longer
	// than Config.MaxRetryAfter.
	ErrRetryAfterTooLong = errors.New("idemclient: Retry-After longer than MaxRetryAfter")
)

// Error is returned by Do once at least one attempt has been sent. Err is
// the last attempt's failure: a *StatusError or a transport error. Cause is
// why Do stopped: nil when Err is definitive (a 4xx other than in-progress
// or 429, for example), else ErrAttemptsExhausted, ErrRetryAfterTooLong or
// a context error. errors.Is and errors.As see both.
type Error struct {
	Method   string
	URL      string
	Key      string // the Idempotency-Key sent on every attempt, "" for a safe method without one
	Attempts int    // attempts sent by this client (net/http may resend within one; see the package doc)
	Err      error
	Cause    error
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "idemclient: %s %s", e.Method, e.URL)
	if e.Key != "" {
		fmt.Fprintf(&b, " (Idempotency-Key %q)", e.Key)
	}
	fmt.Fprintf(&b, ": %d attempt", e.Attempts)
	if e.Attempts != 1 {
		b.WriteByte('s')
	}
	if e.Cause != nil {
		fmt.Fprintf(&b, ", stopped: %v", strings.TrimPrefix(e.Cause.Error(), "idemclient: "))
	}
	fmt.Fprintf(&b, ": %v", e.Err)
	return b.String()
}

// Unwrap returns the last failure and the reason for stopping.
func (e *Error) Unwrap() []error {
	if e.Cause == nil {
		return []error{e.Err}
	}
	return []error{e.Err, e.Cause}
}

// StatusError is a response whose status is not 2xx or 3xx. For an
// application/problem+json body, Code is its "code" member (for example
// IDEMPOTENCY_KEY_REUSED) and Detail its "detail" or else "title".
type StatusError struct {
	StatusCode int
	Code       string
	Detail     string
	// Body is the start of the response body (at most 64 KiB).
	Body []byte
	// RetryAfter is the parsed Retry-After header, 0 when absent.
	RetryAfter time.Duration
}

func (e *StatusError) Error() string {
	s := fmt.Sprintf("status %d %s", e.StatusCode, http.StatusText(e.StatusCode))
	if e.Code != "" {
		s += " " + e.Code
	}
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// retryableStatus reports whether a response is worth another attempt
// with the same key. 500 is decided by the caller (Config.Retry500).
func retryableStatus(status int, code string) bool {
	switch status {
	case http.StatusConflict:
		// Only the in-progress conflict (idem.CodeKeyInProgress: the first
		// attempt still runs): a reused key (idem.CodeKeyReused, a
		// different body under the same key) or any other conflict is the
		// server's final word.
		return code == idem.CodeKeyInProgress
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// IsRetryable reports whether the same call, with the same Idempotency-Key,
// may succeed if made again later: a transport error, a context error (the
// outcome is unknown, the operation may or may not have happened), a 409
// IDEMPOTENCY_KEY_IN_PROGRESS, 429, 500, 502, 503 or 504. It is false for
// nil, for the errors returned before sending (ErrKeyRequired, ...), for
// every other status (a 409 IDEMPOTENCY_KEY_REUSED, a 400, a 422 are the
// server's final word) and for TLS certificate failures.
//
// A retryable error from Do means Do gave up (attempts, Retry-After or the
// context): a caller that owns a durable command (an outbox row, an
// uncommitted Kafka message) retries it later with the same key. 500 is
// retryable here even when Config.Retry500 is off, because with a key the
// retry is safe; the option only decides whether Do retries it itself.
func IsRetryable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrKeyRequired) || errors.Is(err, ErrKeyInvalid) || errors.Is(err, ErrBodyNotReplayable) {
		return false
	}
	var se *StatusError
	if errors.As(err, &se) {
		return se.StatusCode == http.StatusInternalServerError || retryableStatus(se.StatusCode, se.Code)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var certErr *tls.CertificateVerificationError
	var unknownAuthority x509.UnknownAuthorityError
	var hostname x509.HostnameError
	if errors.As(err, &certErr) || errors.As(err, &unknownAuthority) || errors.As(err, &hostname) {
		return false
	}
	var ue *url.Error
	var ne net.Error
	return errors.As(err, &ue) || errors.As(err, &ne)
}
