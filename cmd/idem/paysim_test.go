package main

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/paysim"
)

// paysimProc is a running `idem paysim`.
type paysimProc struct {
	cmd    *exec.Cmd
	url    string
	stdout chan string // lines after the listening line; buffered, closed before exited
	logs   chan string // stderr lines; buffered, extra lines dropped
	exited chan error

	mu     sync.Mutex
	stderr strings.Builder
}

func (p *paysimProc) stderrText() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

// startPaysim starts the simulator on a free loopback port and waits for
// its "paysim listening on" line.
func startPaysim(t *testing.T, env []string, args ...string) *paysimProc {
	t.Helper()
	return startPaysimAt(t, "127.0.0.1:0", env, args...)
}

// startPaysimAt is startPaysim on addr.
func startPaysimAt(t *testing.T, addr string, env []string, args ...string) *paysimProc {
	t.Helper()
	cmd := exec.Command(idemBin, append([]string{"paysim", "--addr", addr}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	errOut, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &paysimProc{cmd: cmd, stdout: make(chan string, 64), logs: make(chan string, 256), exited: make(chan error, 1)}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stderrDone := make(chan struct{})
	go func() {
		defer close(stderrDone)
		sc := bufio.NewScanner(errOut)
		for sc.Scan() {
			p.mu.Lock()
			p.stderr.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
			select {
			case p.logs <- sc.Text():
			default:
			}
		}
	}()
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
		<-stderrDone // Wait only after every read from the pipes
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
		t.Fatalf("paysim exited before listening: %v: %s", err, p.stderrText())
	case <-time.After(30 * time.Second):
		t.Fatalf("paysim did not print its address: %s", p.stderrText())
	}
	return p
}

// waitLog waits for a stderr line containing s.
func (p *paysimProc) waitLog(t *testing.T, s string) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case l := <-p.logs:
			if strings.Contains(l, s) {
				return
			}
		case <-deadline:
			t.Fatalf("no stderr line with %q: %s", s, p.stderrText())
		}
	}
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
	ic, err := idemclient.New(&http.Client{Transport: tr}, &idemclient.Config{BackoffMin: time.Millisecond, BackoffMax: 10 * time.Millisecond})
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
		t.Fatalf("exit after SIGTERM: %v (stderr %q), want status 0", err, p.stderrText())
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
		{"decline rate above 1", nil, []string{"paysim", "--decline-rate", "1.5"}, "DeclineRate"},
		{"bad env decline rate", []string{"PAYSIM_DECLINE_RATE=half"}, []string{"paysim"}, "PAYSIM_DECLINE_RATE"},
		{"bad latency flag", nil, []string{"paysim", "--latency", "soon"}, "invalid value"},
		{"bad env rate", []string{"PAYSIM_DROP_RATE=lots"}, []string{"paysim"}, "PAYSIM_DROP_RATE"},
		{"bad env latency", []string{"PAYSIM_LATENCY=soon"}, []string{"paysim"}, "PAYSIM_LATENCY"},
		{"bad env seed", []string{"PAYSIM_SEED=-1"}, []string{"paysim"}, "PAYSIM_SEED"},
		{"extra argument", nil, []string{"paysim", "now"}, `unexpected argument "now"`},
		{"bad size flag", nil, []string{"paysim", "--max-ledger-bytes", "lots"}, "not a size"},
		{"bad env size", []string{"PAYSIM_MAX_LEDGER_BYTES=1TB"}, []string{"paysim"}, "PAYSIM_MAX_LEDGER_BYTES"},
		{"bad env entries", []string{"PAYSIM_MAX_LEDGER_ENTRIES=many"}, []string{"paysim"}, "PAYSIM_MAX_LEDGER_ENTRIES"},
		{"zero entries", nil, []string{"paysim", "--max-ledger-entries", "0"}, "must be positive"},
		{"bad env conns", []string{"PAYSIM_MAX_CONNS=-"}, []string{"paysim"}, "PAYSIM_MAX_CONNS"},
		{"zero read timeout", nil, []string{"paysim", "--read-timeout", "0"}, "--read-timeout 0s must be positive"},
		{"bad env idle timeout", []string{"PAYSIM_IDLE_TIMEOUT=forever"}, []string{"paysim"}, "PAYSIM_IDLE_TIMEOUT"},
		{"bad env header bytes", []string{"PAYSIM_MAX_HEADER_BYTES=big"}, []string{"paysim"}, "PAYSIM_MAX_HEADER_BYTES"},
		{"header bytes below 4 KiB", nil, []string{"paysim", "--max-header-bytes", "100"}, "MaxHeaderBytes 100 must be at least 4096"},
		{"write timeout within the read timeout", []string{"PAYSIM_READ_TIMEOUT=1m"}, []string{"paysim"}, "WriteTimeout 30s must exceed ReadTimeout 1m0s"},
		{"short ledger token", []string{"PAYSIM_LEDGER_TOKEN=short"}, []string{"paysim"}, "LedgerToken"},
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
	if code != 0 || stderr != "" || !strings.Contains(stdout, "POST /charges") || !strings.Contains(stdout, "drop-rate") || !strings.Contains(stdout, "decline-rate") ||
		!strings.Contains(stdout, "127.0.0.1:8090") || !strings.Contains(stdout, "PAYSIM_LEDGER_TOKEN") || !strings.Contains(stdout, "-max-conns") {
		t.Errorf("--help: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

// TestPaysimInFlightChargeFinishesOnSIGTERM: a charge in flight when
// SIGTERM arrives is finished and answered before the process exits 0.
func TestPaysimInFlightChargeFinishesOnSIGTERM(t *testing.T) {
	t.Parallel()
	p := startPaysim(t, nil, "--latency", "1s", "-v")
	c := paysimClient(t, p.url)
	type result struct {
		res paysim.ChargeResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := c.Charge(t.Context(), paysim.ChargeCommand{IdempotencyKey: "in-flight", OrderID: "o-1", CustomerID: "c-1", AmountKopecks: 10})
		done <- result{res, err}
	}()
	// The handler logs "charge started" after claiming the key and before
	// the latency: from here on the charge is in flight.
	p.waitLog(t, `msg="charge started"`)
	lines, err := p.stop(t)
	if err != nil {
		t.Fatalf("exit after SIGTERM: %v (stderr %q), want status 0", err, p.stderrText())
	}
	r := <-done
	if r.err != nil || r.res.ChargeID == "" || r.res.Attempts != 1 {
		t.Fatalf("in-flight charge: %+v, %v; want it answered on its first attempt", r.res, r.err)
	}
	if len(lines) != 1 || !strings.Contains(lines[0], "1 charges") {
		t.Errorf("final output %q, want one summary line with 1 charges", lines)
	}
}

// TestPaysimDeclineRate: --decline-rate (or PAYSIM_DECLINE_RATE) makes the
// process decline keys for good: the client sees ErrDeclined, not
// retryable, on every attempt; GET /ledger lists the declines beside no
// charge; the summary counts them.
func TestPaysimDeclineRate(t *testing.T) {
	t.Parallel()
	for _, run := range []struct {
		env  []string
		args []string
	}{
		{nil, []string{"--decline-rate", "1"}},
		{[]string{"PAYSIM_DECLINE_RATE=1"}, nil},
	} {
		p := startPaysim(t, run.env, run.args...)
		c := paysimClient(t, p.url)
		cmd := paysim.ChargeCommand{IdempotencyKey: "o-1:charge", OrderID: "o-1", CustomerID: "c-1", AmountKopecks: 10}
		for range 2 {
			if _, err := c.Charge(t.Context(), cmd); !errors.Is(err, paysim.ErrDeclined) || idemclient.IsRetryable(err) {
				t.Fatalf("%v %v: Charge = %v, want ErrDeclined", run.env, run.args, err)
			}
		}
		e, err := c.Entries(t.Context())
		if err != nil || len(e.Charges) != 0 || len(e.Declines) != 1 || e.Declines[0].CustomerID != "c-1" || e.Declines[0].Principal != paysim.ScopeDefault {
			t.Fatalf("ledger %+v, %v", e, err)
		}
		lines, err := p.stop(t)
		if err != nil || len(lines) != 1 || !strings.Contains(lines[0], "0 charges, 1 declines") {
			t.Fatalf("stop: %v, %q", err, lines)
		}
	}
}

// With OTEL_TRACES_EXPORTER=console, each charge request is a span printed
// on stdout, in the caller's trace: the child of the traceparent's span.
func TestPaysimConsoleTraceContinuesCaller(t *testing.T) {
	t.Parallel()
	p := startPaysim(t, []string{"OTEL_TRACES_EXPORTER=console"})
	const traceID, parent = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
	req, err := http.NewRequest(http.MethodPost, p.url+"/charges", strings.NewReader(`{"order_id":"o-1","customer_id":"c-1","amount_kopecks":100}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Idempotency-Key", "trace-1")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", "00-"+traceID+"-"+parent+"-01")
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("charge: %d", resp.StatusCode)
	}
	lines, err := p.stop(t)
	if err != nil {
		t.Fatalf("exit after SIGTERM: %v (stderr %q)", err, p.stderrText())
	}
	var found bool
	for _, l := range lines {
		if !strings.HasPrefix(l, "{") {
			continue
		}
		var s struct {
			Name        string
			SpanContext struct{ TraceID string }
			Parent      struct{ SpanID string }
		}
		if err := json.Unmarshal([]byte(l), &s); err != nil {
			t.Fatalf("stdout line %q: %v", l, err)
		}
		if s.Name == "POST /charges" {
			found = true
			if s.SpanContext.TraceID != traceID || s.Parent.SpanID != parent {
				t.Errorf("span %+v, want trace %s, parent %s", s, traceID, parent)
			}
		}
	}
	if !found {
		t.Fatalf("no POST /charges span on stdout: %q", lines)
	}
}

// With OTEL_TRACES_EXPORTER=otlp, the spans reach an OTLP/HTTP collector
// (here a test receiver on loopback, OTEL_EXPORTER_OTLP_ENDPOINT), in the
// caller's trace, under OTEL_SERVICE_NAME.
func TestPaysimOTLPExport(t *testing.T) {
	t.Parallel()
	got := make(chan *coltracepb.ExportTraceServiceRequest, 16)
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		req := &coltracepb.ExportTraceServiceRequest{}
		if err != nil || r.URL.Path != "/v1/traces" || proto.Unmarshal(b, req) != nil {
			http.Error(w, "bad export", http.StatusBadRequest)
			return
		}
		got <- req
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		_, _ = w.Write(out)
	}))
	defer collector.Close()
	p := startPaysim(t, []string{"OTEL_TRACES_EXPORTER=otlp", "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + collector.URL, "OTEL_SERVICE_NAME=paysim-under-test"})
	const traceID, parent = "5b8efff798038103d269b633813fc60c", "eee19b7ec3c1b174"
	req, err := http.NewRequest(http.MethodPost, p.url+"/charges", strings.NewReader(`{"order_id":"o-1","customer_id":"c-1","amount_kopecks":100}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Idempotency-Key", "otlp-1")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("traceparent", "00-"+traceID+"-"+parent+"-01")
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("charge: %d", resp.StatusCode)
	}
	if _, err := p.stop(t); err != nil { // the stop flushes the batch
		t.Fatalf("exit after SIGTERM: %v (stderr %q)", err, p.stderrText())
	}
	var found bool
	for len(got) > 0 {
		for _, rs := range (<-got).GetResourceSpans() {
			service := ""
			for _, kv := range rs.GetResource().GetAttributes() {
				if kv.GetKey() == "service.name" {
					service = kv.GetValue().GetStringValue()
				}
			}
			for _, ss := range rs.GetScopeSpans() {
				for _, sp := range ss.GetSpans() {
					if sp.GetName() != "POST /charges" {
						continue
					}
					found = true
					if hex.EncodeToString(sp.GetTraceId()) != traceID || hex.EncodeToString(sp.GetParentSpanId()) != parent || service != "paysim-under-test" {
						t.Errorf("span trace %x parent %x service %q; want %s, %s, paysim-under-test", sp.GetTraceId(), sp.GetParentSpanId(), service, traceID, parent)
					}
				}
			}
		}
	}
	if !found {
		t.Fatalf("the collector got no POST /charges span; stderr %q", p.stderrText())
	}
}
