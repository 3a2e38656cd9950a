package paysim

import (
	"crypto/sha256"
	"encoding/binary"
	"sync"
)

// faults decides, reproducibly, which requests fail. A decision is a pure
// function of (seed, kind, idempotency key, how many times this key has
// been seen for this kind), not of a shared random stream, so that the
// same seed and the same keys give the same faults however concurrent
// requests interleave: the 3rd arrival of key k is dropped or not whatever
// other keys do meanwhile.
type faults struct {
	seed        uint64
	failRate    float64
	dropRate    float64
	declineRate float64

	mu   sync.Mutex
	seen map[string]uint64 // kind + "\x00" + key → arrivals so far
}

const (
	faultFail    = "fail"
	faultDrop    = "drop"
	faultDecline = "decline"
)

func newFaults(seed uint64, failRate, dropRate, declineRate float64) *faults {
	return &faults{seed: seed, failRate: failRate, dropRate: dropRate, declineRate: declineRate, seen: map[string]uint64{}}
}

// declined reports whether key is one the provider declines. Unlike the
// other faults it is a function of the seed and the key alone, not of the
// arrival: a card is declined on every attempt, by this process or by a
// restarted one whose idempotency store is empty.
func (f *faults) declined(key string) bool {
	return f.declineRate > 0 && draw(f.seed, faultDecline, key, 0) < f.declineRate
}

// hit reports whether this arrival of key gets fault kind.
func (f *faults) hit(kind, key string) bool {
	rate := f.failRate
	if kind == faultDrop {
		rate = f.dropRate
	}
	if rate <= 0 {
		return false
	}
	f.mu.Lock()
	id := kind + "\x00" + key
	n := f.seen[id]
	f.seen[id] = n + 1
	f.mu.Unlock()
	return draw(f.seed, kind, key, n) < rate
}

// draw is a uniform number in [0, 1) derived from its arguments.
func draw(seed uint64, kind, key string, n uint64) float64 {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], seed)
	binary.BigEndian.PutUint64(b[8:], n)
	h := sha256.New()
	h.Write(b[:])
	h.Write([]byte(kind))
	h.Write([]byte{0})
	h.Write([]byte(key))
	sum := h.Sum(nil)
	return float64(binary.BigEndian.Uint64(sum[:8])>>11) / (1 << 53)
}
