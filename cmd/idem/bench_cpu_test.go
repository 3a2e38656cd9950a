package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestProcCPU: utime + stime are fields 14 and 15 of /proc/<pid>/stat,
// counted after the command name's last ')' (a name may hold spaces and
// parentheses); a short or missing file reads zero; this process reads
// more than zero after some work.
func TestProcCPU(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	testCases := []struct {
		name, stat string
		want       time.Duration
	}{
		{"plain", "1234 (postgres) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 1 0\n", 3 * time.Second},
		{"name with spaces and parens", "1234 (we) ird (x)) S 1 2 3 4 5 6 7 8 9 10 7 3 0 0\n", 100 * time.Millisecond},
		{"short", "1234 (p) S 1 2 3\n", 0},
		{"no name", "garbage", 0},
		{"not numbers", "1234 (p) S 1 2 3 4 5 6 7 8 9 10 x y\n", 0},
	}
	for _, tt := range testCases {
		if got := procCPU(write(strings.ReplaceAll(tt.name, " ", "_"), tt.stat)); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
	if got := procCPU(filepath.Join(dir, "missing")); got != 0 {
		t.Errorf("missing file: %v, want 0", got)
	}
	deadline := time.Now().Add(5 * time.Second)
	for procCPU("/proc/self/stat") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("this process reads no CPU time after 5 s of spinning")
		}
		for i := 0; i < 1e6; i++ {
			_ = strings.Repeat("x", i%8)
		}
	}
}
