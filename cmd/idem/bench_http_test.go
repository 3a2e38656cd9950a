package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"testing"

	"github.com/idemkit/idem/internal/testdb"
)

// TestBenchHTTP runs `idem bench http --json` briefly against the test
// server and checks the contract: one JSON object, the five result names in
// order, every variant measured. It checks no speed: figures are for the
// benchmark run, not for tests.
func TestBenchHTTP(t *testing.T) {
	t.Parallel()
	sc := benchScenarios["http"]
	if sc == nil {
		t.Fatal("bench scenario http not registered")
	}
	seconds, clients, rounds := 1, 4, 1
	env := &benchEnv{DatabaseURL: testdb.URL(), Log: io.Discard, Ints: map[string]*int{
		"seconds": &seconds, "clients": &clients, "rounds": &rounds,
	}}
	results, err := sc.Run(context.Background(), env)
	if err != nil {
		t.Fatalf("bench http: %v", err)
	}
	var out bytes.Buffer
	if err := printBench(&out, "http", results, true); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Scenario string `json:"scenario"`
		Results  []struct {
			Name      string  `json:"name"`
			OpsPerSec float64 `json:"ops_per_sec"`
			P50Ms     float64 `json:"p50_ms"`
			P99Ms     float64 `json:"p99_ms"`
		} `json:"results"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("--json output %q: %v", out.String(), err)
	}
	want := []string{"sql-two-step", "two-step", "transactional", "replay", "two-step-traced"}
	if got.Scenario != "http" || len(got.Results) != len(want) {
		t.Fatalf("output %s", out.String())
	}
	for i, r := range got.Results {
		if r.Name != want[i] || r.OpsPerSec <= 0 || r.P50Ms <= 0 || r.P99Ms < r.P50Ms {
			t.Fatalf("result %d = %+v, want %s measured", i, r, want[i])
		}
	}
}
