package main

import (
	"net/http"
	"strings"
	"syscall"
	"testing"

	"github.com/idemkit/idem/examples/billing/adapters/in/httpapi"
	"github.com/idemkit/idem/internal/testdb"
)

// Long secrets for a listener that is not loopback.
const (
	longAlice = "alice-0123456789abcdef"
	longBob   = "bob-0123456789abcdef"
)

// TestServeRefusesUnsafeTokens: on an address that is not loopback,
// billing serve refuses to start with the demo tokens (BILLING_API_TOKENS
// unset) and with a short secret, before it migrates anything; one secret
// given twice is a usage error anywhere. (On main it started with the
// demo tokens on every interface and logged nothing, and "same:alice,
// same:bob" authenticated as bob.)
func TestServeRefusesUnsafeTokens(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, testdb.Empty())
	base := []string{"DATABASE_URL=" + db.URL, "KAFKA_BROKERS=127.0.0.1:1", "PAYMENT_URL=http://127.0.0.1:1"}
	for _, tt := range []struct {
		name string
		env  []string
		code int
		want string
	}{
		{"demo tokens on every interface", []string{"HTTP_ADDR=:0", "BILLING_API_TOKENS="}, 1, "public demo token"},
		{"demo tokens on 0.0.0.0", []string{"HTTP_ADDR=0.0.0.0:0", "BILLING_API_TOKENS=alice-token:alice"}, 1, "public demo token"},
		{"short secret on every interface", []string{"HTTP_ADDR=:0", "BILLING_API_TOKENS=" + longAlice + ":alice,short:bob"}, 1, `principal "bob" has a token of 5 bytes`},
		{"short metrics token on every interface", []string{"HTTP_ADDR=:0", "BILLING_API_TOKENS=" + longAlice + ":alice", "BILLING_METRICS_TOKEN=x"}, 1, "BILLING_METRICS_TOKEN is 1 bytes"},
		{"short metrics token on a public admin listener", []string{"HTTP_ADDR=127.0.0.1:0", "ADMIN_ADDR=:0", "BILLING_METRICS_TOKEN=scrape-me"}, 1, "BILLING_METRICS_TOKEN is 9 bytes"},
		{"one secret twice", []string{"HTTP_ADDR=127.0.0.1:0", "BILLING_API_TOKENS=same-secret-0123456789:alice,same-secret-0123456789:bob"}, 2, "given twice"},
	} {
		_, stderr, code := runBilling(t, append(base, tt.env...), "serve")
		if code != tt.code || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, tt.want) {
			t.Errorf("%s: exit %d, stderr %q; want %d and one line with %q", tt.name, code, stderr, tt.code, tt.want)
		}
		if strings.Contains(stderr, "same-secret") || strings.Contains(stderr, "alice-token") || strings.Contains(stderr, "short") || strings.Contains(stderr, "scrape-me") {
			t.Errorf("%s: stderr shows a secret: %q", tt.name, stderr)
		}
	}
	var n int
	if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d tables (%v): a refused start migrated", n, err)
	}
}

// TestServeOnLoopbackWarnsAboutDemoTokens: with BILLING_API_TOKENS unset on
// loopback, billing serve starts with the demo tokens and says so loudly.
func TestServeOnLoopbackWarnsAboutDemoTokens(t *testing.T) {
	t.Parallel()
	s := newStack(t, nil)
	var env []string
	for _, e := range s.env {
		if !strings.HasPrefix(e, "BILLING_API_TOKENS=") {
			env = append(env, e)
		}
	}
	p := startServe(t, append(env, "BILLING_API_TOKENS="))
	if r := newClient(p.Addr, "alice-token").must(t, "GET", "/orders/ord_nope", "", ""); r.Status != http.StatusNotFound {
		t.Errorf("demo token on loopback: %d %s", r.Status, r.Body)
	}
	p.signal(syscall.SIGTERM)
	if code := p.wait(); code != 0 {
		t.Fatalf("exit %d; stderr:\n%s", code, p.stderr.String())
	}
	if got := strings.Count(p.stderr.String(), "INSECURE TOKENS"); got != 2 {
		t.Fatalf("%d INSECURE TOKENS warnings, want one per demo principal; stderr:\n%s", got, p.stderr.String())
	}
}

