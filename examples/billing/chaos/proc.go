package chaos

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc supervises one child process across restarts: same binary, args,
// environment and port every time, output appended to one log file.
type proc struct {
	name string
	bin  string
	args []string
	env  []string
	// addr is host:port the process listens on (chosen by us, stable
	// across restarts).
	addr string
	// ready reports whether the process answers; polled after start.
	ready func(ctx context.Context) bool
	log   *os.File
	// out is what the child writes to: the log, with every line starting
	// with markerPrefix also handed to onMarker.
	out *lineTap
	// moreEnv, when set, adds to env at every start (the failpoints armed
	// in this incarnation).
	moreEnv func() []string
	// onCrash, when set, is called (on its own goroutine) when the process
	// exits on its own after it was ready: not stopped by the harness, not
	// during a start.
	onCrash func(p *proc)

	mu       sync.Mutex
	cmd      *exec.Cmd
	exited   chan struct{}
	exitErr  error
	starts   int
	up       bool
	stopping bool
}

// pid is the running process's id, 0 when none.
func (p *proc) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

func newProc(name, bin string, args, env []string, addr string, logDir string, ready func(context.Context) bool) (*proc, error) {
	f, err := os.OpenFile(logDir+"/"+name+".log", os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	return &proc{name: name, bin: bin, args: args, env: env, addr: addr, ready: ready, log: f, out: &lineTap{w: f}}, nil
}

// markerPrefix starts the lines a child writes for the harness: the
// failpoint package's hit lines.
const markerPrefix = "idem-failpoint: "

// lineTap writes a child's output to w and hands every complete line that
// starts with markerPrefix to onMarker. exec.Cmd copies the child's output
// into it from a pipe, so a line written just before a SIGKILL (a
// failpoint's hit line) is still read.
type lineTap struct {
	w        io.Writer
	onMarker func(line string)

	mu      sync.Mutex
	partial []byte
}

func (t *lineTap) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n, err := t.w.Write(b)
	if t.onMarker == nil {
		return n, err
	}
	t.partial = append(t.partial, b...)
	for {
		i := bytes.IndexByte(t.partial, '\n')
		if i < 0 {
			break
		}
		line := string(t.partial[:i])
		t.partial = t.partial[i+1:]
		if strings.HasPrefix(line, markerPrefix) {
			t.onMarker(line)
		}
	}
	// A child that never ends a line must not grow this without bound.
	if len(t.partial) > 64<<10 {
		t.partial = t.partial[:0]
	}
	return n, err
}

// start runs the process and waits until ready answers true, the process
// exits, or ctx ends.
func (p *proc) start(ctx context.Context) error {
	if p.running() {
		return fmt.Errorf("chaos: %s already running", p.name)
	}
	var more []string
	if p.moreEnv != nil {
		more = p.moreEnv()
	}
	p.mu.Lock()
	if p.cmd != nil {
		p.mu.Unlock()
		return fmt.Errorf("chaos: %s already running", p.name)
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = append(append(os.Environ(), p.env...), more...)
	cmd.Stdout, cmd.Stderr = p.out, p.out
	// The output goes through a pipe: a grandchild that kept it open
	// must not hold Wait once the child is gone.
	cmd.WaitDelay = 2 * time.Second
	// If the harness dies, its children die with it instead of holding
	// ports and the broker's data directory.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p.starts++
	p.stopping = false
	fmt.Fprintf(p.log, "--- chaos: start #%d %s %v %v\n", p.starts, time.Now().Format(time.RFC3339Nano), p.args, more)
	if err := cmd.Start(); err != nil {
		p.mu.Unlock()
		return fmt.Errorf("chaos: start %s: %w", p.name, err)
	}
	exited := make(chan struct{})
	p.cmd, p.exited = cmd, exited
	p.mu.Unlock()
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.exitErr = err
		crashed := p.up && !p.stopping && p.cmd == cmd
		p.up = false
		p.mu.Unlock()
		close(exited)
		if crashed && p.onCrash != nil {
			fmt.Fprintf(p.log, "--- chaos: exited on its own (%v) %s\n", err, time.Now().Format(time.RFC3339Nano))
			p.onCrash(p)
		}
	}()

	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(startTimeout)
	for {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		ok := p.ready(rctx)
		cancel()
		if ok {
			p.mu.Lock()
			p.up = p.cmd == cmd
			p.mu.Unlock()
			return nil
		}
		select {
		case <-exited:
			p.reap(cmd)
			return fmt.Errorf("chaos: %s exited during start (%v); see %s", p.name, p.exitErr, p.log.Name())
		case <-ctx.Done():
			p.signal(syscall.SIGKILL)
			return ctx.Err()
		case <-deadline:
			p.signal(syscall.SIGKILL)
			return fmt.Errorf("chaos: %s not ready after %v; see %s", p.name, startTimeout, p.log.Name())
		case <-tick.C:
		}
	}
}

const startTimeout = 60 * time.Second

// reap forgets cmd after it exited.
func (p *proc) reap(cmd *exec.Cmd) {
	p.mu.Lock()
	if p.cmd == cmd {
		p.cmd = nil
	}
	p.mu.Unlock()
}

// forget reaps an incarnation that exited on its own (see onCrash), so
// that the process can be started again.
func (p *proc) forget() {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	<-exited
	p.reap(cmd)
}

// running reports whether an incarnation is started and not yet reaped
// (up, starting, or exited and not yet stopped).
func (p *proc) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil
}

// isUp reports whether the process is running and was ready.
func (p *proc) isUp() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.up
}

// signal sends sig and waits for the exit. For SIGTERM it waits up to
// grace, then kills. It returns the exit status (-1 when killed by a
// signal) and whether the process had to be killed after the grace.
func (p *proc) stop(sig syscall.Signal, grace time.Duration) (code int, forced bool) {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.up = false
	p.stopping = true
	p.mu.Unlock()
	if cmd == nil {
		return 0, false
	}
	fmt.Fprintf(p.log, "--- chaos: %v %s\n", sig, time.Now().Format(time.RFC3339Nano))
	_ = cmd.Process.Signal(sig)
	select {
	case <-exited:
	case <-time.After(grace):
		forced = true
		_ = cmd.Process.Kill()
		<-exited
	}
	p.reap(cmd)
	code = cmd.ProcessState.ExitCode()
	return code, forced
}

func (p *proc) signal(sig syscall.Signal) { p.stop(sig, 30*time.Second) }

// close stops the process (SIGTERM, then SIGKILL after grace) and closes
// its log.
func (p *proc) close(grace time.Duration) {
	p.stop(syscall.SIGTERM, grace)
	_ = p.log.Close()
}

// freePort asks the kernel for a free TCP port on 127.0.0.1.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// httpReady returns a readiness probe: GET url answers 200.
func httpReady(hc *http.Client, url string) func(context.Context) bool {
	return func(ctx context.Context) bool {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false
		}
		resp, err := hc.Do(req)
		if err != nil {
			return false
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
}

// tcpReady returns a readiness probe: addr accepts a TCP connection.
func tcpReady(addr string) func(context.Context) bool {
	return func(ctx context.Context) bool {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return false
		}
		c.Close()
		return true
	}
}
