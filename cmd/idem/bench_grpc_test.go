package main

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
	"testing"

	"github.com/idemkit/idem/internal/testdb"
)

// TestBenchGRPC runs `idem bench grpc` briefly against the test server and
// checks the contract: the three result names in order, every variant
// measured, grpc-tx's ratio over grpc-plain reported, and on the log each
// variant's CPU per op with no pool acquire waiting for a connection (the
// pool has one per client). No speed is checked.
func TestBenchGRPC(t *testing.T) {
	t.Parallel()
	sc := benchScenarios["grpc"]
	if sc == nil {
		t.Fatal("bench scenario grpc not registered")
	}
	seconds, clients, rounds := 1, 4, 1
	var log bytes.Buffer
	env := &benchEnv{DatabaseURL: testdb.URL(), Log: &log, Ints: map[string]*int{
		"seconds": &seconds, "clients": &clients, "rounds": &rounds,
	}}
	results, err := sc.Run(context.Background(), env)
	if err != nil {
		t.Fatalf("bench grpc: %v", err)
	}
	var out bytes.Buffer
	if err := printBench(&out, "grpc", results, benchMemory{}, true); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Scenario string `json:"scenario"`
		Results  []struct {
			Name      string  `json:"name"`
			OpsPerSec float64 `json:"ops_per_sec"`
			P50Ms     float64 `json:"p50_ms"`
			P99Ms     float64 `json:"p99_ms"`
			Ratio     float64 `json:"ratio"`
		} `json:"results"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("--json output %q: %v", out.String(), err)
	}
	want := []string{"grpc-plain", "grpc-tx", "grpc-replay"}
	if got.Scenario != "grpc" || len(got.Results) != len(want) {
		t.Fatalf("output %s", out.String())
	}
	for i, r := range got.Results {
		if r.Name != want[i] || r.OpsPerSec <= 0 || r.P50Ms <= 0 || r.P99Ms < r.P50Ms {
			t.Fatalf("result %d = %+v, want %s measured", i, r, want[i])
		}
	}
	if got.Results[1].Ratio <= 0 {
		t.Fatalf("grpc-tx has no ratio: %s", out.String())
	}
	for _, name := range want {
		re := regexp.MustCompile(`(?m)^grpc: ` + name + `: CPU per op [0-9]+ µs in this process \(server and clients\), [0-9]+ µs in the pool's 4 PostgreSQL backends; 0 of [0-9]+ pool acquires waited for a connection$`)
		if !re.MatchString(log.String()) {
			t.Errorf("no CPU line for %s with 4 backends and no waits; log:\n%s", name, log.String())
		}
	}
}
