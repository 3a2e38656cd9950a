package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/paysim"
)

const conformanceBody = `{"order_id":"o-1","customer_id":"c-1","amount_kopecks":1000}`

func bodyFile(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "charge.json")
	if err := os.WriteFile(p, []byte(conformanceBody), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// serveCounting serves app behind /charges (and /refunds, another route)
// and its execution count at /count, on a loopback server closed at the end
// of the test.
func serveCounting(t *testing.T, wrap func(http.Handler) http.Handler) string {
	t.Helper()
	var n atomic.Int64
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Fault") != "" {
			http.Error(w, "injected", http.StatusInternalServerError)
			return
		}
		id := n.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, id)
	})
	mux := http.NewServeMux()
	mux.Handle("POST /charges", wrap(app))
	mux.Handle("POST /refunds", wrap(app))
	mux.HandleFunc("GET /count", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "%d", n.Load()) })
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestConformanceCLIPasses runs the built binary against the idempotency
// middleware (memory store, 1s retention) with every optional input given:
// every check passes, exit status 0, and --json is one parseable report.
func TestConformanceCLIPasses(t *testing.T) {
	t.Parallel()
	mw, err := idempotency.New(idempotency.NewMemoryStore(), &idempotency.Config{
		Scope: func(r *http.Request) (string, error) {
			if a := r.Header.Get("Authorization"); a != "" {
				return a, nil
			}
			return "", errors.New("no credentials")
		},
		Retention: 2 * time.Second,
		Lease:     time.Second, // a lease may not outlive the retention
	})
	if err != nil {
		t.Fatal(err)
	}
	url := serveCounting(t, mw.Wrap)
	stdout, stderr, code := runIdem(t, nil, "conformance",
		"--url", url+"/charges", "--body", bodyFile(t),
		"--header", "Authorization: Bearer demo-alice",
		"--principal-b-header", "Authorization: Bearer demo-bob",
		"--fault-header", "X-Fault: 1",
		"--count-url", url+"/count",
		"--alt-url", url+"/refunds",
		"--ttl", "2s", "--json")
	if code != 0 || stderr != "" {
		t.Fatalf("exit %d, stderr %q\n%s", code, stderr, stdout)
	}
	var rep idemtest.Report
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("--json output is not a report: %v\n%s", err, stdout)
	}
	passed := map[string]bool{}
	for _, r := range rep.Results {
		// retry-after races for an in-progress answer; a fast server may
		// finish first and the check then skips, never fails.
		if r.Status == idemtest.Pass || (r.Name == idemtest.CheckRetryAfter && r.Status == idemtest.Skip) {
			passed[r.Name] = true
		} else {
			t.Errorf("%s: %s %s", r.Name, r.Status, r.Reason)
		}
	}
	if len(passed) != 12 {
		t.Fatalf("%d checks reported, want 12:\n%s", len(rep.Results), stdout)
	}
}

// TestConformanceCLIFieldsAndRoutes: the middleware with a fingerprint of
// the amount only and one route for all: the member-by-member variants
// and --alt-url catch both, exit status 1, and the evidence names the
// member whose change was replayed.
func TestConformanceCLIFieldsAndRoutes(t *testing.T) {
	t.Parallel()
	mw, err := idempotency.New(idempotency.NewMemoryStore(), &idempotency.Config{
		Scope:             func(r *http.Request) (string, error) { return r.Header.Get("Authorization"), nil },
		FingerprintFields: []string{"amount_kopecks"},
		Route:             func(*http.Request) string { return "/" },
	})
	if err != nil {
		t.Fatal(err)
	}
	url := serveCounting(t, mw.Wrap)
	stdout, stderr, code := runIdem(t, nil, "conformance", "-v",
		"--url", url+"/charges", "--body", bodyFile(t), "--count-url", url+"/count",
		"--header", "Authorization: Bearer demo-alice", "--alt-url", url+"/refunds")
	if code != 1 || !strings.Contains(stderr, "checks failed: mismatch, routes") {
		t.Fatalf("exit %d, stderr %q, want 1 naming mismatch and routes\n%s", code, stderr, stdout)
	}
	for _, want := range []string{"other body (customer_id changed) with the same key got 201", "the key is not scoped by route"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, stdout)
		}
	}
}

// TestConformanceCLIPaysim runs the binary against paysim with its ledger
// as the count: the table is printed and the run passes.
func TestConformanceCLIPaysim(t *testing.T) {
	t.Parallel()
	sim, err := paysim.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(sim)
	defer srv.Close()
	stdout, stderr, code := runIdem(t, nil, "conformance",
		"--url", srv.URL+"/charges", "--body", bodyFile(t),
		"--header", "Authorization: Bearer demo-alice",
		"--count-url", srv.URL+"/ledger")
	if code != 0 || stderr != "" {
		t.Fatalf("exit %d, stderr %q\n%s", code, stderr, stdout)
	}
	for _, want := range []string{"CHECK", "baseline", "PASS", "1 execution counted", "0 failed"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("table lacks %q:\n%s", want, stdout)
		}
	}
	if n := sim.Ledger().Len(); n == 0 {
		t.Fatal("no charge reached the ledger")
	}
}

