package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idemkit/idem/internal/testbin"
	"github.com/idemkit/idem/internal/testdb"
)

// billingBin is the billing binary, built once by TestMain for every test
// of this package (serve, demo, chaos); with -race when the tests run with
// -race. A data race in the service then makes it exit 66 (the race
// detector's status), which every test checking exit 0 catches.
var billingBin string

func TestMain(m *testing.M) {
	// OUTBOX_MODE=wal needs wal_level=logical.
	stopLogical, err := testdb.LogicalMain()
	if err != nil {
		panic(err)
	}
	dir, err := os.MkdirTemp("", "billing-cli-")
	if err != nil {
		panic(err)
	}
	if billingBin, err = testbin.Build(dir, "billing", ".", testbin.Race); err != nil {
		panic(err)
	}
	code := m.Run()
	os.RemoveAll(dir)
	stopLogical()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			println("goleak:", err.Error())
			code = 1
		}
	}
	os.Exit(code)
}

// runBilling runs the binary to completion and returns stdout, stderr and
// the exit status.
func runBilling(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	return testbin.Run(t, billingBin, env, args...)
}

// serveProc is a running `billing serve`.
type serveProc struct {
	t    *testing.T
	cmd  *exec.Cmd
	Addr string // bound HTTP address
	// AdminAddr is the bound admin address (ADMIN_ADDR), if any.
	AdminAddr string
	stderr    *testbin.Buffer
	// stdout has every line of stdout (the console span exporter's, say).
	stdout *testbin.Buffer
	exited chan struct{}
	code   int
}

// startServe runs `billing serve` with env (HTTP_ADDR defaults to
// 127.0.0.1:0) and waits for the "listening on" line and for /readyz to
// answer 200. The process is killed at test end if still running.
func startServe(t *testing.T, env []string, args ...string) *serveProc {
	t.Helper()
	hasAddr := false
	for _, e := range env {
		hasAddr = hasAddr || strings.HasPrefix(e, "HTTP_ADDR=")
	}
	if !hasAddr {
		env = append(env, "HTTP_ADDR=127.0.0.1:0")
	}
	cmd := exec.Command(billingBin, append([]string{"serve"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &serveProc{t: t, cmd: cmd, stderr: &testbin.Buffer{}, stdout: &testbin.Buffer{}, exited: make(chan struct{})}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addrCh, adminCh := make(chan string, 1), make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 0, 64<<10), 4<<20) // a span is one line
		for sc.Scan() {
			_, _ = p.stdout.Write([]byte(sc.Text() + "\n"))
			if a, ok := strings.CutPrefix(sc.Text(), "billing: listening on "); ok {
				addrCh <- a
			}
			// Printed before the API's line.
			if a, ok := strings.CutPrefix(sc.Text(), "billing: admin listening on "); ok {
				adminCh <- a
			}
		}
		err := cmd.Wait()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			p.code = ee.ExitCode()
		} else if err != nil {
			p.code = -1
		}
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = cmd.Process.Kill()
			<-p.exited
		}
	})
	if strings.Contains(strings.Join(args, " "), "--roles") && !strings.Contains(strings.Join(args, " "), "http") {
		// No HTTP role: no address, no /readyz; wait for the start log.
		deadline := time.Now().Add(90 * time.Second)
		for !strings.Contains(p.stderr.String(), "msg=started") {
			select {
			case <-p.exited:
				t.Fatalf("billing serve exited %d before starting; stderr:\n%s", p.code, p.stderr.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("billing serve did not start within 90s; stderr:\n%s", p.stderr.String())
			}
			time.Sleep(20 * time.Millisecond) // polling interval
		}
		return p
	}
	select {
	case p.Addr = <-addrCh:
		select {
		case p.AdminAddr = <-adminCh:
		default:
		}
	case <-p.exited:
		t.Fatalf("billing serve exited %d before listening; stderr:\n%s", p.code, p.stderr.String())
	case <-time.After(90 * time.Second):
		t.Fatalf("billing serve did not listen within 90s; stderr:\n%s", p.stderr.String())
	}
	p.waitStatus("/readyz", http.StatusOK)
	return p
}

// waitStatus polls GET path until it answers want, for at most 90 s.
func (p *serveProc) waitStatus(path string, want int) {
	p.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		resp, err := http.Get("http://" + p.Addr + path)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == want {
				return
			}
		}
		select {
		case <-p.exited:
			p.t.Fatalf("billing exited %d while waiting for %s = %d; stderr:\n%s", p.code, path, want, p.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("%s never answered %d; stderr:\n%s", path, want, p.stderr.String())
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
}

func (p *serveProc) signal(s syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(s); err != nil {
		p.t.Fatal(err)
	}
}

// wait waits for the exit (at most two minutes) and returns the status.
func (p *serveProc) wait() int {
	p.t.Helper()
	select {
	case <-p.exited:
		return p.code
	case <-time.After(2 * time.Minute):
		p.t.Fatalf("billing did not exit; stderr:\n%s", p.stderr.String())
	}
	return -1
}

// apiClient speaks billing's HTTP API. Keep-alives are off so that every
// request is its own connection: after the listener closes, a new request
// fails at dial, and any other error means a request in flight was dropped.
type apiClient struct {
	base  string
	token string
	hc    *http.Client
}

func newClient(addr, token string) *apiClient {
	return &apiClient{base: "http://" + addr, token: token, hc: &http.Client{
		Transport: &http.Transport{DisableKeepAlives: true},
		Timeout:   60 * time.Second,
	}}
}

type apiResponse struct {
	Status int
	Header http.Header
	Body   []byte
}

func (r apiResponse) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.Body, &m); err != nil {
		t.Fatalf("body %q: %v", r.Body, err)
	}
	return m
}

// do sends one request; a non-nil error is a transport failure.
func (c *apiClient) do(method, path, key, body string) (apiResponse, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		return apiResponse{}, err
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return apiResponse{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return apiResponse{}, err
	}
	return apiResponse{Status: resp.StatusCode, Header: resp.Header, Body: b}, nil
}

// must is do that fails the test on a transport error.
func (c *apiClient) must(t *testing.T, method, path, key, body string) apiResponse {
	t.Helper()
	r, err := c.do(method, path, key, body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return r
}

// isDialError reports whether err happened before the request was sent
// (nothing listening): the only failure allowed during a shutdown.
func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}
