package idempotency

import (
	"context"
	"sync"
	"time"
)

// MemoryStore is a Store in process memory: one process only, lost on exit.
// It is for tests and simulators (paysim); production uses PostgresStore.
// Its clock is the process clock.
type MemoryStore struct {
	mu    sync.Mutex
	recs  map[KeyHash]*memRecord
	fence int64
	now   func() time.Time
}

type memRecord struct {
	fp          Fingerprint
	state       string // claimed, released, completed
	fence       int64
	lockedUntil time.Time
	expiresAt   time.Time
	resp        *Response
}

// NewMemoryStore returns an empty MemoryStore.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{recs: map[KeyHash]*memRecord{}, now: time.Now}
}

var _ Store = (*MemoryStore)(nil)

// Claim implements Store.
func (s *MemoryStore) Claim(ctx context.Context, c Claim) (ClaimResult, error) {
	if err := ctx.Err(); err != nil {
		return ClaimResult{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	rec := s.recs[c.Key]
	outcome := OutcomeClaimed
	if rec != nil && now.Before(rec.expiresAt) {
		switch {
		case rec.fp != c.Fingerprint:
			return ClaimResult{Outcome: OutcomeMismatch}, nil
		case rec.state == "completed":
			return ClaimResult{Outcome: OutcomeCompleted, Response: cloneResponse(rec.resp), ExpiresIn: rec.expiresAt.Sub(now)}, nil
		case rec.state == "claimed" && now.Before(rec.lockedUntil):
			return ClaimResult{Outcome: OutcomeInProgress, RetryAfter: rec.lockedUntil.Sub(now)}, nil
		case rec.state == "claimed":
			outcome = OutcomeTookOver
		}
	}
	s.fence++
	s.recs[c.Key] = &memRecord{
		fp:          c.Fingerprint,
		state:       "claimed",
		fence:       s.fence,
		lockedUntil: now.Add(c.Lease),
		expiresAt:   now.Add(c.Retention),
	}
	return ClaimResult{Outcome: outcome, Fence: s.fence}, nil
}

// Renew implements Store.
func (s *MemoryStore) Renew(ctx context.Context, key KeyHash, fence int64, lease time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	rec := s.recs[key]
	if rec == nil || rec.fence != fence || rec.state != "claimed" || !now.Before(rec.lockedUntil) {
		return ErrFenced
	}
	rec.lockedUntil = now.Add(lease)
	if rec.expiresAt.Before(rec.lockedUntil) {
		rec.expiresAt = rec.lockedUntil
	}
	return nil
}

// Complete implements Store.
func (s *MemoryStore) Complete(ctx context.Context, key KeyHash, fence int64, resp *Response, retention time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec := s.recs[key]
	if rec == nil || rec.fence != fence || rec.state != "claimed" {
		return ErrFenced
	}
	rec.state = "completed"
	rec.resp = cloneResponse(resp)
	rec.lockedUntil = time.Time{}
	rec.expiresAt = s.now().Add(retention)
	return nil
}

// Release implements Store.
func (s *MemoryStore) Release(ctx context.Context, key KeyHash, fence int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rec := s.recs[key]
	if rec == nil || rec.fence != fence || rec.state != "claimed" {
		return ErrFenced
	}
	rec.state = "released"
	rec.lockedUntil = time.Time{}
	return nil
}

// Purge implements Store.
func (s *MemoryStore) Purge(ctx context.Context, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	n := 0
	for k, rec := range s.recs {
		if n >= limit {
			break
		}
		if !now.Before(rec.expiresAt) && !(rec.state == "claimed" && now.Before(rec.lockedUntil)) {
			delete(s.recs, k)
			n++
		}
	}
	return n, nil
}

func cloneResponse(r *Response) *Response {
	if r == nil {
		return nil
	}
	return &Response{Status: r.Status, Header: r.Header.Clone(), Body: append([]byte(nil), r.Body...)}
}
