package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/testdb"
)

func TestKeysShowRelease(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	store := idempotency.NewPostgresStore(db.Pool)
	const route = "POST /orders/{id}/confirm"
	body := `{"note": "x"}`
	fp, err := idempotency.RequestFingerprint("POST", "/orders/7/confirm", "application/json", []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	done := idempotency.HashKey("alice", "POST", route, "k-done")
	res, err := store.Claim(ctx, idempotency.Claim{Key: done, Fingerprint: fp, Lease: time.Hour, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Complete(ctx, done, res.Fence, &idempotency.Response{Status: 200, Body: []byte(`{}`)}, time.Hour); err != nil {
		t.Fatal(err)
	}
	stuck := idempotency.HashKey("alice", "POST", route, "k-stuck")
	stuckRes, err := store.Claim(ctx, idempotency.Claim{Key: stuck, Fingerprint: fp, Lease: time.Hour, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	// k-taken: its first claim's lease ran out and a retry took it over.
	taken := idempotency.HashKey("alice", "POST", route, "k-taken")
	first, err := store.Claim(ctx, idempotency.Claim{Key: taken, Fingerprint: fp, Lease: time.Millisecond, Retention: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		r, err := store.Claim(ctx, idempotency.Claim{Key: taken, Fingerprint: fp, Lease: time.Hour, Retention: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		if r.Outcome == idempotency.OutcomeTookOver {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no takeover: %v", r.Outcome)
		}
	}
	fence := func(n int64) []string { return []string{"--fence", strconv.FormatInt(n, 10)} }
	audit := []string{"--actor", "ops-test", "--reason", "stuck after deploy"}
	env := []string{"DATABASE_URL=" + db.URL}
	parts := func(key string, more ...string) []string {
		return append([]string{"--principal", "alice", "--route", route, "--key", key}, more...)
	}

	stdout, stderr, code := runIdem(t, env, append([]string{"keys", "show", "--json"}, parts("k-done", "--path", "/orders/7/confirm", "--body", `{"note":"x"}`)...)...)
	if code != 0 {
		t.Fatalf("show: exit %d %s", code, stderr)
	}
	var v struct {
		State          string `json:"state"`
		InProgress     bool   `json:"in_progress"`
		ResponseStatus int    `json:"response_status"`
		BodyMatches    *bool  `json:"body_matches"`
		ExpiresAt      string `json:"expires_at"`
	}
	if err := json.Unmarshal([]byte(stdout), &v); err != nil {
		t.Fatalf("%v: %s", err, stdout)
	}
	if v.State != "completed" || v.InProgress || v.ResponseStatus != 200 || v.BodyMatches == nil || !*v.BodyMatches || v.ExpiresAt == "" {
		t.Errorf("show: %s", stdout)
	}
	f := filepath.Join(t.TempDir(), "body.json")
	if err := os.WriteFile(f, []byte(`{"note":"y"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	stdout, _, code = runIdem(t, env, append([]string{"keys", "show"}, parts("k-done", "--path", "/orders/7/confirm", "--body", "@"+f)...)...)
	if code != 0 || !strings.Contains(stdout, "differs") || !strings.Contains(stdout, "response status  200") {
		t.Errorf("show with another body (exit %d):\n%s", code, stdout)
	}
	stdout, _, code = runIdem(t, env, append([]string{"keys", "show"}, parts("k-stuck")...)...)
	if code != 0 || !strings.Contains(stdout, "state         claimed") || !strings.Contains(stdout, "in progress   true") {
		t.Errorf("show stuck (exit %d):\n%s", code, stdout)
	}

	testCases := []struct {
		args     []string
		wantCode int
		wantErr  string
	}{
		{[]string{"keys"}, 2, "missing action"},
		{[]string{"keys", "drop"}, 2, "unknown action"},
		{[]string{"keys", "show", "--principal", "alice", "--key", "k"}, 2, "--route is required"},
		{[]string{"keys", "show", "--route", "/x", "--key", "k"}, 2, "--principal is required"},
		{append([]string{"keys", "show"}, parts("k-done", "--body", "{}")...), 2, "--path is required"},
		{append([]string{"keys", "show"}, parts("k-done", "--body", "@/nonexistent/file")...), 2, "--body"},
		{append([]string{"keys", "show"}, parts("k-done", "--path", "nopath", "--body", "{}")...), 2, "does not start with /"},
		{append([]string{"keys", "show"}, parts("k-none")...), 1, "key not found"},
		{[]string{"keys", "show", "--principal", "bob", "--route", route, "--key", "k-done"}, 1, "key not found"},
		{append([]string{"keys", "release"}, parts("k-done", append(fence(res.Fence), audit...)...)...), 1, "it is completed (--forget deletes it)"},
		{append([]string{"keys", "release"}, parts("k-none", append(fence(1), audit...)...)...), 1, "key not found"},
		{append([]string{"keys", "release"}, parts("k-done", "extra")...), 2, "unexpected argument"},
		{append([]string{"keys", "release"}, parts("k-stuck", audit...)...), 2, "--fence is required"},
		{append([]string{"keys", "release"}, parts("k-stuck", append(fence(stuckRes.Fence), "--actor", "x")...)...), 2, "--reason is required"},
		{append([]string{"keys", "release"}, parts("k-stuck", append(fence(stuckRes.Fence), audit...)...)...), 1, "lease is live"},
		{append([]string{"keys", "release", "--force"}, parts("k-taken", append(fence(first.Fence), audit...)...)...), 1, "not the one shown"},
		{append([]string{"keys", "release", "--forget", "--force"}, parts("k-taken", append(fence(first.Fence), audit...)...)...), 1, "not the one shown"},
	}
	for _, tt := range testCases {
		_, stderr, code := runIdem(t, env, tt.args...)
		if code != tt.wantCode || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, tt.wantErr) {
			t.Errorf("%v: exit %d (want %d), stderr %q (want one line with %q)", tt.args, code, tt.wantCode, stderr, tt.wantErr)
		}
	}

	if rec, err := store.Inspect(ctx, taken); err != nil || rec.Fence == first.Fence || !rec.InProgress {
		t.Fatalf("the retry's claim after the refused releases: %+v %v", rec, err)
	}
	stdout, stderr, code = runIdem(t, env, append([]string{"keys", "release", "--force", "--reason", "handler gone"}, parts("k-stuck", fence(stuckRes.Fence)...)...)...)
	if code != 0 || !strings.HasPrefix(stdout, "released the claim of fence ") || !strings.Contains(stderr, "warning: no --actor given") || !strings.Contains(stderr, "action=keys.release") {
		t.Fatalf("release: exit %d %q %q", code, stdout, stderr)
	}
	if r, err := store.Claim(ctx, idempotency.Claim{Key: stuck, Fingerprint: fp, Lease: time.Hour, Retention: time.Hour}); err != nil || r.Outcome != idempotency.OutcomeClaimed {
		t.Errorf("claim after release: %v %v", r.Outcome, err)
	}
	if _, stderr, code := runIdem(t, env, append([]string{"keys", "release", "--forget"}, parts("k-done", append(fence(res.Fence), audit...)...)...)...); code != 0 {
		t.Fatalf("forget: exit %d %s", code, stderr)
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM idem_admin_audit WHERE (action = 'keys.forget' AND actor = 'ops-test' AND reason = 'stuck after deploy')
		OR (action = 'keys.release' AND reason = 'handler gone' AND actor <> '')`).Scan(&n); err != nil || n != 2 {
		t.Errorf("audit rows: %d %v", n, err)
	}
	if _, err := store.Inspect(ctx, done); err != idempotency.ErrKeyNotFound {
		t.Errorf("after forget: %v", err)
	}
	if stdout, _, code := runIdem(t, env, "keys", "--help"); code != 0 || !strings.Contains(stdout, "Usage: idem keys") {
		t.Errorf("help: %d %q", code, stdout)
	}
}
