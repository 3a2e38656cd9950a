package failpoint

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"go.uber.org/goleak"
)

const childEnv = "FAILPOINT_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		// Armed by IDEM_FAILPOINTS in the child's environment.
		err := Inject(RelayPublished)
		os.Stdout.WriteString("after: " + errString(err) + "\n")
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

func errString(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}

func child(t *testing.T, spec string) (stdout, stderr string, ws syscall.WaitStatus) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", EnvVar+"="+spec)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	return o.String(), e.String(), cmd.ProcessState.Sys().(syscall.WaitStatus)
}

func TestKillIsARealSIGKILLAfterTheHitLine(t *testing.T) {
	t.Parallel()
	out, errOut, ws := child(t, "relay-published=kill")
	if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child not SIGKILLed: %v; stdout %q", ws, out)
	}
	if strings.Contains(out, "after:") {
		t.Fatal("code past the failpoint ran")
	}
	if !strings.Contains(errOut, "idem-failpoint: hit relay-published kill\n") {
		t.Fatalf("no hit line on stderr: %q", errOut)
	}
}

func TestErrorAndOffAndProbabilityZero(t *testing.T) {
	t.Parallel()
	testCases := []struct{ spec, want, hit string }{
		{"relay-published=error", "after: failpoint: injected error at relay-published", "hit relay-published error"},
		{"relay-published=off", "after: nil", ""},
		{"relay-published=kill@0", "after: nil", ""},
		{"consumer-db-committed=kill", "after: nil", ""}, // another point armed
		{"relay-published=pause(1ms)", "after: nil", "hit relay-published pause"},
	}
	for _, tt := range testCases {
		out, errOut, ws := child(t, tt.spec)
		if ws.Signaled() || !strings.Contains(out, tt.want) {
			t.Errorf("%s: stdout %q status %v, want %q", tt.spec, out, ws, tt.want)
		}
		if tt.hit != "" && !strings.Contains(errOut, tt.hit) || tt.hit == "" && strings.Contains(errOut, "idem-failpoint") {
			t.Errorf("%s: stderr %q", tt.spec, errOut)
		}
	}
}

func TestMalformedSpecRefused(t *testing.T) {
	t.Parallel()
	for _, spec := range []string{"nope=kill", "relay-published", "relay-published=explode", "relay-published=kill@2", "relay-published=pause(x)"} {
		if err := Validate(spec); err == nil {
			t.Errorf("Validate(%q) = nil", spec)
		}
		_, errOut, ws := child(t, spec)
		if ws.ExitStatus() == 0 || !strings.Contains(errOut, "failpoint:") {
			t.Errorf("%q: child exit %v, stderr %q: a typo must not disarm silently", spec, ws, errOut)
		}
	}
	if err := Validate("relay-published=kill@0.5, http-handler-done=pause(20ms)"); err != nil {
		t.Fatal(err)
	}
}

func TestDisarmedCostsNothing(t *testing.T) {
	if armed.Load() {
		t.Fatal("IDEM_FAILPOINTS is set in the test environment")
	}
	if n := testing.AllocsPerRun(1000, func() { _ = Inject(RelayPublished) }); n != 0 {
		t.Fatalf("disarmed Inject allocates %v", n)
	}
}

func BenchmarkDisarmed(b *testing.B) {
	for b.Loop() {
		_ = Inject(RelayPublished)
	}
}
