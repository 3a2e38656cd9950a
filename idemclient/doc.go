// Package idemclient makes outgoing HTTP calls that keep one
// Idempotency-Key across every retry: the client half of the protocol whose
// server half is package idempotency. A retry without the key that the
// first attempt carried is a new operation to the server, and so a second
// charge; a retry with it is a question the server answers from its store.
// Header names, the key rule (idem.ValidateKey) and problem codes are
// package idem's.
//
// Usage:
//
//	c, err := idemclient.New(http.DefaultClient, nil)
//	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, body)
//	resp, err := c.Do(req, eventID+":charge") // one key for every attempt
//
// # Guarantee
//
// Every attempt of one Client.Do call carries the same Idempotency-Key, and
// the key is derived from the command (Key), not generated per call, so a
// retry after a process restart carries it too. Against a server that
// honours the key (the idempotency package, paysim, Stripe-style APIs) the
// operation happens at most once however many attempts reach it, and Do
// reports through Response.Replayed when the answer is the stored one.
//
// An unsafe request (POST, PUT, PATCH, DELETE, ...) without a key is refused
// with ErrKeyRequired and not sent at all: a retry after a timeout would be
// a second charge, because the first request may have arrived. A body that
// cannot be replayed (no Request.GetBody) is refused with
// ErrBodyNotReplayable before the first attempt, rather than discovered at
// the second.
//
// # Retry rules
//
// Retried with the same key: transport errors (connection refused, reset,
// EOF before a response: the outcome is unknown, and the key makes finding
// out safe), 409 whose problem+json code is IDEMPOTENCY_KEY_IN_PROGRESS (the
// first attempt is still running on the server), 429, 502, 503, 504, and
// 500 if Config.Retry500 is set. Retry-After (seconds or an HTTP date) is a
// minimum wait. Waits are exponential with full jitter (internal/backoff):
// uniform in [0, min(BackoffMax, BackoffMin·2^(n-1))]. Never retried: any
// other 4xx, notably 409 IDEMPOTENCY_KEY_REUSED (the key was sent with a
// different body, a bug in the caller), 400 and 422.
//
// The request's context bounds everything: attempts and waits. A wait that
// would end after the context's deadline is not started; Do returns at once
// with an *Error whose Cause is context.DeadlineExceeded.
//
// Config.Hook sees every attempt (EventAttemptBegin, whose returned context
// the attempt's request carries, then EventAttempt), every retry with its
// Reason and wait, a replayed success and a call that gave up: what a
// tracer or a retry metric needs, never the key.
//
// # What it does not guarantee
//
// The key protects nothing if the server ignores it; idemclient cannot
// tell. A call that returns a retryable error (IsRetryable) may or may not
// have taken effect: the caller must keep the command (an outbox row, an
// uncommitted Kafka message) and retry it later with the same key, not
// treat the error as "not done". Attempts counts this client's attempts,
// not the requests on the wire (see the next section). Keys must be unique
// per operation: two different operations derived to the same key are one
// operation to the server.
//
// # net/http's own replay of requests with an Idempotency-Key
//
// net/http's Transport retries a request by itself, below this package,
// when a connection taken from the keep-alive pool turns out to be dead: it
// resends the request on another connection if nothing was written, or, for
// a request it considers idempotent, if the server closed the connection
// before the first response byte. A request counts as idempotent when its
// method is GET, HEAD, OPTIONS or TRACE, or when its header map has an
// "Idempotency-Key" or "X-Idempotency-Key" entry, and its body can be
// rewound (GetBody). So every POST that idemclient sends qualifies, and
// one idemclient attempt can reach the server two or more times.
//
// That is exactly the case of a provider that charged and then lost the
// connection before answering: the Transport resends, the server replays
// its stored answer, and Do sees one successful attempt with Replayed set.
// It is safe only because the key is the same on the resend, which is
// what this package guarantees; a client that sets a fresh key per attempt
// still gets this transport-level resend with the old key, and double
// charges only when the failure surfaces to its own retry loop. The
// Transport never resends on a fresh connection and never after a partial
// response, so those failures reach Do as transport errors and are retried
// here with backoff. Setting the header to a zero-length slice
// (req.Header["Idempotency-Key"] = []string{}) marks a request idempotent
// for the Transport without sending the header; this package always sends
// the key, and it does not turn off the Transport's resend (only disabling
// keep-alives would).
package idemclient
