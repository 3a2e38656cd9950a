package idempotency

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"net/http"
	"time"

	"github.com/idemkit/idem"
)

// KeyHash identifies one idempotency record: SHA-256 over the scope (the
// principal), the method, the route and the Idempotency-Key. Stores see only
// the hash, so neither the key nor the principal is ever stored in clear.
type KeyHash [32]byte

// HashKey returns the KeyHash of a key used by scope on method and route.
// Each part is length-prefixed, so no two different tuples share a hash
// input ("a"+"bc" and "ab"+"c" differ).
func HashKey(scope, method, route, key string) KeyHash {
	h := sha256.New()
	var n [8]byte
	for _, s := range [...]string{"idem/v1", scope, method, route, key} {
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	var k KeyHash
	h.Sum(k[:0])
	return k
}

// Fingerprint is the SHA-256 of what makes two requests "the same request":
// method, path, body (JSON canonicalised) and any configured headers.
type Fingerprint [32]byte

// Outcome is what a claim found.
type Outcome int

const (
	// OutcomeClaimed: the caller owns the key (a new key, an expired one, or
	// one released by an earlier run) and must run the handler.
	OutcomeClaimed Outcome = iota + 1
	// OutcomeTookOver: the caller owns the key after an earlier owner's lease
	// ran out without a completion (it crashed or hung). The earlier owner is
	// fenced out.
	OutcomeTookOver
	// OutcomeInProgress: another request owns the key and its lease is live.
	OutcomeInProgress
	// OutcomeCompleted: the key holds a stored response for the same
	// fingerprint; replay it.
	OutcomeCompleted
	// OutcomeMismatch: the key is live for a different fingerprint. A
	// mismatch wins over in-progress.
	OutcomeMismatch
)

func (o Outcome) String() string {
	switch o {
	case OutcomeClaimed:
		return "claimed"
	case OutcomeTookOver:
		return "took_over"
	case OutcomeInProgress:
		return "in_progress"
	case OutcomeCompleted:
		return "completed"
	case OutcomeMismatch:
		return "mismatch"
	}
	return "unknown"
}

// Claim asks a Store to take a key.
type Claim struct {
	Key         KeyHash
	Fingerprint Fingerprint
	// Lease is how long the claim holds the key without a completion, measured
	// in the store's clock (database time for PostgreSQL).
	Lease time.Duration
	// Retention is how long the record lives (claimed or completed) before
	// the key may be reused and the record purged.
	Retention time.Duration
}

// ClaimResult is the outcome of one atomic claim.
type ClaimResult struct {
	Outcome Outcome
	// Fence is the caller's fencing token when Outcome is OutcomeClaimed or
	// OutcomeTookOver: Complete and Release succeed only with it. Fences of
	// a key strictly increase and are never reused.
	Fence int64
	// Response is the stored response when Outcome is OutcomeCompleted.
	Response *Response
	// RetryAfter is what is left of the owner's lease when Outcome is
	// OutcomeInProgress.
	RetryAfter time.Duration
	// ExpiresIn is what is left of the record's retention when Outcome is
	// OutcomeCompleted (0 if unknown). A completed record never changes
	// before it expires, so its response may be cached for that long.
	ExpiresIn time.Duration
}

// Response is a stored response.
type Response struct {
	Status int
	// Header holds only the replayable (allow-listed) headers.
	Header http.Header
	Body   []byte
}

// Store keeps idempotency records. Every method is safe for concurrent use.
// Implementations: NewPostgresStore (durable, shared by every instance of a
// service) and NewMemoryStore (one process; tests and simulators). The
// conformance suite in idempotency/storetest checks any implementation:
// a store that passes it is what the middleware needs.
//
// Leases and retentions are measured in the store's own clock (database
// time for PostgreSQL), never in the callers': instances with skewed clocks
// agree on who owns a key. A fence is the token of one claim: every claim
// that takes a key gets a fence greater than any the key had, and only the
// current fence may complete, release or renew.
type Store interface {
	// Claim atomically takes c.Key or reports who has it, in one step (one
	// round trip for PostgreSQL): a new, expired or released key is claimed;
	// a claimed key whose lease ran out is taken over (fingerprint must
	// match); otherwise the result is a replay, a mismatch or in-progress,
	// a mismatch winning over in-progress. The lease runs from the store's
	// now when it handles the call. ctx bounds the call.
	Claim(ctx context.Context, c Claim) (ClaimResult, error)
	// Renew extends the live lease of fence to lease from the store's now
	// (and the record's retention, if shorter, to the same end), so that a
	// handler that runs longer than one lease keeps its key. It returns
	// ErrFenced if fence no longer owns a live lease: taken over, released,
	// completed, or run out in the store's clock even if nobody took the
	// key meanwhile. A renewal never brings an expired lease back.
	Renew(ctx context.Context, key KeyHash, fence int64, lease time.Duration) error
	// Complete stores resp for the key if fence still owns it, and keeps it
	// for retention from now. It returns ErrFenced if the claim was taken
	// over (or released) meanwhile.
	Complete(ctx context.Context, key KeyHash, fence int64, resp *Response, retention time.Duration) error
	// Release gives up the claim so that the next request with the same
	// fingerprint runs the handler again at once. It returns ErrFenced if
	// fence no longer owns the key.
	Release(ctx context.Context, key KeyHash, fence int64) error
	// Purge deletes up to limit expired records (never one whose lease is
	// live) and returns how many it deleted.
	Purge(ctx context.Context, limit int) (int, error)
}

// TxStore is a Store that can also claim inside a database transaction, for
// ModeTransactional: the claim, the handler's own writes and the stored
// response commit together or not at all. PostgresStore implements it.
type TxStore interface {
	Store
	// BeginClaim begins a transaction and claims c.Key in it. When the
	// outcome is OutcomeClaimed or OutcomeTookOver, the returned ClaimTx is
	// open and the caller must end it with its Commit or Rollback; for any
	// other outcome (or an error) it is nil and nothing stays open. A
	// concurrent BeginClaim on the same key does not wait for the open
	// transaction: it reports OutcomeInProgress at once (a mismatch cannot
	// be seen until the first commits). Fence is 0: the transaction is the
	// fence.
	BeginClaim(ctx context.Context, c Claim) (*ClaimTx, ClaimResult, error)
}

// sentinel is an error of this package that is also one of package idem's,
// for errors.Is with either.
type sentinel struct {
	msg  string
	base error
}

func (e *sentinel) Error() string { return e.msg }
func (e *sentinel) Unwrap() error { return e.base }

// Errors.
var (
	// ErrInvalidConfig is wrapped by every error of New about its Config;
	// the message names the field.
	ErrInvalidConfig = errors.New("idempotency: invalid config")
	// ErrFenced means the caller's claim was taken over (its lease ran out)
	// or released: its completion is rejected so that it cannot overwrite
	// the new owner's result.
	ErrFenced = errors.New("idempotency: claim fenced out by a newer owner")
	// ErrLeaseLost is the cause of a handler's context ending because its
	// claim's lease could not be renewed in time (the store was unreachable)
	// or was found taken over: a retry may take the key over, and the
	// handler should stop.
	ErrLeaseLost = errors.New("idempotency: the claim's lease could not be renewed")
	// ErrKeyRequired means the request has no Idempotency-Key header. It is
	// also idem.ErrKeyRequired.
	ErrKeyRequired error = &sentinel{"idempotency: Idempotency-Key header required", idem.ErrKeyRequired}
	// ErrKeyInvalid means the Idempotency-Key breaks idem's key rule, or the
	// request has two of them. It is also idem.ErrKeyInvalid.
	ErrKeyInvalid error = &sentinel{"idempotency: Idempotency-Key invalid", idem.ErrKeyInvalid}
	// ErrBodyTooLarge means the request body exceeds Config.MaxRequestBody.
	ErrBodyTooLarge = errors.New("idempotency: request body too large")
	// ErrBodyTooDeep means a JSON body nests deeper than
	// Config.MaxBodyDepth.
	ErrBodyTooDeep = errors.New("idempotency: JSON body nested too deep")
	// ErrBodyAmbiguous means a JSON object in the body has two members
	// whose names encoding/json could take for one (equal, or equal
	// ignoring case): which one a handler sees depends on its decoder, so
	// no fingerprint can be trusted to tell two such requests apart.
	ErrBodyAmbiguous = errors.New("idempotency: JSON body has member names equal ignoring case")
	// ErrTxOwned is returned by Commit and Rollback on the transaction from
	// TxFromContext: the middleware owns it and commits it with the stored
	// response.
	ErrTxOwned = errors.New("idempotency: the transaction belongs to the middleware")
	// ErrTxAborted is returned by ClaimTx.Commit for a success (any status
	// but 4xx) whose transaction had a failed statement: PostgreSQL will not
	// commit it, and storing the success without its writes would be a lie.
	// Everything rolls back and the key is free again.
	ErrTxAborted = errors.New("idempotency: success answered after a failed statement: the transaction is aborted")
	// ErrStoreUnavailable wraps store failures reported to hooks.
	ErrStoreUnavailable = errors.New("idempotency: store unavailable")
)
