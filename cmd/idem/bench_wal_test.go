package main

import (
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/pgtemp"
	"github.com/idemkit/idem/internal/testdb"
)

// TestBenchWALJSON runs the alias small and checks the contract: one JSON
// object with the WAL outbox's results of bench enqueue and bench relay
// and their baselines, in order, every event counted, wal's ratio to
// wal-floor, and nothing left behind (scratch schemas, slots,
// publications).
func TestBenchWALJSON(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, testdb.Empty())
	stdout, stderr, code := runIdem(t, []string{"DATABASE_URL=" + db.URL}, "bench", "wal", "--json",
		"--clients", "2", "--seconds", "1", "--rounds", "1", "--events", "1500", "--batch-size", "200", "--latency-events", "100", "--rate", "200")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var out struct {
		Scenario string        `json:"scenario"`
		Results  []benchResult `json:"results"`
	}
	if err := json.Unmarshal([]byte(stdout), &out); err != nil {
		t.Fatalf("stdout is not one JSON object: %v\n%s", err, stdout)
	}
	want := []struct {
		name string
		ops  int // 0: any positive count (the enqueue variants run for a time)
	}{{"plain", 0}, {"enqueue-1", 0}, {"enqueue-10", 0}, {"wal-1", 0}, {"wal-10", 0}, {"sql-enqueue-1", 0},
		{"wal-floor", 1500}, {"wal", 1500}, {"at-least-once", 1500}, {"wal-latency", 100}}
	if out.Scenario != "wal" || len(out.Results) != len(want) {
		t.Fatalf("unexpected results: %+v", out)
	}
	for i, r := range out.Results {
		if r.Name != want[i].name || r.Ops <= 0 || (want[i].ops > 0 && r.Ops != want[i].ops) || r.OpsPerSec <= 0 || r.P99Ms < r.P50Ms {
			t.Errorf("result %d: %+v, want name %s and %d ops", i, r, want[i].name, want[i].ops)
		}
	}
	if r := out.Results[7].OpsPerSec / out.Results[6].OpsPerSec; out.Results[7].Ratio < r*0.999 || out.Results[7].Ratio > r*1.001 {
		t.Errorf("wal ratio %v, want wal / wal-floor = %v", out.Results[7].Ratio, r)
	}
	if out.Results[3].Ratio <= 0 || out.Results[0].Ratio != 1 {
		t.Errorf("enqueue ratios: %+v", out.Results[:5])
	}
	benchWALLeftBehind(t, db, stderr)
	for _, args := range [][]string{{"--events", "0"}, {"--batch-size", "200000"}, {"--clients", "0"}} {
		if _, stderr, code := runIdem(t, nil, append([]string{"bench", "wal"}, args...)...); code != 2 {
			t.Errorf("%v: exit %d (%s), want 2", args, code, stderr)
		}
	}
}

// benchWALLeftBehind fails t when the run whose stderr is given left a
// slot or a publication behind (by the name it printed: other tests run
// WAL benchmarks at the same time).
func benchWALLeftBehind(t *testing.T, db *testdb.DB, stderr string) {
	t.Helper()
	m := regexp.MustCompile(`slots and publications (bench_wal_[0-9a-f]{12}_)`).FindStringSubmatch(stderr)
	if m == nil {
		t.Fatalf("no slot name on stderr:\n%s", stderr)
	}
	var slots, pubs int
	err := db.Pool.QueryRow(t.Context(), `SELECT
		(SELECT count(*) FROM pg_replication_slots WHERE starts_with(slot_name, $1)),
		(SELECT count(*) FROM pg_publication WHERE starts_with(pubname, $1))`, m[1]).Scan(&slots, &pubs)
	if err != nil {
		t.Fatal(err)
	}
	if slots+pubs != 0 {
		t.Errorf("left behind: %d slots, %d publications", slots, pubs)
	}
}

// TestBenchWALNotLogical: on a server without wal_level=logical (a stock
// install), bench relay and bench enqueue run their table results and skip
// the WAL ones with one line naming wal_level; an explicit --wal, and bench
// wal (nothing but WAL results), fail with one line naming wal_level and
// the way out, before measuring anything; --wal=false runs the rest
// without the line.
func TestBenchWALNotLogical(t *testing.T) {
	t.Parallel()
	cl, err := pgtemp.Start(t.Context(), &pgtemp.Config{Settings: []string{"wal_level=replica"}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cl.Close() }()
	env := []string{"DATABASE_URL=" + cl.URL}
	small := []string{"--seconds", "1", "--rounds", "1", "--clients", "2"}
	relay := []string{"--events", "100", "--aggregates", "10", "--batch-size", "50", "--retained", "0",
		"--blocked", "0", "--latency-events", "20", "--rate", "200", "--publisher-events", "0"}
	for _, args := range [][]string{
		append([]string{"bench", "enqueue", "--wal"}, small...),
		append([]string{"bench", "relay", "--wal=true"}, relay...),
		append([]string{"bench", "wal"}, small...),
	} {
		stdout, stderr, code := runIdem(t, env, args...)
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		last := lines[len(lines)-1]
		if code != 1 || stdout != "" || !strings.Contains(last, "wal_level=logical") ||
			!strings.Contains(last, "wal_level=replica") || !strings.Contains(last, "--wal=false") {
			t.Errorf("%v: exit %d, stdout %q, last stderr line %q: want exit 1 and one line naming wal_level", args, code, stdout, last)
		}
		if strings.Contains(stderr, "seeding") || strings.Contains(stderr, "draining") {
			t.Errorf("%v: measured before failing:\n%s", args, stderr)
		}
	}
	for _, tt := range []struct {
		args  []string
		table []string // result names the run must have
	}{
		{append([]string{"bench", "enqueue", "--json"}, small...), []string{"plain", "enqueue-1", "enqueue-10"}},
		{append([]string{"bench", "relay", "--json"}, relay...), []string{"sql-floor", "at-least-once", "two-phase", "notify-latency"}},
		{append([]string{"bench", "enqueue", "--json", "--wal=false"}, small...), []string{"plain", "enqueue-1"}},
		{append([]string{"bench", "relay", "--json", "--wal=false"}, relay...), []string{"sql-floor", "at-least-once"}},
	} {
		stdout, stderr, code := runIdem(t, env, tt.args...)
		if code != 0 {
			t.Errorf("%v: exit %d: %s", tt.args, code, stderr)
			continue
		}
		var out struct {
			Results []struct{ Name string }
		}
		if err := json.Unmarshal([]byte(stdout), &out); err != nil {
			t.Errorf("%v: stdout is not one JSON object: %v: %q", tt.args, err, stdout)
			continue
		}
		names := map[string]bool{}
		for _, r := range out.Results {
			names[r.Name] = true
			if strings.HasPrefix(r.Name, "wal") {
				t.Errorf("%v: WAL result %s on a replica-level server", tt.args, r.Name)
			}
		}
		for _, n := range tt.table {
			if !names[n] {
				t.Errorf("%v: no %s result: %s", tt.args, n, stdout)
			}
		}
		skipped := 0
		for _, l := range strings.Split(stderr, "\n") {
			if strings.Contains(l, "skipped") && strings.Contains(l, "wal_level=logical") && strings.Contains(l, "wal_level=replica") {
				skipped++
			}
		}
		want := 1
		if slices.Contains(tt.args, "--wal=false") {
			want = 0
		}
		if skipped != want {
			t.Errorf("%v: %d lines saying the WAL results were skipped, want %d:\n%s", tt.args, skipped, want, stderr)
		}
	}
}
