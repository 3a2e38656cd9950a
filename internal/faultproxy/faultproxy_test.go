package faultproxy_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idemkit/idem/internal/faultproxy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echoServer answers each line with "echo: line" and records the errors
// its connections end with.
type echoServer struct {
	ln   net.Listener
	wg   sync.WaitGroup
	mu   sync.Mutex
	errs []error
}

func newEcho(t *testing.T) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &echoServer{ln: ln}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						s.mu.Lock()
						s.errs = append(s.errs, err)
						s.mu.Unlock()
						return
					}
					if _, err := io.WriteString(c, "echo: "+line); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		s.wg.Wait()
	})
	return s
}

func (s *echoServer) resets() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, err := range s.errs {
		if errors.Is(err, syscall.ECONNRESET) {
			n++
		}
	}
	return n
}

func newProxy(t *testing.T, target string) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.Listen("127.0.0.1:0", target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

type client struct {
	c net.Conn
	r *bufio.Reader
}

func dial(t *testing.T, addr string) *client {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &client{c: c, r: bufio.NewReader(c)}
}

func (c *client) roundTrip(line string) (string, error) {
	if err := c.c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return "", err
	}
	if _, err := io.WriteString(c.c, line+"\n"); err != nil {
		return "", err
	}
	got, err := c.r.ReadString('\n')
	return strings.TrimSuffix(got, "\n"), err
}

// waitFor polls cond until it holds or 10s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Bytes flow both ways, unchanged, through several connections at once,
// including a payload larger than the proxy's buffer.
func TestForwardsBothWays(t *testing.T) {
	t.Parallel()
	echo := newEcho(t)
	p := newProxy(t, echo.ln.Addr().String())
	big := strings.Repeat("x", 200<<10)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", p.Addr())
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			cl := &client{c: c, r: bufio.NewReaderSize(c, 1<<20)}
			msg := string(rune('a'+i)) + big
			got, err := cl.roundTrip(msg)
			if err != nil {
				errs <- err
				return
			}
			if got != "echo: "+msg {
				errs <- errors.New("payload changed in transit")
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if acc, cut := p.Stats(); acc != 8 || cut != 0 {
		t.Errorf("stats: %d accepted, %d cut; want 8, 0", acc, cut)
	}
}

// Cut resets every open connection, on both sides, and the proxy keeps
// serving new ones.
func TestCutResetsEveryConnectionAndNewOnesWork(t *testing.T) {
	t.Parallel()
	echo := newEcho(t)
	p := newProxy(t, echo.ln.Addr().String())
	var cls []*client
	for i := range 5 {
		c := dial(t, p.Addr())
		if got, err := c.roundTrip("hello"); err != nil || got != "echo: hello" {
			t.Fatalf("conn %d before cut: %q %v", i, got, err)
		}
		cls = append(cls, c)
	}
	waitFor(t, "5 open connections", func() bool { return p.Open() == 5 })
	if n := p.Cut(); n != 5 {
		t.Fatalf("Cut cut %d connections, want 5", n)
	}
	for i, c := range cls {
		_ = c.c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err := c.r.ReadByte()
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("client %d after cut: read error %v, want ECONNRESET", i, err)
		}
	}
	// The target's side was reset too, not closed cleanly.
	waitFor(t, "the target to see 5 resets", func() bool { return echo.resets() == 5 })
	if p.Open() != 0 {
		t.Errorf("%d connections open after cut", p.Open())
	}
	c := dial(t, p.Addr())
	if got, err := c.roundTrip("again"); err != nil || got != "echo: again" {
		t.Fatalf("new connection after cut: %q %v", got, err)
	}
	if acc, cut := p.Stats(); acc != 6 || cut != 5 {
		t.Errorf("stats: %d accepted, %d cut; want 6, 5", acc, cut)
	}
}

// A stall holds the bytes in both directions until it ends; a Cut during a
// stall resets the stalled connections.
func TestStall(t *testing.T) {
	t.Parallel()
	echo := newEcho(t)
	p := newProxy(t, echo.ln.Addr().String())
	c := dial(t, p.Addr())
	if _, err := c.roundTrip("warm"); err != nil {
		t.Fatal(err)
	}
	p.Stall(time.Hour)
	if _, err := io.WriteString(c.c, "held\n"); err != nil {
		t.Fatal(err)
	}
	// Absence of an answer can only be observed for a while.
	_ = c.c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := c.r.ReadByte(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read during stall: %v, want a deadline error", err)
	}
	p.Resume()
	_ = c.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if got, err := c.r.ReadString('\n'); err != nil || got != "echo: held\n" {
		t.Fatalf("after resume: %q %v", got, err)
	}

	p.Stall(time.Hour)
	if _, err := io.WriteString(c.c, "stuck\n"); err != nil {
		t.Fatal(err)
	}
	if n := p.Cut(); n != 1 {
		t.Fatalf("cut %d, want 1", n)
	}
	if _, err := c.r.ReadByte(); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read after cut during stall: %v, want ECONNRESET", err)
	}
	c2 := dial(t, p.Addr())
	if got, err := c2.roundTrip("fresh"); err != nil || got != "echo: fresh" {
		t.Fatalf("new connection after a stalled cut: %q %v", got, err)
	}
}

// A stall with a duration ends by itself.
func TestStallEnds(t *testing.T) {
	t.Parallel()
	echo := newEcho(t)
	p := newProxy(t, echo.ln.Addr().String())
	c := dial(t, p.Addr())
	p.Stall(50 * time.Millisecond)
	if got, err := c.roundTrip("later"); err != nil || got != "echo: later" {
		t.Fatalf("%q %v", got, err)
	}
}

// A half close (client shuts its write side) still delivers the answer.
func TestHalfClose(t *testing.T) {
	t.Parallel()
	echo := newEcho(t)
	p := newProxy(t, echo.ln.Addr().String())
	c := dial(t, p.Addr())
	if _, err := io.WriteString(c.c, "last\n"); err != nil {
		t.Fatal(err)
	}
	if err := c.c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	_ = c.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(c.r)
	if err != nil || string(b) != "echo: last\n" {
		t.Fatalf("%q %v", b, err)
	}
	waitFor(t, "the connection to close", func() bool { return p.Open() == 0 })
}

// With the target down a connection is reset at once; once it is up again
// connections work. Close ends everything.
func TestTargetDownAndClose(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	p, err := faultproxy.Listen("127.0.0.1:0", addr)
	if err != nil {
		t.Fatal(err)
	}
	// The proxy accepts and resets at once: the reset reaches the client
	// during its dial or at its first read.
	if c, err := net.Dial("tcp", p.Addr()); err == nil {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err == nil {
			t.Fatal("read through a proxy whose target is down succeeded")
		}
		c.Close()
	}
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("up\n"))
			defer c.Close()
		}
	}()
	c2 := dial(t, p.Addr())
	_ = c2.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if got, err := c2.r.ReadString('\n'); err != nil || got != "up\n" {
		t.Fatalf("target back up: %q %v", got, err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	_ = c2.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c2.r.ReadByte(); err == nil {
		t.Fatal("connection survived Close")
	}
	if _, err := net.Dial("tcp", p.Addr()); err == nil {
		t.Fatal("closed proxy still accepts")
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}
