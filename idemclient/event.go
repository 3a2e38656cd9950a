package idemclient

import "time"

// EventKind names an Event.
type EventKind string

// Event kinds, in the order a Do call reports them. Every attempt gets
// EventAttemptBegin and then EventAttempt; between attempts comes
// EventRetry; a call that fails after sending ends with EventGaveUp, one
// that succeeds with its last EventAttempt (and EventReplayed when the
// answer was the server's stored one).
const (
	// EventAttemptBegin: an attempt is about to be sent. The context
	// Config.Hook returns for it becomes the attempt's: the request
	// carries it (a tracer's client span), and so does the attempt's
	// EventAttempt.
	EventAttemptBegin EventKind = "attempt_begin"
	// EventAttempt: an attempt ended, with a response (Status) or a
	// transport error (Err); Elapsed is its duration. A failed one has
	// its Reason.
	EventAttempt EventKind = "attempt"
	// EventRetry: Do waits Wait before the next attempt, because of Reason.
	EventRetry EventKind = "retry"
	// EventReplayed: the call succeeded with a replayed answer
	// (Idempotent-Replayed: true): the operation had been done before.
	EventReplayed EventKind = "replayed"
	// EventGaveUp: Do returns an error after at least one attempt. Err is
	// the last attempt's failure, Cause why it stopped (as in Error),
	// Elapsed the whole call.
	EventGaveUp EventKind = "gave_up"
)

// Reason says why an attempt failed, and whether that is worth a retry.
type Reason string

// Reasons.
const (
	// ReasonTransport: no response (connection refused or reset, timeout):
	// the outcome is unknown, and the key makes finding out safe.
	ReasonTransport Reason = "transport"
	// ReasonInProgress: 409 IDEMPOTENCY_KEY_IN_PROGRESS, the first attempt
	// still runs on the server.
	ReasonInProgress Reason = "in_progress"
	// ReasonStatus: 429, 502, 503, 504 (or 500 with Config.Retry500).
	ReasonStatus Reason = "status"
	// ReasonDefinitive: the server's final word (another 4xx, a 500
	// without Retry500, a TLS failure): not retried.
	ReasonDefinitive Reason = "definitive"
)

// Event is what Config.Hook receives. It never carries the
// Idempotency-Key or a body (a transport error in Err names the URL, as
// net/http's errors do).
type Event struct {
	Kind   EventKind
	Method string
	// Attempt is the attempt the event is about (1-based); for
	// EventGaveUp, how many were sent.
	Attempt int
	// Reason is why the attempt failed (EventAttempt, EventRetry,
	// EventGaveUp).
	Reason Reason
	// Wait is the wait before the next attempt (EventRetry).
	Wait time.Duration
	// Status is the response status (of the last attempt, for
	// EventGaveUp), 0 when there was none.
	Status int
	// Replayed is true when the answer carried Idempotent-Replayed: true
	// (the successful EventAttempt, EventReplayed): a tracer marks the
	// attempt's span with it.
	Replayed bool
	// Elapsed is the attempt's duration (EventAttempt) or the call's
	// (EventReplayed, EventGaveUp).
	Elapsed time.Duration
	// Err is the attempt's failure: a *StatusError or a transport error.
	Err error
	// Cause is why Do stopped (EventGaveUp): nil for a definitive failure,
	// else ErrAttemptsExhausted, ErrRetryAfterTooLong or a context error.
	Cause error
}
