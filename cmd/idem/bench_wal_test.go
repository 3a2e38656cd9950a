package main

import (
	"encoding/json"
	"testing"

	"github.com/idemkit/idem/internal/testdb"
)

// TestBenchWALJSON runs the scenario small and checks the contract: one
// JSON object with the result names of issue 19 and their baselines, in
// order, every event counted, and nothing left behind (scratch schemas,
// slots, publications).
func TestBenchWALJSON(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, testdb.Empty())
	stdout, stderr, code := runIdem(t, []string{"DATABASE_URL=" + db.URL}, "bench", "wal", "--json",
		"--clients", "2", "--txs", "40", "--events", "1500", "--batch-size", "200", "--latency-events", "100", "--rate", "200")
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
		} `json:"results"`
	}
	if err := json.Unmarshal([]byte(stdout), &out); err != nil {
		t.Fatalf("stdout is not one JSON object: %v\n%s", err, stdout)
	}
	want := []struct {
		name string
		ops  int
	}{{"plain", 40}, {"enqueue-1", 40}, {"enqueue-10", 40}, {"wal-1", 40}, {"wal-10", 40},
		{"wal-floor", 1500}, {"wal", 1500}, {"at-least-once", 1500}, {"wal-latency", 100}}
	if out.Scenario != "wal" || len(out.Results) != len(want) {
		t.Fatalf("unexpected results: %+v", out)
	}
	for i, r := range out.Results {
		if r.Name != want[i].name || r.Ops != want[i].ops || r.OpsPerSec <= 0 || r.P99Ms < r.P50Ms {
			t.Errorf("result %d: %+v, want name %s and %d ops", i, r, want[i].name, want[i].ops)
		}
	}
	var schemas, slots, pubs int
	err := db.Pool.QueryRow(t.Context(), `SELECT
		(SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'bench_wal_%'),
		(SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'bench_wal_%'),
		(SELECT count(*) FROM pg_publication WHERE pubname LIKE 'bench_wal_%')`).Scan(&schemas, &slots, &pubs)
	if err != nil {
		t.Fatal(err)
	}
	if schemas+slots+pubs != 0 {
		t.Errorf("left behind: %d scratch schemas, %d slots, %d publications", schemas, slots, pubs)
	}
	for _, args := range [][]string{{"--events", "0"}, {"--batch-size", "200000"}, {"--clients", "0"}} {
		if _, stderr, code := runIdem(t, nil, append([]string{"bench", "wal"}, args...)...); code != 2 {
			t.Errorf("%v: exit %d (%s), want 2", args, code, stderr)
		}
	}
}
