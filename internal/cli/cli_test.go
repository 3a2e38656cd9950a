package cli_test

import (
	"context"
	"errors"
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
