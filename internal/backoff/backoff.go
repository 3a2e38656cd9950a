// Package backoff is the one retry delay rule of idem: exponential with full
// jitter (AWS's "full jitter": a uniform draw in [0, cap]), where the cap
// doubles per failure from Min up to Max. Every retrying component (the
// outbox relay, the Kafka consumer, idemclient) uses it, and every config
// spells its bounds BackoffMin and BackoffMax.
//
// Full jitter spreads retries of many clients that failed together (a
// broker restart, a database failover) over the whole window instead of
// bunching them at its edge, which is what the +20% and ±25% rules idem had
// before did.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Policy bounds the delays. The zero value means no delay.
type Policy struct {
	// Min is the cap after the first failure.
	Min time.Duration
	// Max caps every delay.
	Max time.Duration
}

// Ceiling is the largest delay after the n-th consecutive failure (n from
// 1): min(Max, Min × 2^(n-1)). It never overflows.
func (p Policy) Ceiling(n int) time.Duration {
	if n < 1 {
		n = 1
	}
	d := p.Min
	for i := 1; i < n && d < p.Max; i++ {
		if d > p.Max/2 {
			d = p.Max
			break
		}
		d *= 2
	}
	return min(d, p.Max)
}

// Delay is the wait after the n-th consecutive failure (n from 1): a
// uniform draw in [0, Ceiling(n)].
func (p Policy) Delay(n int) time.Duration {
	c := p.Ceiling(n)
	if c <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(c) + 1))
}
