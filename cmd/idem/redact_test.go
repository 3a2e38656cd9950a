package main

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/idempotency"
)

// TestPasswordsNeverPrinted runs the commands that take a database URL with
// a password in each of its forms (user-info, ?password=, ?sslpassword=,
// keyword/value) against an unreachable or malformed database: the error
// line names the database, never the password.
func TestPasswordsNeverPrinted(t *testing.T) {
	t.Parallel()
	const secret = "pw-hunter2"
	urls := []string{
		"postgres://postgres:" + secret + "@127.0.0.1:1/x?connect_timeout=2",
		"postgres://postgres@127.0.0.1:1/x?connect_timeout=2&password=" + secret,
		"postgres://postgres@127.0.0.1:1/x?connect_timeout=2&sslpassword=" + secret,
		"host=127.0.0.1 port=1 user=postgres password=" + secret + " connect_timeout=2",
		"postgres://postgres:" + secret + "@127.0.0.1:port/x", // malformed: url.Parse quotes it
	}
	commands := [][]string{{"migrate", "status"}, {"migrate", "up"}, {"outbox", "status"}}
	for _, u := range urls {
		for _, args := range commands {
			stdout, stderr, code := runIdem(t, []string{"DATABASE_URL=" + u}, args...)
			if code == 0 || strings.Contains(stdout+stderr, secret) {
				t.Errorf("DATABASE_URL=%q idem %v: exit %d, output %q %q", u, args, code, stdout, stderr)
			}
		}
		stdout, stderr, code := runIdem(t, nil, "migrate", "--database-url", u, "status")
		if code == 0 || strings.Contains(stdout+stderr, secret) {
			t.Errorf("--database-url %q: exit %d, output %q %q", u, code, stdout, stderr)
		}
	}
}

// TestConformanceReportHidesURLCredentials: --url and --count-url with
// credentials (user:password@ and ?token=) are checked as given, and neither
// the text nor the JSON report shows them.
func TestConformanceReportHidesURLCredentials(t *testing.T) {
	t.Parallel()
	mw, err := idempotency.New(idempotency.NewMemoryStore(), &idempotency.Config{
		Scope: func(r *http.Request) (string, error) {
			if a := r.Header.Get("Authorization"); a != "" {
				return a, nil
			}
			return "", errors.New("no credentials")
		},
		Retention: time.Second,
		Lease:     time.Second / 2, // a lease may not outlive the retention
	})
	if err != nil {
		t.Fatal(err)
	}
	base := serveCounting(t, mw.Wrap)
	withUser := strings.Replace(base, "http://", "http://user:pw-in-url@", 1)
	for _, asJSON := range []bool{false, true} {
		args := []string{"conformance", "--url", withUser + "/charges", "--body", bodyFile(t),
			"--header", "Authorization: Bearer demo-alice", "--count-url", withUser + "/count?token=tok-in-url", "-v"}
		if asJSON {
			args = append(args, "--json")
		}
		stdout, stderr, code := runIdem(t, nil, args...)
		if code != 0 {
			t.Fatalf("json %v: exit %d, stderr %q\n%s", asJSON, code, stderr, stdout)
		}
		if !strings.Contains(stdout, "127.0.0.1") {
			t.Errorf("json %v: the report does not name the target: %s", asJSON, stdout)
		}
		if strings.Contains(stdout+stderr, "pw-in-url") || strings.Contains(stdout+stderr, "tok-in-url") {
			t.Errorf("json %v: the report shows a credential:\n%s\n%s", asJSON, stdout, stderr)
		}
	}
	// An unreachable target with credentials: the error line hides them too.
	_, stderr, code := runIdem(t, nil, "conformance", "--url", "http://user:pw-in-url@127.0.0.1:1/charges", "--body", bodyFile(t), "--timeout", "2s")
	if code == 0 || strings.Contains(stderr, "pw-in-url") {
		t.Errorf("unreachable: exit %d, stderr %q", code, stderr)
	}
}
