package idempotency

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/idempotency/internal/dbsqlc"
)

// Errors of the operator functions. Use errors.Is.
var (
	// ErrKeyNotFound: the store has no record of the key and no request
	// holds it (never used, purged, or its transaction rolled back).
	ErrKeyNotFound = errors.New("idempotency: key not found")
	// ErrKeyNotInProgress: ForceRelease found the key, but not claimed
	// by a two-step request (completed, released, or held by a
	// transaction, which only ends with that transaction).
	ErrKeyNotInProgress = errors.New("idempotency: key is not claimed by a two-step request")
	// ErrClaimChanged: the key's record is not the one the operator was
	// shown (AdminAction.Fence): another request took the claim over, or
	// completed it, since. Nothing was changed; inspect the key again.
	ErrClaimChanged = errors.New("idempotency: the key's claim is not the one shown")
	// ErrLeaseLive: the claim's lease is live, so its handler may still be
	// running; nothing was changed. Release it only when that handler is
	// known to be gone (AdminAction.Force).
	ErrLeaseLive = errors.New("idempotency: the claim's lease is live")
	// ErrAuditRequired: an AdminAction without an Actor or a Reason.
	ErrAuditRequired = errors.New("idempotency: an operator action needs an actor and a reason")
)

// AdminAction is what ForceRelease and Forget act on and who asks.
type AdminAction struct {
	// Fence is the fence of the record the operator was shown
	// (KeyRecord.Fence): the action applies to that record only, never to
	// a claim that took the key over since. Required.
	Fence int64
	// Force releases (or deletes) a claim whose lease is still live.
	Force bool
	// Actor and Reason are recorded in the idem_admin_audit table by the
	// same statement as the action. Both are required.
	Actor, Reason string
}

func (a AdminAction) check() error {
	if strings.TrimSpace(a.Actor) == "" || strings.TrimSpace(a.Reason) == "" {
		return ErrAuditRequired
	}
	if a.Fence <= 0 {
		return fmt.Errorf("%w: no fence given (inspect the key and pass the fence shown)", ErrClaimChanged)
	}
	return nil
}

// KeyHashHex names a key in the audit trail and the logs: the hex of its
// hash, never the key or its principal.
func KeyHashHex(key KeyHash) string { return fmt.Sprintf("%x", key[:]) }

// KeyRecord is what an operator may see of one key. The key and the
// principal are never stored: the record is found by their hash.
type KeyRecord struct {
	// State is "claimed", "released" or "completed" for a stored record,
	// or "in_transaction" for a transactional claim that is not committed
	// yet (no row exists: the request's open transaction holds the key).
	State string `json:"state"`
	// InProgress: a request holds the key now (a live two-step lease or an
	// open transaction); a retry is answered IDEMPOTENCY_KEY_IN_PROGRESS.
	InProgress bool `json:"in_progress"`
	// Expired: the record's retention ended; the next request with the
	// key is a new request (the purge deletes it).
	Expired bool `json:"expired"`
	// HolderPID is the PostgreSQL backend whose transaction holds a
	// transactional claim, 0 otherwise.
	HolderPID      int         `json:"holder_pid,omitempty"`
	Fence          int64       `json:"fence,omitempty"`
	Fingerprint    Fingerprint `json:"-"`
	LockedUntil    *time.Time  `json:"locked_until,omitempty"`
	ResponseStatus int         `json:"response_status,omitempty"`
	CreatedAt      *time.Time  `json:"created_at,omitempty"`
	CompletedAt    *time.Time  `json:"completed_at,omitempty"`
	ExpiresAt      *time.Time  `json:"expires_at,omitempty"`
}

func tsPtr(valid bool, t time.Time) *time.Time {
	if !valid {
		return nil
	}
	return &t
}

// Inspect returns what the store holds for key, or ErrKeyNotFound. It
// changes nothing. A transactional claim in progress has no row yet: it
// is found through the advisory lock its transaction holds.
func (s *PostgresStore) Inspect(ctx context.Context, key KeyHash) (*KeyRecord, error) {
	r, err := s.q.InspectKey(ctx, key[:])
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("idempotency: inspect: %w", err)
	}
	pid, perr := s.q.TxLockHolder(ctx, lockID(key))
	if perr != nil {
		return nil, fmt.Errorf("idempotency: inspect: %w", perr)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		if pid == 0 {
			return nil, ErrKeyNotFound
		}
		return &KeyRecord{State: "in_transaction", InProgress: true, HolderPID: int(pid)}, nil
	}
	rec := &KeyRecord{
		State: r.State, InProgress: r.LeaseLive || pid != 0, Expired: r.Expired, HolderPID: int(pid), Fence: r.Fence,
		LockedUntil: tsPtr(r.LockedUntil.Valid, r.LockedUntil.Time), ResponseStatus: int(r.ResponseStatus),
		CreatedAt: tsPtr(r.CreatedAt.Valid, r.CreatedAt.Time), CompletedAt: tsPtr(r.CompletedAt.Valid, r.CompletedAt.Time),
		ExpiresAt: tsPtr(r.ExpiresAt.Valid, r.ExpiresAt.Time),
	}
	copy(rec.Fingerprint[:], r.Fingerprint)
	return rec, nil
}

