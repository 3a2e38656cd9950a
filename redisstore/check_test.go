package redisstore_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/redisstore"
)

// recordingLogger appends every record's message and attributes to out.
func recordingLogger(out *[]string) *slog.Logger {
	return slog.New(&recorder{out: out, mu: &sync.Mutex{}})
}

type recorder struct {
	out *[]string
	mu  *sync.Mutex
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	var b strings.Builder
	b.WriteString(rec.Level.String() + " " + rec.Message)
	rec.Attrs(func(a slog.Attr) bool { b.WriteString(" " + a.String()); return true })
	r.mu.Lock()
	*r.out = append(*r.out, b.String())
	r.mu.Unlock()
	return nil
}
func (r *recorder) WithAttrs(as []slog.Attr) slog.Handler { return r }
func (r *recorder) WithGroup(string) slog.Handler         { return r }

func settings(ws []redisstore.Warning) map[string]string {
	m := map[string]string{}
	for _, w := range ws {
		m[w.Setting] = w.Value
	}
	return m
}

// TestCheckServerShared: the shared server runs without persistence, and
// the check says so, through the logger too.
func TestCheckServerShared(t *testing.T) {
	t.Parallel()
	var logged []string
	su := newSetup(t, &redisstore.Config{Logger: recordingLogger(&logged)})
	ws, err := su.store.CheckServer(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := settings(ws)["appendonly"]; !ok || v != "no" {
		t.Fatalf("CheckServer on a server without persistence: %v, want an appendonly warning", ws)
	}
	if len(logged) != len(ws) || !strings.Contains(logged[0], "WARN") || !strings.Contains(logged[0], "appendonly") {
		t.Fatalf("logged %q for %v", logged, ws)
	}
}

// TestCheckServerSettings: each setting that voids the guarantee is
// named, on a server of the test's own whose settings the test changes;
// the good ones give no warning.
func TestCheckServerSettings(t *testing.T) {
	t.Parallel()
	srv := startOwnServer(t, "--appendonly", "yes", "--appendfsync", "everysec", "--maxmemory-policy", "noeviction")
	c := newClient(t, srv.addr())
	s, err := redisstore.New(c, &redisstore.Config{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	testCases := []struct {
		name string
		set  []string // CONFIG SET name value, ...
		want map[string]string
	}{
		{"everysec and noeviction", nil, map[string]string{}},
		{"appendfsync always", []string{"appendfsync", "always"}, map[string]string{}},
		{"appendfsync no", []string{"appendfsync", "no"}, map[string]string{"appendfsync": "no"}},
		{"volatile-lru", []string{"appendfsync", "always", "maxmemory-policy", "volatile-lru"}, map[string]string{"maxmemory-policy": "volatile-lru"}},
		{"allkeys-lru", []string{"maxmemory-policy", "allkeys-lru"}, map[string]string{"maxmemory-policy": "allkeys-lru"}},
		{"snapshots only", []string{"maxmemory-policy", "noeviction", "appendonly", "no", "save", "900 1"}, map[string]string{"appendonly": "no"}},
		{"nothing persisted", []string{"save", ""}, map[string]string{"appendonly": "no"}},
	}
	for _, tt := range testCases { // in order: each changes the server
		for i := 0; i < len(tt.set); i += 2 {
			if err := c.ConfigSet(ctx, tt.set[i], tt.set[i+1]).Err(); err != nil {
				t.Fatalf("%s: CONFIG SET %s %q: %v", tt.name, tt.set[i], tt.set[i+1], err)
			}
		}
		ws, err := s.CheckServer(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := settings(ws)
		if len(got) != len(tt.want) {
			t.Fatalf("%s: warnings %v, want %v", tt.name, ws, tt.want)
		}
		for k, v := range tt.want {
			if got[k] != v {
				t.Fatalf("%s: warnings %v, want %v", tt.name, ws, tt.want)
			}
		}
	}
}

// TestCheckServerConfigDisabled: a server where CONFIG is renamed away
// (as managed services do) cannot be checked, and the check says that
// instead of failing or saying nothing.
func TestCheckServerConfigDisabled(t *testing.T) {
	t.Parallel()
	srv := startOwnServer(t, "--rename-command", "CONFIG", "")
	c := newClient(t, srv.addr())
	var logged []string
	s, err := redisstore.New(c, &redisstore.Config{Logger: recordingLogger(&logged)})
	if err != nil {
		t.Fatal(err)
	}
	ws, err := s.CheckServer(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != 1 || ws[0].Setting != "CONFIG" || !strings.Contains(ws[0].Why, "cannot check") || len(logged) != 1 {
		t.Fatalf("CheckServer without CONFIG: %v (logged %q), want one 'cannot check' warning", ws, logged)
	}
	// The store works all the same.
	mustClaim(t, s, claimOf(key(t), "a", time.Hour, time.Hour), idempotency.OutcomeClaimed)
}
