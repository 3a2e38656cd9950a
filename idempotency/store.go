package idempotency

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
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
// conformance suite in idempotency/storetest checks any implementation.
type Store interface {
	// Claim atomically takes c.Key or reports who has it, in one step (one
	// round trip for PostgreSQL): a new, expired or released key is claimed;
	// a claimed key whose lease ran out is taken over (fingerprint must
	// match); otherwise the result is a replay, a mismatch or in-progress,
	// a mismatch winning over in-progress. ctx bounds the call.
	Claim(ctx context.Context, c Claim) (ClaimResult, error)
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
	// outcome is OutcomeClaimed or OutcomeTookOver the returned tx is open
	// and the caller must end it with CommitComplete or a Rollback; for
	// any other outcome (or an error) tx is nil and nothing stays open.
	// A concurrent BeginClaim on the same key does not wait for the open
	// transaction: it reports OutcomeInProgress at once (a mismatch cannot
	// be seen until the first commits). Fence may be 0: the transaction is
	// the fence.
	BeginClaim(ctx context.Context, c Claim) (pgx.Tx, ClaimResult, error)
	// CommitComplete stores resp in tx (it must come from BeginClaim) and
	// commits tx: the claim, everything written through tx and the response
	// commit together. On error tx is rolled back; ErrFenced means the key
	// was taken by another claimer meanwhile.
	CommitComplete(ctx context.Context, tx pgx.Tx, key KeyHash, fence int64, resp *Response, retention time.Duration) error
}

// Errors.
var (
	// ErrFenced means the caller's claim was taken over (its lease ran out)
	// or released: its completion is rejected so that it cannot overwrite
	// the new owner's result.
	ErrFenced = errors.New("idempotency: claim fenced out by a newer owner")
	// ErrKeyRequired means the request has no Idempotency-Key header.
	ErrKeyRequired = errors.New("idempotency: Idempotency-Key header required")
	// ErrKeyInvalid means the Idempotency-Key is not 1–255 visible ASCII
	// characters, bare or as a structured-field string.
	ErrKeyInvalid = errors.New("idempotency: Idempotency-Key invalid")
	// ErrBodyTooLarge means the request body exceeds Config.MaxRequestBody.
	ErrBodyTooLarge = errors.New("idempotency: request body too large")
	// ErrTxOwned is returned by Commit and Rollback on the transaction from
	// TxFromContext: the middleware owns it and commits it with the stored
	// response.
	ErrTxOwned = errors.New("idempotency: the transaction belongs to the middleware")
	// ErrStoreUnavailable wraps store failures reported to hooks.
	ErrStoreUnavailable = errors.New("idempotency: store unavailable")
)
