package idemclient

import (
	"testing"
	"time"
)

func TestBackoffFullJitterBounds(t *testing.T) {
	t.Parallel()
	c, err := New(nil, &Config{BackoffMin: 10 * time.Millisecond, BackoffMax: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ceilings := map[int]time.Duration{1: 10, 2: 20, 3: 40, 4: 80, 5: 100, 6: 100, 60: 100}
	for n, ms := range ceilings {
		ceiling := ms * time.Millisecond
		lo, hi := ceiling, time.Duration(0)
		for range 2000 {
			d := c.backoff.Delay(n)
			if d < 0 || d > ceiling {
				t.Fatalf("backoff(%d) = %v, outside [0, %v]", n, d, ceiling)
			}
			lo, hi = min(lo, d), max(hi, d)
		}
		// Full jitter spreads over the whole range, not a narrow band
		// around the ceiling: 2000 uniform draws land in the bottom and top
		// tenth with probability 1 - 2·0.9^2000.
		if lo > ceiling/10 || hi < ceiling*9/10 {
			t.Errorf("backoff(%d) drew only [%v, %v] of [0, %v]", n, lo, hi, ceiling)
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	testCases := []struct {
		in   string
		want time.Duration
	}{
		{"", 0},
		{"0", 0},
		{"-5", 0},
		{"7", 7 * time.Second},
		{"soon", 0},
		{"Mon, 30 Nov 2026 12:00:30 GMT", 30 * time.Second},
		{"Mon, 30 Nov 2026 11:00:00 GMT", 0},
		{"99999999999999999999", 0},
		{"9999999999999", 1<<63 - 1},
	}
	for _, tt := range testCases {
		if got := parseRetryAfter(tt.in, now); got != tt.want {
			t.Errorf("parseRetryAfter(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

func FuzzParseRetryAfter(f *testing.F) {
	f.Add("120")
	f.Add("Mon, 30 Nov 2026 12:00:30 GMT")
	f.Fuzz(func(t *testing.T, s string) {
		if d := parseRetryAfter(s, time.Now()); d < 0 {
			t.Fatalf("parseRetryAfter(%q) = %v", s, d)
		}
	})
}