// TestMetricsAccessOnServe: on a listener that is not loopback, GET
// /metrics is refused without BILLING_METRICS_TOKEN and served with it
// (on main it was anonymous everywhere); with ADMIN_ADDR it moves to the
// admin listener (anonymous there on loopback) and leaves the API.
func TestMetricsAccessOnServe(t *testing.T) {
	t.Parallel()
	s := newStack(t, nil)
	env := append(s.env, "BILLING_API_TOKENS="+longAlice+":alice,"+longBob+":bob")

	public := startServe(t, append(env, "HTTP_ADDR=0.0.0.0:0", "BILLING_METRICS_TOKEN=metrics-0123456789abcdef"))
	for _, tt := range []struct {
		token string
		want  int
	}{{"", 401}, {longAlice, 401}, {"metrics-0123456789abcdef", 200}} {
		if r := newClient(public.Addr, tt.token).must(t, "GET", "/metrics", "", ""); r.Status != tt.want {
			t.Errorf("public /metrics with %q: %d, want %d", tt.token, r.Status, tt.want)
		}
	}
	if r := newClient(public.Addr, longAlice).must(t, "GET", "/orders/ord_nope", "", ""); r.Status != http.StatusNotFound {
		t.Errorf("public API with a long token: %d %s", r.Status, r.Body)
	}
	public.signal(syscall.SIGTERM)

	admin := startServe(t, append(env, "ADMIN_ADDR=127.0.0.1:0"))
	if admin.AdminAddr == "" {
		t.Fatalf("no admin address printed; stderr:\n%s", admin.stderr.String())
	}
	for _, tt := range []struct {
		addr, path string
		want       int
	}{
		{admin.AdminAddr, "/metrics", 200},
		{admin.AdminAddr, "/readyz", 200},
		{admin.AdminAddr, "/healthz", 200},
		{admin.AdminAddr, "/orders", 404},
		{admin.Addr, "/metrics", 404},
	} {
		r := newClient(tt.addr, "").must(t, "GET", tt.path, "", "")
		if r.Status != tt.want {
			t.Errorf("GET %s%s: %d, want %d", tt.addr, tt.path, r.Status, tt.want)
		}
		if tt.path == "/metrics" && r.Status == 200 && !strings.Contains(string(r.Body), "billing_http_requests_total") {
			t.Errorf("admin /metrics lacks the request counter")
		}
	}
	admin.signal(syscall.SIGTERM)
	if code := public.wait(); code != 0 {
		t.Errorf("public instance exit %d; stderr:\n%s", code, public.stderr.String())
	}
	if code := admin.wait(); code != 0 {
		t.Errorf("admin instance exit %d; stderr:\n%s", code, admin.stderr.String())
	}
}

// TestServeLimitsAreConfigurable: every HTTP limit is read from the
// environment and checked; a bad value is a one-line usage error, and
// --help lists them all.
func TestServeLimitsAreConfigurable(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		env  string
		want string
	}{
		{"HTTP_READ_TIMEOUT=soon", "HTTP_READ_TIMEOUT"},
		{"HTTP_READ_HEADER_TIMEOUT=-1s", "HTTP_READ_HEADER_TIMEOUT"},
		{"HTTP_WRITE_TIMEOUT=1s", "WriteTimeout"},
		{"HTTP_IDLE_TIMEOUT=0", "HTTP_IDLE_TIMEOUT"},
		{"HTTP_MAX_CONNS=0", "HTTP_MAX_CONNS"},
		{"HTTP_MAX_HEADER_BYTES=12", "MaxHeaderBytes"},
		{"METRICS_REFRESH_INTERVAL=never", "METRICS_REFRESH_INTERVAL"},
	} {
		_, stderr, code := runBilling(t, []string{tt.env, "KAFKA_BROKERS=127.0.0.1:1"}, "serve")
		if code != 2 || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, tt.want) {
			t.Errorf("%s: exit %d, stderr %q; want 2 and one line naming %s", tt.env, code, stderr, tt.want)
		}
	}
	stdout, _, _ := runBilling(t, nil, "serve", "--help")
	for _, want := range []string{"HTTP_READ_HEADER_TIMEOUT", "HTTP_READ_TIMEOUT", "HTTP_WRITE_TIMEOUT", "HTTP_IDLE_TIMEOUT",
		"HTTP_MAX_HEADER_BYTES", "HTTP_MAX_CONNS", "ADMIN_ADDR", "BILLING_METRICS_TOKEN", "METRICS_REFRESH_INTERVAL",
		"16 bytes"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("--help lacks %s", want)
		}
	}
	if httpapi.MinTokenLength != 16 {
		t.Errorf("--help says 16 bytes, MinTokenLength is %d", httpapi.MinTokenLength)
	}
}

// TestServeNeverPrintsTheDatabasePassword: an unreachable or malformed
// DATABASE_URL with a password in any form is named in billing serve's and
// billing chaos's error line without it.
func TestServeNeverPrintsTheDatabasePassword(t *testing.T) {
	t.Parallel()
	const secret = "pw-hunter2"
	for _, u := range []string{
		"postgres://postgres:" + secret + "@127.0.0.1:1/x?connect_timeout=2",
		"postgres://postgres@127.0.0.1:1/x?connect_timeout=2&password=" + secret,
		"host=127.0.0.1 port=1 password=" + secret + " connect_timeout=2",
		"postgres://postgres:" + secret + "@127.0.0.1:port/x",
	} {
		stdout, stderr, code := runBilling(t, []string{"DATABASE_URL=" + u, "KAFKA_BROKERS=127.0.0.1:1", "PAYMENT_URL=http://127.0.0.1:1"}, "serve")
		if code == 0 || strings.Contains(stdout+stderr, secret) || !strings.Contains(stderr, "database") {
			t.Errorf("serve, DATABASE_URL=%q: exit %d, output %q %q", u, code, stdout, stderr)
		}
		// billing chaos checks the database first (IDEM_BIN is never run).
		stdout, stderr, code = runBilling(t, []string{"DATABASE_URL=" + u, "IDEM_BIN=/bin/true"}, "chaos", "--orders", "1", "--payments", "0")
		if code == 0 || strings.Contains(stdout+stderr, secret) || !strings.Contains(stderr, "DATABASE_URL") {
			t.Errorf("chaos, DATABASE_URL=%q: exit %d, output %q %q", u, code, stdout, stderr)
		}
	}
}
