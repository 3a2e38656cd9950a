package main

import (
	"encoding/json"
	"regexp"
	"testing"

	"github.com/idemkit/idem/internal/testdb"
)

// TestBenchEnqueueJSON runs the scenario small and checks the contract:
// one JSON object, the result names plain, enqueue-1, enqueue-10, wal-1,
// wal-10 in order, ratios to plain, and the scratch schema gone
// afterwards; --wal=false leaves the wal-* results out.
func TestBenchEnqueueJSON(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, testdb.Empty())
	stdout, stderr, code := runIdem(t, []string{"DATABASE_URL=" + db.URL}, "bench", "enqueue", "--json",
		"--seconds", "1", "--rounds", "1", "--clients", "2")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var out struct {
		Scenario string `json:"scenario"`
		Results  []struct {
			Name      string  `json:"name"`
			OpsPerSec float64 `json:"ops_per_sec"`
			P50Ms     float64 `json:"p50_ms"`
			P99Ms     float64 `json:"p99_ms"`
			Ops       int     `json:"ops"`
			Ratio     float64 `json:"ratio"`
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(stdout), &out); err != nil {
		t.Fatalf("stdout is not one JSON object: %v\n%s", err, stdout)
	}
	want := []string{"plain", "enqueue-1", "enqueue-10", "wal-1", "wal-10", "sql-enqueue-1"}
	if out.Scenario != "enqueue" || len(out.Results) != len(want) {
		t.Fatalf("unexpected results: %+v", out)
	}
	for i, r := range out.Results {
		if r.Name != want[i] || r.Ops <= 0 || r.OpsPerSec <= 0 || r.P99Ms < r.P50Ms || r.Ratio <= 0 {
			t.Errorf("result %d: %+v, want name %s", i, r, want[i])
		}
	}
	if out.Results[0].Ratio != 1 {
		t.Errorf("plain ratio %v, want 1", out.Results[0].Ratio)
	}
	stdout, stderr2, code := runIdem(t, []string{"DATABASE_URL=" + db.URL}, "bench", "enqueue", "--json",
		"--seconds", "1", "--rounds", "1", "--clients", "2", "--wal=false")
	if code != 0 {
		t.Fatalf("--wal=false: exit %d: %s", code, stderr2)
	}
	out.Results = nil
	if err := json.Unmarshal([]byte(stdout), &out); err != nil {
		t.Fatalf("--wal=false: stdout is not one JSON object: %v\n%s", err, stdout)
	}
	if len(out.Results) != 4 || out.Results[2].Name != "enqueue-10" || out.Results[3].Name != "sql-enqueue-1" {
		t.Errorf("--wal=false: %+v, want plain, enqueue-1, enqueue-10, sql-enqueue-1", out.Results)
	}
	// The bench wal test runs this scenario at the same time: count this
	// run's schema only, by the name it printed.
	var names []string
	for _, e := range []string{stderr, stderr2} {
		m := regexp.MustCompile(`scratch schema (bench_enqueue_[0-9a-f]{12}_0)`).FindStringSubmatch(e)
		if m == nil {
			t.Fatalf("no scratch schema name on stderr:\n%s", e)
		}
		names = append(names, m[1])
	}
	var left int
	if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_namespace WHERE nspname = ANY($1)`, names).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d scratch schemas left behind", left)
	}
	for _, args := range [][]string{{"--clients", "0"}, {"--seconds", "0"}} {
		if _, stderr, code := runIdem(t, nil, append([]string{"bench", "enqueue"}, args...)...); code != 2 {
			t.Errorf("%v: exit %d (%s), want 2", args, code, stderr)
		}
	}
}
