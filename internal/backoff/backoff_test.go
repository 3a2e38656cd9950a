package backoff_test

import (
	"testing"
	"time"

	"github.com/idemkit/idem/internal/backoff"
)

func TestCeiling(t *testing.T) {
	t.Parallel()
	p := backoff.Policy{Min: 100 * time.Millisecond, Max: time.Second}
	testCases := []struct {
		n    int
		want time.Duration
	}{
		{0, 100 * time.Millisecond}, {1, 100 * time.Millisecond}, {2, 200 * time.Millisecond},
		{4, 800 * time.Millisecond}, {5, time.Second}, {1000, time.Second},
	}
	for _, tt := range testCases {
		if got := p.Ceiling(tt.n); got != tt.want {
			t.Errorf("Ceiling(%d) = %v, want %v", tt.n, got, tt.want)
		}
	}
	huge := backoff.Policy{Min: time.Hour, Max: 1<<63 - 1}
	if got := huge.Ceiling(200); got <= 0 {
		t.Fatalf("Ceiling overflowed: %v", got)
	}
}

func TestDelayIsFullJitter(t *testing.T) {
	t.Parallel()
	p := backoff.Policy{Min: time.Millisecond, Max: 8 * time.Millisecond}
	var low, high int
	for i := 0; i < 10_000; i++ {
		d := p.Delay(4) // ceiling 8ms
		if d < 0 || d > 8*time.Millisecond {
			t.Fatalf("Delay(4) = %v outside [0, 8ms]", d)
		}
		if d < 2*time.Millisecond {
			low++
		}
		if d > 6*time.Millisecond {
			high++
		}
	}
	// A uniform draw puts about a quarter of the mass in each of these.
	if low < 2000 || high < 2000 {
		t.Fatalf("not uniform over [0, ceiling]: %d below 2ms, %d above 6ms of 10000", low, high)
	}
	if (backoff.Policy{}).Delay(3) != 0 {
		t.Fatal("zero policy must not wait")
	}
}
