package redisstore_test

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisServerBin is the redis-server the restart tests start (.ci/run
// installs it with apt).
const redisServerBin = "/usr/bin/redis-server"

// ownServer is a redis-server of a test's own: a free port, its own data
// directory, killed when the test ends. The shared server runs with
// persistence off, so what survives a crash can only be shown on one's own.
type ownServer struct {
	t    *testing.T
	dir  string
	port int
	args []string
	cmd  *exec.Cmd
	done chan struct{}
}

func startOwnServer(t *testing.T, args ...string) *ownServer {
	t.Helper()
	s := &ownServer{t: t, dir: t.TempDir(), port: freePort(t), args: args}
	s.start()
	t.Cleanup(func() { s.kill() })
	return s
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func (s *ownServer) addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// start runs redis-server on the same port and data directory as before,
// and waits until it answers PING (it has loaded its data by then).
func (s *ownServer) start() {
	t := s.t
	t.Helper()
	args := append([]string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--dir", s.dir,
		"--logfile", filepath.Join(s.dir, "redis.log"), "--daemonize", "no", "--save", ""}, s.args...)
	s.cmd = exec.Command(redisServerBin, args...)
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", redisServerBin, err)
	}
	done := make(chan struct{})
	s.done = done
	go func(cmd *exec.Cmd) { _ = cmd.Wait(); close(done) }(s.cmd)
	c := redis.NewClient(&redis.Options{Addr: s.addr(), MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		select {
		case <-done:
			t.Fatalf("redis-server exited at start: %v\n%s", err, s.log())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server did not answer PING within 30s: %v\n%s", err, s.log())
		}
	}
}

// kill sends SIGKILL and waits for the process to be gone: no shutdown,
// no final fsync, no snapshot.
func (s *ownServer) kill() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
}

func (s *ownServer) log() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	return string(b)
}
