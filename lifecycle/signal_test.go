package lifecycle_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/testbin"
)

// proc is the helper process under test.
type proc struct {
	t      *testing.T
	cmd    *exec.Cmd
	lines  chan string // stdout, line by line
	stderr *testbin.Buffer
	exited chan struct{}
	code   int
}

func startHelper(t *testing.T, timeout, stages string) *proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1", "LIFECYCLE_TEST_STAGES="+stages, "LIFECYCLE_TEST_TIMEOUT="+timeout)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, cmd: cmd, lines: make(chan string, 100), stderr: &testbin.Buffer{}, exited: make(chan struct{})}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
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
	return p
}

// next returns the next stdout line; it fails the test after a minute.
func (p *proc) next() string {
	p.t.Helper()
	select {
	case l, ok := <-p.lines:
		if !ok {
			p.t.Fatalf("helper stdout closed; stderr:\n%s", p.stderr.String())
		}
		return l
	case <-time.After(time.Minute):
		p.t.Fatalf("no line from helper within a minute; stderr:\n%s", p.stderr.String())
	}
	return ""
}

// expect reads lines and fails unless they are exactly want, in order.
func (p *proc) expect(want ...string) {
	p.t.Helper()
	for _, w := range want {
		if got := p.next(); got != w {
			p.t.Fatalf("line %q, want %q; stderr:\n%s", got, w, p.stderr.String())
		}
	}
}

// rest drains stdout until the helper exits, returning the remaining lines
// and the exit status.
func (p *proc) rest() ([]string, int) {
	p.t.Helper()
	var out []string
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				<-p.exited
				return out, p.code
			}
			out = append(out, l)
		case <-time.After(time.Minute):
			p.t.Fatalf("helper did not exit within a minute; stderr:\n%s", p.stderr.String())
		}
	}
}

func (p *proc) signal(s os.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(s); err != nil {
		p.t.Fatal(err)
	}
}

// get polls url until want is the status, for at most a minute.
func get(t *testing.T, url string, want int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := http.Get(url)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == want {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: want %d, last status/err %v %v", url, want, resp, err)
		}
		time.Sleep(10 * time.Millisecond) // polling interval, not a wait for an event
	}
}