// ForceRelease frees the two-step claim of key whose fence is a.Fence,
// so that the next request with the same fingerprint runs the handler at
// once. The claim's handler, if it still runs, is fenced out: it can
// neither store its response nor release the new owner's claim. A claim
// whose lease is live is released only with a.Force: do it only when that
// handler is known to be gone or harmless to repeat. The action and its
// actor and reason are recorded in idem_admin_audit in the same statement.
//
// It returns ErrAuditRequired, ErrKeyNotFound, ErrClaimChanged (the key
// holds another fence now: a retry took the claim over, or completed it),
// ErrLeaseLive, or ErrKeyNotInProgress for a key that is completed,
// released or held by a transaction (end that transaction instead:
// KeyRecord.HolderPID names its backend).
func (s *PostgresStore) ForceRelease(ctx context.Context, key KeyHash, a AdminAction) error {
	if err := a.check(); err != nil {
		return err
	}
	n, err := s.q.ReleaseClaim(ctx, dbsqlc.ReleaseClaimParams{KeyHash: key[:], Fence: a.Fence, Force: a.Force,
		Subject: KeyHashHex(key), Actor: a.Actor, Reason: a.Reason})
	if err != nil {
		return fmt.Errorf("idempotency: release: %w", err)
	}
	if n == 1 {
		return nil
	}
	rec, err := s.Inspect(ctx, key)
	switch {
	case err != nil:
		return err
	case rec.State == "in_transaction":
		return ErrKeyNotInProgress
	case rec.Fence != a.Fence:
		return fmt.Errorf("%w: it holds fence %d now, not %d (state %s)", ErrClaimChanged, rec.Fence, a.Fence, rec.State)
	case rec.State != "claimed":
		return ErrKeyNotInProgress
	}
	return ErrLeaseLive
}

// Forget deletes the record of key whose fence is a.Fence (a response
// stored by a bug, say): the next request with the key runs the handler
// again, on every instance within Config.ReplayCacheTTL. A claim whose
// lease is live is deleted only with a.Force. The action is recorded in
// idem_admin_audit in the same statement. It returns ErrAuditRequired,
// ErrKeyNotFound, ErrClaimChanged or ErrLeaseLive, changing nothing.
func (s *PostgresStore) Forget(ctx context.Context, key KeyHash, a AdminAction) error {
	if err := a.check(); err != nil {
		return err
	}
	n, err := s.q.ForgetRecord(ctx, dbsqlc.ForgetRecordParams{KeyHash: key[:], Fence: a.Fence, Force: a.Force,
		Subject: KeyHashHex(key), Actor: a.Actor, Reason: a.Reason})
	if err != nil {
		return fmt.Errorf("idempotency: forget: %w", err)
	}
	if n == 1 {
		return nil
	}
	rec, err := s.Inspect(ctx, key)
	switch {
	case err != nil:
		return err
	case rec.State == "in_transaction":
		return ErrKeyNotInProgress
	case rec.Fence != a.Fence:
		return fmt.Errorf("%w: it holds fence %d now, not %d (state %s)", ErrClaimChanged, rec.Fence, a.Fence, rec.State)
	}
	return ErrLeaseLive
}

// RequestFingerprint is the fingerprint the middleware computes for a
// request with method, target (path and query, as sent: "/orders/42/confirm"),
// contentType and body, under the default fingerprint options (no
// FingerprintHeaders, no FingerprintFields). Compare it with
// KeyRecord.Fingerprint to tell whether a body would be replayed or
// refused as a mismatch.
func RequestFingerprint(method, target, contentType string, body []byte) (Fingerprint, error) {
	if !strings.HasPrefix(target, "/") {
		return Fingerprint{}, fmt.Errorf("idempotency: target %q does not start with /", target)
	}
	r, err := http.NewRequest(method, "http://host"+target, nil)
	if err != nil {
		return Fingerprint{}, fmt.Errorf("idempotency: target %q: %w", target, err)
	}
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	c := &config{Config: Config{MaxBodyDepth: MaxBodyDepthDefault}}
	return c.fingerprint(r, body)
}
