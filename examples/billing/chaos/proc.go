package chaos

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
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

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	exitErr error
	starts  int
	up      bool
}

func newProc(name, bin string, args, env []string, addr string, logDir string, ready func(context.Context) bool) (*proc, error) {
	f, err := os.OpenFile(logDir+"/"+name+".log", os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	return &proc{name: name, bin: bin, args: args, env: env, addr: addr, ready: ready, log: f}, nil
}

// start runs the process and waits until ready answers true, the process
// exits, or ctx ends.
func (p *proc) start(ctx context.Context) error {
	p.mu.Lock()
	if p.cmd != nil {
		p.mu.Unlock()
		return fmt.Errorf("chaos: %s already running", p.name)
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = p.log, p.log
	// If the harness dies, its children die with it instead of holding
	// ports and the broker's data directory.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p.starts++
	fmt.Fprintf(p.log, "--- chaos: start #%d %s %v\n", p.starts, time.Now().Format(time.RFC3339Nano), p.args)
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
		p.up = false
		p.mu.Unlock()
		close(exited)
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
