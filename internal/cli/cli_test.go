package cli_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemkit/idem/internal/cli"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRunExitCodes(t *testing.T) {
	t.Parallel()
	cmds := []*cli.Command{
		{Name: "ok", Run: func(context.Context, []string) error { return nil }},
		{Name: "usage", Run: func(ctx context.Context, args []string) error {
			fs := cli.FlagSet("usage", "Usage: x usage")
			fs.Int("n", 1, "a number")
			return cli.Parse(fs, args)
		}},
		{Name: "fail", Run: func(context.Context, []string) error { return errors.New("broke\nacross lines") }},
		{Name: "three", Run: func(context.Context, []string) error {
			return fmt.Errorf("wrapped: %w", &cli.ExitError{Code: 3, Err: errors.New("inconclusive")})
		}},
	}
	testCases := []struct {
		args       []string
		code       int
		wantStderr string
	}{
		{[]string{"ok"}, 0, ""},
		{[]string{"usage", "-n", "x"}, 2, `x usage: invalid value "x" for flag -n: parse error` + "\n"},
		{[]string{"usage", "--help"}, 0, ""},
		{[]string{"fail"}, 1, "x fail: broke across lines\n"},
		{[]string{"three"}, 3, "x three: wrapped: inconclusive\n"},
		{[]string{"nope"}, 2, `x: unknown command "nope" (run 'x --help')` + "\n"},
	}
	for _, tt := range testCases {
		var out, errOut strings.Builder
		code := cli.Run("x", "test", cmds, tt.args, &out, &errOut)
		if code != tt.code || errOut.String() != tt.wantStderr {
			t.Errorf("%v: exit %d stderr %q, want %d %q", tt.args, code, errOut.String(), tt.code, tt.wantStderr)
		}
	}
}

func TestRedact(t *testing.T) {
	t.Parallel()
	if got := cli.Redact("postgres://u:secret@h/db"); strings.Contains(got, "secret") {
		t.Fatalf("Redact leaked the password: %s", got)
	}
}

// TestRedactHidesEveryPasswordForm: a password in the user-info part, in a
// query parameter (password, sslpassword, in any case) and in a keyword/value
// connection string never survives Redact, and what is not secret does.
func TestRedactHidesEveryPasswordForm(t *testing.T) {
	t.Parallel()
	testCases := []struct {
		name, in, want string
	}{
		{"user-info", "postgres://u:hunter2@h:5432/db", "postgres://u:xxxxx@h:5432/db"},
		{"user only", "postgres://u@h/db", "postgres://u@h/db"},
		{"no secret", "postgres://h/db?sslmode=disable", "postgres://h/db?sslmode=disable"},
		{"query password", "postgres://u@h/db?sslmode=disable&password=hunter2", "postgres://u@h/db?sslmode=disable&password=xxxxx"},
		{"query sslpassword", "postgres://h/db?sslpassword=hunter2&sslkey=/k", "postgres://h/db?sslpassword=xxxxx&sslkey=/k"},
		{"query case-folded", "postgresql://h/db?PassWord=hunter2", "postgresql://h/db?PassWord=xxxxx"},
		{"both forms", "postgres://u:hunter2@h/db?password=hunter2", "postgres://u:xxxxx@h/db?password=xxxxx"},
		{"encoded password", "postgres://u:hun%40ter2@h/db", "postgres://u:xxxxx@h/db"},
		{"repeated parameter", "postgres://h/db?password=a&password=hunter2", "postgres://h/db?password=xxxxx&password=xxxxx"},
		{"multi-host", "postgres://u:hunter2@h1:5432,h2:5433/db", "postgres://u:xxxxx@h1:5432,h2:5433/db"},
		{"http URL", "http://u:hunter2@127.0.0.1:8080/orders", "http://u:xxxxx@127.0.0.1:8080/orders"},
		{"http token parameter", "http://h/ledger?access_token=hunter2&limit=5", "http://h/ledger?access_token=xxxxx&limit=5"},
		{"keyword/value", "host=h user=u password=hunter2 dbname=db", "host=h user=u password=xxxxx dbname=db"},
		{"keyword/value quoted", `host=h password='hun ter\'2' dbname=db`, "host=h password=xxxxx dbname=db"},
		{"keyword/value spaced", "host = h password = hunter2", "host=h password=xxxxx"},
		{"keyword/value sslpassword", "sslpassword=hunter2 host=h", "sslpassword=xxxxx host=h"},
		{"keyword/value unterminated quote", "host=h password='hunter2", "(connection string)"},
		{"unparseable URL", "postgres://u:hunter2@h:port/db", "(unparseable URL)"},
		{"empty", "", ""},
	}
	for _, tt := range testCases {
		got := cli.Redact(tt.in)
		if got != tt.want {
			t.Errorf("%s: Redact(%q) = %q, want %q", tt.name, tt.in, got, tt.want)
		}
		if strings.Contains(got, "hunter2") || strings.Contains(got, "hun ter") {
			t.Errorf("%s: Redact(%q) = %q leaks the password", tt.name, tt.in, got)
		}
	}
}