// logRecords parses the helper's JSON logs.
func logRecords(t *testing.T, stderr string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(stderr, "\n") {
		if !strings.HasPrefix(l, "{") {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("bad log line %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

// TestSIGTERMStopsStagesInOrder proves the shutdown contract of
// docs/architecture.md on a real process: SIGTERM flips /readyz to 503 while the listener is still
// open, then every stage stops in order, each finishing before the next
// begins, each logged with its duration, and the process exits 0.
func TestSIGTERMStopsStagesInOrder(t *testing.T) {
	t.Parallel()
	p := startHelper(t, "20s", "gate:0s:gate,http:5s:http,consumers:2s:ok,relay:2s:ok,charger:2s:ok,kafka:1s:ok,pool:1s:ok")
	addr := strings.TrimPrefix(p.next(), "addr ")
	// Start runs in reverse stop order: the pool first, the gate last.
	p.expect("event start pool", "event start kafka", "event start charger", "event start relay",
		"event start consumers", "event start http", "event start gate")
	get(t, "http://"+addr+"/readyz", http.StatusOK)

	p.signal(syscall.SIGTERM)
	p.expect("event stop-begin gate")
	// The gate holds the first stage: readiness is already off, and the
	// HTTP server, stopped only in the next stage, still answers.
	get(t, "http://"+addr+"/readyz", http.StatusServiceUnavailable)
	get(t, "http://"+addr+"/release", http.StatusOK)
	p.expect("event stop-end gate")
	lines, code := p.rest()
	want := []string{
		"event stop-begin http", "event stop-end http",
		"event stop-begin consumers", "event stop-end consumers",
		"event stop-begin relay", "event stop-end relay",
		"event stop-begin charger", "event stop-end charger",
		"event stop-begin kafka", "event stop-end kafka",
		"event stop-begin pool", "event stop-end pool",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Fatalf("events:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	if code != 0 {
		t.Fatalf("exit %d, want 0; stderr:\n%s", code, p.stderr.String())
	}
	if _, err := http.Get("http://" + addr + "/readyz"); err == nil {
		t.Fatal("listener still open after exit")
	}
	var stages []string
	for _, r := range logRecords(t, p.stderr.String()) {
		if r["msg"] == "stage stopped" {
			if _, ok := r["duration"]; !ok {
				t.Errorf("stage log without duration: %v", r)
			}
			stages = append(stages, r["stage"].(string))
		}
	}
	if got := strings.Join(stages, ","); got != "gate,http,consumers,relay,charger,kafka,pool" {
		t.Fatalf("logged stages %s", got)
	}
}

// TestSecondSignalHardStops proves that a second signal does not wait for
// the stage in hand: a stage with an hour of budget is hard-stopped at once,
// the stages after it are hard-stopped without a soft stop, and Run reports
// the hard stop (exit 1).
func TestSecondSignalHardStops(t *testing.T) {
	t.Parallel()
	p := startHelper(t, "3h", "slow:1h:hang,after:1h:ok")
	p.expect("event start after", "event start slow")
	p.signal(syscall.SIGTERM)
	p.expect("event stop-begin slow")
	p.signal(syscall.SIGTERM)
	lines, code := p.rest()
	// Hard stops run concurrently: compare as a set.
	got := map[string]bool{}
	for _, l := range lines {
		got[l] = true
	}
	for _, w := range []string{"event hardstop slow", "event stop-end slow", "event hardstop after"} {
		if !got[w] {
			t.Errorf("missing %q in %q", w, lines)
		}
	}
	if got["event stop-begin after"] {
		t.Errorf("stage after the hard stop was soft-stopped: %q", lines)
	}
	if code != 1 || !strings.Contains(p.stderr.String(), "hard stop on second signal") {
		t.Fatalf("exit %d, want 1 with the hard-stop error; stderr:\n%s", code, p.stderr.String())
	}
}

// TestOverrunningStageIsCutOff proves that a stage past its budget is
// hard-stopped and, if even that does not end it, abandoned, and that the
// stages after it still run; that Run reports the stage cut off (exit 1,
// named), because work was left running: a supervisor must be able to tell
// this stop from a clean one; and that a stage whose component returned
// from its hard stop within the budget is logged as such, not cut off.
func TestOverrunningStageIsCutOff(t *testing.T) {
	t.Parallel()
	p := startHelper(t, "1h", "slow:2s:hang,stuck:1s:stuck,next:1s:ok")
	p.expect("event start next", "event start stuck", "event start slow")
	p.signal(syscall.SIGINT)
	lines, code := p.rest()
	want := []string{
		"event stop-begin slow", "event hardstop slow", "event stop-end slow",
		"event stop-begin stuck", "event hardstop stuck",
		"event stop-begin next", "event stop-end next",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Fatalf("events:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	stderr := p.stderr.String()
	if code != 1 || !strings.Contains(stderr, `stage "stuck" cut off`) ||
		strings.Contains(stderr, `stage "slow" cut off`) || strings.Contains(stderr, `stage "next" cut off`) {
		t.Fatalf("exit %d, want 1 with an error naming stuck (only); stderr:\n%s", code, stderr)
	}
	cut := map[string]float64{}
	hardStopped := map[string]bool{}
	for _, r := range logRecords(t, p.stderr.String()) {
		switch r["msg"] {
		case "stage exceeded its budget: cut off":
			cut[r["stage"].(string)] = r["abandoned"].(float64)
		case "stage passed its soft deadline: hard-stopped within its budget":
			hardStopped[r["stage"].(string)] = true
		}
	}
	if len(cut) != 1 || cut["stuck"] != 1 || len(hardStopped) != 1 || !hardStopped["slow"] {
		t.Fatalf("cut-off logs %v, hard-stop logs %v, want stuck cut off (1 abandoned) and slow hard-stopped; stderr:\n%s", cut, hardStopped, p.stderr.String())
	}
}

// TestHardStopWithinBudgetIsClean is the stop a newcomer saw read as a
// contradiction: a component that needs its hard stop (its Stop returns
// only then) and returns from it inside the stage's budget. The process
// exits 0, and the log names the soft deadline it passed and the hard stop
// it needed, not "exceeded its budget: cut off ... duration=751ms
// budget=1s".
func TestHardStopWithinBudgetIsClean(t *testing.T) {
	t.Parallel()
	p := startHelper(t, "1h", "consumers:1s:hang,pool:1s:ok")
	p.expect("event start pool", "event start consumers")
	p.signal(syscall.SIGTERM)
	lines, code := p.rest()
	want := []string{
		"event stop-begin consumers", "event hardstop consumers", "event stop-end consumers",
		"event stop-begin pool", "event stop-end pool",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Fatalf("events:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	stderr := p.stderr.String()
	if code != 0 || strings.Contains(stderr, "cut off") {
		t.Fatalf("exit %d, want 0 and no cut-off; stderr:\n%s", code, stderr)
	}
	var rec map[string]any
	for _, r := range logRecords(t, stderr) {
		if r["stage"] == "consumers" && r["msg"] != "stage stopping" {
			rec = r
		}
	}
	// The budget is 1s; the hard-stop window is min(300ms, a quarter):
	// the soft deadline is at 750ms.
	soft, _ := rec["soft_deadline"].(float64) // nanoseconds in JSON
	if rec == nil || rec["msg"] != "stage passed its soft deadline: hard-stopped within its budget" ||
		rec["level"] != "WARN" || soft < float64(700*time.Millisecond) || soft > float64(760*time.Millisecond) || rec["hard_stopped"] != float64(1) {
		t.Fatalf("consumers stage log %v, want the soft deadline passed (750ms) and 1 hard-stopped; stderr:\n%s", rec, stderr)
	}
}

// waitLog polls the helper's stderr until a JSON log record has msg, for at
// most a minute: the point at which a second signal is a second signal
// (signals sent back to back may be merged into one by the kernel).
func (p *proc) waitLog(msg string) {
	p.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(p.stderr.String(), `"msg":"`+msg+`"`) {
		if time.Now().After(deadline) {
			p.t.Fatalf("no %q log within a minute; stderr:\n%s", msg, p.stderr.String())
		}
		time.Sleep(5 * time.Millisecond) // polling interval
	}
}

// TestSignalCancelsBlockingStart proves that a signal during a Start that
// blocks cancels that Start's ctx: the Start returns, the stages started
// before it stop in order, the stages after it never start, and the stop
// is clean (exit 0): an operator who stops a service that is still
// starting asked for exactly that.
func TestSignalCancelsBlockingStart(t *testing.T) {
	t.Parallel()
	p := startHelper(t, "1m", "first:1s:ok,slow:1s:slowstart,pool:1s:ok")
	p.expect("event start pool", "event start slow")
	p.signal(syscall.SIGTERM)
	lines, code := p.rest()
	want := []string{"event start-cancelled slow", "event stop-begin pool", "event stop-end pool"}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Fatalf("events:\n%s\nwant:\n%s\nstderr:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"), p.stderr.String())
	}
	if code != 0 {
		t.Fatalf("exit %d, want 0; stderr:\n%s", code, p.stderr.String())
	}
}

// TestShutdownTimeoutBoundsStuckStart proves that ShutdownTimeout bounds
// the run from the first signal even when a Start ignores its ctx and never
// returns: the stage of that Start is cut off at its budget, the later
// stages still stop, and Run names the cut-off stage (exit 1). Before the
// fix the process waited for the Start for ever.
func TestShutdownTimeoutBoundsStuckStart(t *testing.T) {
	t.Parallel()
	p := startHelper(t, "1s", "slow:0s:stuckstart,pool:300ms:ok")
	p.expect("event start pool", "event start slow")
	p.signal(syscall.SIGTERM)
	lines, code := p.rest()
	want := []string{"event stop-begin pool", "event stop-end pool"}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Fatalf("events:\n%s\nwant:\n%s\nstderr:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"), p.stderr.String())
	}
	if stderr := p.stderr.String(); code != 1 || !strings.Contains(stderr, `stage "slow" cut off`) {
		t.Fatalf("exit %d, want 1 naming the cut-off stage; stderr:\n%s", code, stderr)
	}
}

// TestSecondSignalDuringStuckStart proves that a second signal is honoured
// while a Start still blocks: with an hour of ShutdownTimeout, only the
// hard stop can end the run, and it does, hard-stopping what started (no
// soft stop) and reporting the hard stop (exit 1).
func TestSecondSignalDuringStuckStart(t *testing.T) {
	t.Parallel()
	p := startHelper(t, "1h", "slow:0s:stuckstart,pool:1s:ok")
	p.expect("event start pool", "event start slow")
	p.signal(syscall.SIGTERM)
	p.waitLog("shutdown begins")
	p.signal(syscall.SIGTERM)
	lines, code := p.rest()
	want := []string{"event hardstop pool"}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Fatalf("events:\n%s\nwant:\n%s\nstderr:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"), p.stderr.String())
	}
	if stderr := p.stderr.String(); code != 1 || !strings.Contains(stderr, "hard stop on second signal") {
		t.Fatalf("exit %d, want 1 with the hard-stop error; stderr:\n%s", code, stderr)
	}
}
