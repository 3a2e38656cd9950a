package redisstore

import (
	"context"

	"github.com/idemkit/idem/idempotency"
)

// ClaimWithID is Claim with a given claim id: the same call re-sent, as
// go-redis re-sends a command whose reply was lost.
func (s *Store) ClaimWithID(ctx context.Context, c idempotency.Claim, id []byte) (idempotency.ClaimResult, error) {
	return s.claim(ctx, c, id)
}
