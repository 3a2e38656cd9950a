package main

import (
	"encoding/json"
	"regexp"
	"testing"

	"github.com/idemkit/idem/internal/testdb"
)

// TestBenchRelayJSON runs the scenario small and checks the contract: one
// JSON object, the result names in order (sql-floor first, every
// throughput figure with its ratio to it, wal's to wal-floor), every
// event counted, the retained rows purged, and the scratch schemas, slots
// and publications gone afterwards.
func TestBenchRelayJSON(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, testdb.Empty())
	stdout, stderr, code := runIdem(t, []string{"DATABASE_URL=" + db.URL}, "bench", "relay", "--json",
		"--events", "1200", "--aggregates", "40", "--batch-size", "200", "--latency-events", "100", "--rate", "200",
		"--publisher-events", "0", "--blocked", "400", "--blocked-aggregates", "20", "--retained", "3000", "--wal-events", "900")
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
	want := []string{"sql-floor", "sql-ceiling", "per-row", "at-least-once", "two-phase", "backlog", "hot-aggregate", "retained", "purge", "notify-latency",
		"wal-floor", "wal", "wal-latency"}
	if out.Scenario != "relay" || len(out.Results) != len(want) {
		t.Fatalf("unexpected results: %+v", out)
	}
	for i, r := range out.Results {
		wantOps, ratio := 1200, true
		switch r.Name {
		case "purge":
			wantOps, ratio = 3000, false
		case "notify-latency", "wal-latency":
			wantOps, ratio = 100, false
		case "wal-floor", "wal":
			wantOps = 900
		}
		if r.Name != want[i] || r.Ops != wantOps || r.OpsPerSec <= 0 || r.P99Ms < r.P50Ms || (r.Ratio > 0) != ratio {
			t.Errorf("result %d: %+v, want name %s and %d ops", i, r, want[i], wantOps)
		}
	}
	if out.Results[0].Ratio != 1 {
		t.Errorf("sql-floor ratio %v, want 1", out.Results[0].Ratio)
	}
	floor, w := out.Results[len(want)-3], out.Results[len(want)-2]
	if r := w.OpsPerSec / floor.OpsPerSec; w.Ratio < r*0.999 || w.Ratio > r*1.001 {
		t.Errorf("wal ratio %v, want wal / wal-floor = %v", w.Ratio, r)
	}
	// Other tests run this scenario at the same time: count this run's
	// schemas only, by the name it printed.
	m := regexp.MustCompile(`scratch schemas (bench_relay_[0-9a-f]{12}_)`).FindStringSubmatch(stderr)
	if m == nil {
		t.Fatalf("no scratch schema name on stderr:\n%s", stderr)
	}
	var left int
	if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_namespace WHERE starts_with(nspname, $1)`, m[1]).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d scratch schemas left behind", left)
	}
	benchWALLeftBehind(t, db, stderr)
	for _, args := range [][]string{{"--events", "0"}, {"--batch-size", "200000"}, {"--blocked", "5", "--blocked-aggregates", "10"}, {"--retained", "-1"}, {"--wal-events", "0"}} {
		if _, stderr, code := runIdem(t, nil, append([]string{"bench", "relay"}, args...)...); code != 2 {
			t.Errorf("%v: exit %d (%s), want 2", args, code, stderr)
		}
	}
}