// TestConformanceCLIFails runs the binary against a handler that ignores
// keys (charges every request): exit status 1, the failing checks in the
// table with their evidence, and a one-line summary on stderr.
func TestConformanceCLIFails(t *testing.T) {
	t.Parallel()
	url := serveCounting(t, func(h http.Handler) http.Handler { return h })
	stdout, stderr, code := runIdem(t, nil, "conformance",
		"--url", url+"/charges", "--body", bodyFile(t), "--count-url", url+"/count")
	if code != 1 {
		t.Fatalf("exit %d, want 1; stderr %q\n%s", code, stderr, stdout)
	}
	if strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "checks failed: missing-key, invalid-key, replay, mismatch, concurrency, quoted-key") {
		t.Errorf("stderr %q, want one line naming the failed checks", stderr)
	}
	for _, want := range []string{
		"replay (fail)", "repeat [key", // evidence of a failed check
		"no key got 201, want 400",
		"10 concurrent requests with one key: 10 execution(s) counted, want 1",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, stdout)
		}
	}
}

func TestConformanceCLIBadInput(t *testing.T) {
	t.Parallel()
	body := bodyFile(t)
	testCases := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"no url", []string{"--body", body}, "--url is required"},
		{"relative url", []string{"--url", "/charges"}, "not an absolute http(s) URL"},
		{"bad header", []string{"--url", "http://127.0.0.1:1/x", "--header", "NoColon"}, "want 'Name: value'"},
		{"missing body file", []string{"--url", "http://127.0.0.1:1/x", "--body", "/nonexistent/body.json"}, "--body:"},
		{"concurrency 1", []string{"--url", "http://127.0.0.1:1/x", "--concurrency", "1"}, "Concurrency 1"},
		{"unknown flag", []string{"--nope"}, "flag provided but not defined: -nope"},
		{"stray argument", []string{"--url", "http://127.0.0.1:1/x", "extra"}, `unexpected argument "extra"`},
	}
	for _, tt := range testCases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, stderr, code := runIdem(t, nil, append([]string{"conformance"}, tt.args...)...)
			if code != 2 || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, tt.wantErr) {
				t.Fatalf("exit %d stderr %q, want 2 and one line containing %q", code, stderr, tt.wantErr)
			}
		})
	}
}

// TestConformanceCLIUnreachable: a server that is not there fails the
// baseline (exit 1), it is not a usage error.
func TestConformanceCLIUnreachable(t *testing.T) {
	t.Parallel()
	stdout, stderr, code := runIdem(t, nil, "conformance", "--url", "http://127.0.0.1:1/charges", "--body", bodyFile(t))
	if code != 1 || !strings.Contains(stdout, "baseline") || !strings.Contains(stdout, "connection refused") {
		t.Fatalf("exit %d, stderr %q\n%s", code, stderr, stdout)
	}
}

func TestConformanceCLIHelp(t *testing.T) {
	t.Parallel()
	stdout, stderr, code := runIdem(t, nil, "conformance", "--help")
	if code != 0 || stderr != "" || !strings.Contains(stdout, "Usage: idem conformance") || !strings.Contains(stdout, "-principal-b-header") || !strings.Contains(stdout, "-alt-url") {
		t.Fatalf("exit %d, stderr %q\n%s", code, stderr, stdout)
	}
}

// startPaysimProcess runs `idem paysim` on a random loopback port and
// returns its base URL; the process gets SIGTERM at the end of the test.
func startPaysimProcess(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(idemBin, append([]string{"paysim", "--addr", "127.0.0.1:0"}, args...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "paysim listening on "); ok {
				addr <- a
			}
		}
		close(addr)
	}()
	select {
	case a, ok := <-addr:
		if !ok {
			t.Fatal("idem paysim exited before listening")
		}
		return "http://" + a
	case <-time.After(30 * time.Second):
		t.Fatal("idem paysim did not print its address within 30s")
	}
	return ""
}

// TestConformanceCLIAgainstPaysimProcess: two real processes, idem
// conformance against idem paysim over loopback. With a latency that
// widens the in-progress window every check the run can judge passes;
// stating a 1s TTL to a simulator that keeps keys for 24h fails expiry,
// exit status 1.
func TestConformanceCLIAgainstPaysimProcess(t *testing.T) {
	t.Parallel()
	url := startPaysimProcess(t, "--latency", "200ms")
	args := []string{"conformance", "--url", url + "/charges", "--body", bodyFile(t),
		"--header", "Authorization: Bearer demo-alice", "--count-url", url + "/ledger", "--json"}
	stdout, stderr, code := runIdem(t, nil, args...)
	if code != 0 || stderr != "" {
		t.Fatalf("exit %d, stderr %q\n%s", code, stderr, stdout)
	}
	var rep idemtest.Report
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatal(err)
	}
	if got := rep.Names(idemtest.Pass); len(got) != 8 {
		t.Fatalf("passed %v, want 8 (all but principals, server-error-released, expiry, routes)\n%s", got, stdout)
	}

	stdout, stderr, code = runIdem(t, nil, append(args[:len(args)-1], "--ttl", "1s", "--settle", "500ms")...)
	if code != 1 || !strings.Contains(stderr, "1 of 12 checks failed: expiry") {
		t.Fatalf("exit %d, stderr %q, want 1 naming expiry\n%s", code, stderr, stdout)
	}
	if !strings.Contains(stdout, "still answers 409 IDEMPOTENCY_KEY_REUSED") {
		t.Fatalf("expiry evidence missing:\n%s", stdout)
	}
}
