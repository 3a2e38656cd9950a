package main

import (
	"bufio"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/paysim"
)

// paysimProc is a running `idem paysim`.
type paysimProc struct {
	cmd    *exec.Cmd
	url    string
	stdout chan string // lines after the listening line; buffered, closed before exited
	exited chan error
	stderr *strings.Builder
}

// startPaysim starts the simulator on a free loopback port and waits for
// its "paysim listening on" line.
func startPaysim(t *testing.T, env []string, args ...string) *paysimProc {
	t.Helper()
	cmd := exec.Command(idemBin, append([]string{"paysim", "--addr", "127.0.0.1:0"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &paysimProc{cmd: cmd, stdout: make(chan string, 64), exited: make(chan error, 1), stderr: &strings.Builder{}}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	listening := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "paysim listening on "); ok {
				listening <- a
				continue
			}
			p.stdout <- sc.Text()
		}
		close(p.stdout)
		p.exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if p.exited != nil {
			<-p.exited
		}
	})
	select {
	case a := <-listening:
		p.url = "http://" + a
	case err := <-p.exited:
		p.exited = nil
		t.Fatalf("paysim exited before listening: %v: %s", err, p.stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("paysim did not print its address: %s", p.stderr.String())
	}
	return p
}

// stop sends SIGTERM and returns the lines printed after the listening
// line and the exit error.
func (p *paysimProc) stop(t *testing.T) ([]string, error) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.exited:
		// The reader closed stdout before reporting the exit.
		p.exited = nil
		var lines []string
		for l := range p.stdout {
			lines = append(lines, l)
		}
		return lines, err
	case <-time.After(30 * time.Second):
		t.Fatalf("paysim did not exit 30s after SIGTERM")
		return nil, nil
	}
}

func paysimClient(t *testing.T, url string) *paysim.Client {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	ic, err := idemclient.New(&http.Client{Transport: tr}, &idemclient.Config{BaseDelay: time.Millisecond, MaxDelay: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	c, err := paysim.NewClient(url, ic)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestPaysimProcessChargesAndStopsOnSIGTERM(t *testing.T) {
	t.Parallel()
	p := startPaysim(t, nil, "--seed", "3")
	c := paysimClient(t, p.url)
	cmd := paysim.ChargeCommand{IdempotencyKey: idemclient.Key("o-1", "charge", "r-1"), OrderID: "o-1", CustomerID: "c-1", AmountKopecks: 1000}
	first, err := c.Charge(t.Context(), cmd)
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.Charge(t.Context(), cmd)
	if err != nil || again.ChargeID != first.ChargeID || !again.Replayed {
		t.Fatalf("second charge %+v, %v; want the replay of %s", again, err, first.ChargeID)
	}
	rows, err := c.Ledger(t.Context())
	if err != nil || len(rows) != 1 || rows[0].IdempotencyKey != cmd.IdempotencyKey {
		t.Fatalf("ledger %+v, %v", rows, err)
	}
	lines, err := p.stop(t)
	if err != nil {
		t.Fatalf("exit after SIGTERM: %v (stderr %q), want status 0", err, p.stderr.String())
	}
	if len(lines) != 1 || !strings.Contains(lines[0], "1 charges") {
		t.Errorf("final output %q, want one summary line with 1 charges", lines)
	}
}

func TestPaysimFaultsFromEnvAndFlags(t *testing.T) {
	t.Parallel()
	// Environment: every charge fails before charging.
	p := startPaysim(t, []string{"PAYSIM_FAIL_RATE=1", "PAYSIM_SEED=9"})
	c := paysimClient(t, p.url)
	_, err := c.Charge(t.Context(), paysim.ChargeCommand{IdempotencyKey: "k", OrderID: "o", CustomerID: "c", AmountKopecks: 1})
	var se *idemclient.StatusError
	if !errors.As(err, &se) || se.StatusCode != 500 || se.Code != paysim.CodeProviderFault {
		t.Fatalf("err = %v, want 500 %s", err, paysim.CodeProviderFault)
	}
	if _, err := p.stop(t); err != nil {
		t.Fatal(err)
	}

	// A flag overrides the environment.
	p = startPaysim(t, []string{"PAYSIM_FAIL_RATE=1"}, "--fail-rate", "0")
	c = paysimClient(t, p.url)
	if _, err := c.Charge(t.Context(), paysim.ChargeCommand{IdempotencyKey: "k", OrderID: "o", CustomerID: "c", AmountKopecks: 1}); err != nil {
		t.Fatalf("--fail-rate 0 over PAYSIM_FAIL_RATE=1: %v", err)
	}
	if _, err := p.stop(t); err != nil {
		t.Fatal(err)
	}
}

func TestPaysimBadInput(t *testing.T) {
	t.Parallel()
	testCases := []struct {
		name    string
		env     []string
		args    []string
		wantErr string
	}{
		{"rate above 1", nil, []string{"paysim", "--fail-rate", "2"}, "FailRate"},
		{"negative drop rate", nil, []string{"paysim", "--drop-rate", "-0.5"}, "DropRate"},
		{"bad latency flag", nil, []string{"paysim", "--latency", "soon"}, "invalid value"},
		{"bad env rate", []string{"PAYSIM_DROP_RATE=lots"}, []string{"paysim"}, "PAYSIM_DROP_RATE"},
		{"bad env latency", []string{"PAYSIM_LATENCY=soon"}, []string{"paysim"}, "PAYSIM_LATENCY"},
		{"bad env seed", []string{"PAYSIM_SEED=-1"}, []string{"paysim"}, "PAYSIM_SEED"},
		{"extra argument", nil, []string{"paysim", "now"}, `unexpected argument "now"`},
	}
	for _, tt := range testCases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, stderr, code := runIdem(t, tt.env, tt.args...)
			if code != 2 || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, tt.wantErr) {
				t.Errorf("exit %d, stderr %q; want 2 and one line containing %q", code, stderr, tt.wantErr)
			}
		})
	}
	stdout, stderr, code := runIdem(t, nil, "paysim", "--help")
	if code != 0 || stderr != "" || !strings.Contains(stdout, "POST /charges") || !strings.Contains(stdout, "drop-rate") {
		t.Errorf("--help: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}