// TestScrubHidesPasswordsInText: a password of a URL that an error message
// (from any library) repeats is hidden wherever it appears.
func TestScrubHidesPasswordsInText(t *testing.T) {
	t.Parallel()
	raw := "postgres://u:hun%40ter2@h/db?sslpassword=k3yz"
	msg := `parse "postgres://u:hun%40ter2@h/db?sslpassword=k3yz": boom; password hun@ter2; key k3yz`
	got := cli.Scrub(msg, raw)
	for _, secret := range []string{"hun%40ter2", "hun@ter2", "k3yz"} {
		if strings.Contains(got, secret) {
			t.Errorf("Scrub left %q in %q", secret, got)
		}
	}
	if !strings.Contains(got, "boom") {
		t.Errorf("Scrub dropped the message: %q", got)
	}
	if cli.Scrub("nothing secret", "postgres://h/db") != "nothing secret" {
		t.Error("Scrub changed a message without a secret")
	}
}

// TestRunScrubsTheErrorItPrints: an error that repeats DATABASE_URL or a
// URL registered with HideURL (as url.Parse's errors do) is printed without
// the password. Not parallel: it sets DATABASE_URL.
func TestRunScrubsTheErrorItPrints(t *testing.T) {
	const envURL = "postgres://u:env-secret@h:port/db" // malformed on purpose
	t.Setenv("DATABASE_URL", envURL)
	flagURL := "http://h/x?token=flag-secret"
	cli.HideURL(flagURL)
	cmds := []*cli.Command{
		{Name: "fail", Run: func(context.Context, []string) error {
			_, err := url.Parse(os.Getenv("DATABASE_URL"))
			return fmt.Errorf("connect: %w; GET %s", err, flagURL)
		}},
		{Name: "usage", Run: func(context.Context, []string) error {
			return cli.Usagef("bad --url %s", flagURL)
		}},
	}
	for _, name := range []string{"fail", "usage"} {
		var out, errOut strings.Builder
		cli.Run("x", "test", cmds, []string{name}, &out, &errOut)
		if got := errOut.String(); strings.Contains(got, "env-secret") || strings.Contains(got, "flag-secret") || !strings.Contains(got, "xxxxx") {
			t.Errorf("%s: stderr %q", name, got)
		}
	}
}

// FuzzRedact: Redact never panics, and a password put in both places of a
// URL never comes out.
func FuzzRedact(f *testing.F) {
	f.Add("hunter22", "h:5432")
	f.Add("p@ss:word", "h1,h2")
	f.Fuzz(func(t *testing.T, pw, host string) {
		_ = cli.Redact(pw)
		_ = cli.Redact(host)
		pe, qe := url.PathEscape(pw), url.QueryEscape(pw)
		if len(pw) < 4 || strings.ContainsAny(pw, "x%") || strings.Contains(host, pe) || strings.Contains(host, qe) {
			return
		}
		raw := "postgres://u:" + url.PathEscape(pw) + "@" + host + "/db?password=" + url.QueryEscape(pw)
		got := cli.Redact(raw)
		// What the answer would be with the password already hidden: a
		// password that is a piece of it (of the host, say) is no leak.
		shape := cli.Redact("postgres://u:xxxxx@"+host+"/db?password=xxxxx") + "(unparseable URL)"
		if (strings.Contains(got, pe) && !strings.Contains(shape, pe)) || (strings.Contains(got, qe) && !strings.Contains(shape, qe)) {
			t.Fatalf("Redact(%q) = %q", raw, got)
		}
	})
}

// NATS URLs: a password, a bare token (nats://TOKEN@host) and each URL of
// a comma list are hidden by Redact, RedactList and Scrub.
func TestRedactNATS(t *testing.T) {
	t.Parallel()
	const secret = "pw-hunter2"
	for _, raw := range []string{
		"nats://billing:" + secret + "@127.0.0.1:4222",
		"nats://" + secret + "@127.0.0.1:4222",
		"tls://" + secret + "@nats.internal:4222",
	} {
		if got := cli.Redact(raw); strings.Contains(got, secret) || !strings.Contains(got, "127.0.0.1:4222") && !strings.Contains(got, "nats.internal") {
			t.Errorf("Redact(%q) = %q", raw, got)
		}
		msg := "billing: create stream X on " + raw + ": nats: timeout (user " + secret + ")"
		if got := cli.Scrub(msg, raw); strings.Contains(got, secret) {
			t.Errorf("Scrub: %q", got)
		}
	}
	list := "nats://a:" + secret + "@h1:4222,nats://h2:4222"
	if got := cli.RedactList(list); strings.Contains(got, secret) || !strings.Contains(got, "h2:4222") {
		t.Errorf("RedactList = %q", got)
	}
	if got := cli.Redact("redis://alice@h:6379/0"); !strings.Contains(got, "alice") {
		t.Errorf("a Redis user name is not a secret: %q", got)
	}
}
