package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/testdb"
)

// TestBenchHTTP runs `idem bench http --json` briefly against the test
// server and checks the contract: one JSON object, the result names in// order, every variant measured. It checks no speed: figures are for the
// benchmark run, not for tests.
func TestBenchHTTP(t *testing.T) {
	t.Parallel()
	benchHTTP(t, "postgres", false, []string{"sql-two-step", "two-step", "transactional", "sql-transactional", "replay", "two-step-traced", "gin-tx", "echo-tx", "fiber-tx", "fiber-own"})
}

// TestBenchHTTPFiber: --fiber adds the http-vs-fiber comparison's results
// in the same run and logs its two ratio lines (and the cache-off one).
func TestBenchHTTPFiber(t *testing.T) {
	t.Parallel()
	log := benchHTTP(t, "postgres", true, []string{"sql-two-step", "two-step", "transactional", "sql-transactional", "replay", "two-step-traced",
		"gin-tx", "echo-tx", "fiber-tx", "fiber-own", "plain", "fiber-plain", "fiber-pg", "fiber-pg-replay", "fiber-tx-replay", "postgres-replay"})
	for _, want := range []string{
		"http: fresh vs fiber: (transactional/plain) / (fiber-pg/fiber-plain) = ",
		"http: replay vs fiber: (replay/plain) / (fiber-pg-replay/fiber-plain) = ",
		"http: on Fiber's stack: fiber-tx/fiber-pg = ",
		"http: replay (cache off) vs fiber: (postgres-replay/plain) / (fiber-pg-replay/fiber-plain) = ",
	} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
}

// TestBenchHTTPRedis: --store with a redis:// URL adds redis-two-step and
// redis-replay, measured in the same run.
func TestBenchHTTPRedis(t *testing.T) {
	t.Parallel()
	benchHTTP(t, redisTestURL(t), false, []string{"sql-two-step", "two-step", "transactional", "sql-transactional", "replay", "two-step-traced", "redis-two-step", "postgres-replay", "redis-replay", "gin-tx", "echo-tx", "fiber-tx", "fiber-own"})
}

func TestBenchHTTPBadStore(t *testing.T) {
	t.Parallel()
	for store, want := range map[string]struct {
		code int
		text string
	}{
		"memory": {2, "--store"}, "mongodb://h/db": {2, "--store"}, "redis://127.0.0.1:6379/zero": {2, "invalid Redis URL"},
		"redis://127.0.0.1:1/0?dial_timeout=1s": {1, "unreachable"},
	} {
		// Refused before PostgreSQL is touched: the database URL leads
		// nowhere.
		_, stderr, code := runIdem(t, nil, "bench", "http", "--store", store, "--seconds", "1", "--rounds", "1",
			"--database-url", "postgres://postgres@127.0.0.1:1/x?connect_timeout=1")
		if code != want.code || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, want.text) {
			t.Errorf("--store %s: exit %d, stderr %q; want %d and one line with %q", store, code, stderr, want.code, want.text)
		}
	}
}

// benchHTTP runs bench http briefly, checks its results are want, all
// measured, and returns its log.
func benchHTTP(t *testing.T, store string, fiber bool, want []string) string {
	t.Helper()
	sc := benchScenarios["http"]
	if sc == nil {
		t.Fatal("bench scenario http not registered")
	}
	seconds, clients, rounds := 1, 4, 1
	var log syncBuffer // the Redis store's logger writes from its own goroutines
	env := &benchEnv{DatabaseURL: testdb.URL(), Log: &log, Ints: map[string]*int{
		"seconds": &seconds, "clients": &clients, "rounds": &rounds,
	}, Strings: map[string]*string{"store": &store}, Bools: map[string]*bool{"fiber": &fiber}}
	objs, allocBytes := benchMemStart()
	results, err := sc.Run(context.Background(), env)
	if err != nil {
		t.Fatalf("bench http: %v", err)
	}
	ops := 0
	for _, r := range results {
		ops += r.Ops
	}
	mem := benchMemEnd(objs, allocBytes, ops)
	var out bytes.Buffer
	if err := printBench(&out, "http", results, mem, true); err != nil {
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
		Memory struct {
			PeakRSSBytes int64   `json:"peak_rss_bytes"`
			AllocsPerOp  float64 `json:"allocs_per_op"`
		} `json:"memory"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("--json output %q: %v", out.String(), err)
	}
	if got.Scenario != "http" || len(got.Results) != len(want) {
		t.Fatalf("output %s", out.String())
	}
	for i, r := range got.Results {
		if r.Name != want[i] || r.OpsPerSec <= 0 || r.P50Ms <= 0 || r.P99Ms < r.P50Ms {
			t.Fatalf("result %d = %+v, want %s measured", i, r, want[i])
		}
	}
	// The process's peak RSS (the test binary's here) and its allocations
	// per operation: a request allocates, whatever the store.
	if got.Memory.PeakRSSBytes < 1<<20 || got.Memory.AllocsPerOp < 1 {
		t.Fatalf("memory %+v, want a peak RSS and allocations per operation", got.Memory)
	}
	return log.String()
}
