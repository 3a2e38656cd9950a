package main

import (
	"encoding/json"
	"testing"

	"github.com/idemkit/idem/internal/testdb"
)

// TestBenchRelayPublishers: the relay scenario ends with the three
// publishers' variants, each having drained every event (the scenario
// fails when one is not PUBLISHED or, for NATS, not on the stream), and
// leaves no scratch schema behind.
func TestBenchRelayPublishers(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, testdb.Empty())
	stdout, stderr, code := runIdem(t, []string{"DATABASE_URL=" + db.URL, "NATS_URL="}, "bench", "relay", "--json",
		"--events", "200", "--aggregates", "20", "--batch-size", "100", "--latency-events", "20", "--rate", "200",
		"--publisher-events", "900")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var out struct {
		Results []benchResult `json:"results"`
	}
	if err := json.Unmarshal([]byte(stdout), &out); err != nil {
		t.Fatalf("stdout is not one JSON object: %v\n%s", err, stdout)
	}
	want := []string{"publisher-franz", "publisher-kafkago", "publisher-nats"}
	if len(out.Results) < len(want) {
		t.Fatalf("results %+v", out.Results)
	}
	tail := out.Results[len(out.Results)-len(want):]
	for i, r := range tail {
		if r.Name != want[i] || r.Ops != 900 || r.OpsPerSec <= 0 || r.P99Ms < r.P50Ms {
			t.Errorf("result %+v, want %s over 900 events", r, want[i])
		}
	}
	var left int
	if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'bench_relay_pub_%'`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d scratch schemas left behind", left)
	}
	if _, stderr, code := runIdem(t, nil, "bench", "relay", "--publisher-events", "-1"); code != 2 {
		t.Errorf("--publisher-events -1: exit %d (%s), want 2", code, stderr)
	}
}
