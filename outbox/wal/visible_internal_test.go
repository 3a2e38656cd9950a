package wal

import (
	"strconv"
	"testing"
)

// A pgoutput Begin carries 32 bits of the transaction id: widened against
// the snapshot, across an epoch boundary too, it is visible exactly when
// PostgreSQL's own rule says so (below xmin; below xmax and not running).
func TestSnapshotVisible(t *testing.T) {
	t.Parallel()
	const epoch = uint64(3) << 32
	testCases := []struct {
		name string
		snap string
		xid  uint32
		want bool
	}{
		{"below xmin", "100:110:", 99, true},
		{"between, finished", "100:110:103,105", 104, true},
		{"between, running", "100:110:103,105", 105, false},
		{"xmax itself: not completed yet", "100:110:", 110, false},
		{"past xmax", "100:110:", 111, false},
		{"epoch boundary, finished", fmtSnap(epoch-5, epoch+5, epoch-1), 0xFFFFFFFD, true},
		{"epoch boundary, running", fmtSnap(epoch-5, epoch+5, epoch-1), 0xFFFFFFFF, false},
		{"epoch boundary, after the wrap, finished", fmtSnap(epoch-5, epoch+5, epoch-1), 2, true},
		{"epoch boundary, past xmax", fmtSnap(epoch-5, epoch+5, epoch-1), 7, false},
		{"old transaction of the previous epoch", fmtSnap(epoch+1000, epoch+1000), 0xF0000000, true},
	}
	for _, tc := range testCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, err := parseSnapshot(tc.snap)
			if err != nil {
				t.Fatal(err)
			}
			if got := s.visible(tc.xid); got != tc.want {
				t.Errorf("visible(%d) in %s = %v, want %v", tc.xid, tc.snap, got, tc.want)
			}
		})
	}
}

func TestParseSnapshotRefusesGarbage(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"", "1:2", "a:2:", "1:b:", "1:2:x", "5:4:", "1:2:3,", "1:2:3:4"} {
		if _, err := parseSnapshot(s); err == nil {
			t.Errorf("parseSnapshot(%q) accepted it", s)
		}
	}
}

func fmtSnap(xmin, xmax uint64, xip ...uint64) string {
	s := strconv.FormatUint(xmin, 10) + ":" + strconv.FormatUint(xmax, 10) + ":"
	for i, x := range xip {
		if i > 0 {
			s += ","
		}
		s += strconv.FormatUint(x, 10)
	}
	return s
}
