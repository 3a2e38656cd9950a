package testbin

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// Child is a server process started by StartChild: this test binary
// running one test function, which prints "listening ADDR" on stdout once
// it serves.
type Child struct {
	// Addr is the address the child printed.
	Addr string
	// Stderr is what the child wrote to stderr so far.
	Stderr *Buffer
	// Exited is closed once the child has exited (a SIGKILL from a
	// failpoint, or the test's cleanup).
	Exited chan struct{}
}

// StartChild runs this test binary again with -test.run=^test$ and env
// added to the environment, waits (30 s at most) for its "listening ADDR"
// line and returns it; the test fails if the child exits or stays silent
// first. The child is killed when the test ends. Crash tests use it to
// SIGKILL a real server process between two steps (through a failpoint in
// env) and start another on the same database.
func StartChild(t testing.TB, test string, env ...string) *Child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c := &Child{Stderr: &Buffer{}, Exited: make(chan struct{})}
	cmd.Stderr = c.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "listening "); ok {
				select {
				case addr <- a:
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		_ = cmd.Wait()
		close(c.Exited)
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-c.Exited })
	select {
	case c.Addr = <-addr:
	case <-c.Exited:
		t.Fatalf("the child %s exited before listening\nstderr:\n%s", test, c.Stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("the child %s did not listen within 30s\nstderr:\n%s", test, c.Stderr.String())
	}
	return c
}
