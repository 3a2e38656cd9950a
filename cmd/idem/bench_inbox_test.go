package main

import (
	"encoding/json"
	"testing"

	"github.com/idemkit/idem/internal/testdb"
)

// TestBenchInboxJSON runs the scenario small and checks the contract:
// one JSON object on stdout, results per-record and batch, every record
// counted, and the scratch schema gone afterwards.
func TestBenchInboxJSON(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, testdb.Empty())
	stdout, stderr, code := runIdem(t, []string{"DATABASE_URL=" + db.URL}, "bench", "inbox", "--json", "--records", "300", "--partitions", "2")
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
	if out.Scenario != "inbox" || len(out.Results) != 2 || out.Results[0].Name != "per-record" || out.Results[1].Name != "batch" {
		t.Fatalf("unexpected results: %+v", out)
	}
	for _, r := range out.Results {
		if r.Ops != 300 || r.OpsPerSec <= 0 || r.P50Ms <= 0 || r.P99Ms < r.P50Ms {
			t.Errorf("%s: %+v", r.Name, r)
		}
	}
	var left int
	if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'bench_inbox_%'`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d scratch schemas left behind", left)
	}
	_, stderr, code = runIdem(t, nil, "bench", "inbox", "--records", "0")
	if code != 2 {
		t.Errorf("--records 0: exit %d (%s), want 2", code, stderr)
	}
}
