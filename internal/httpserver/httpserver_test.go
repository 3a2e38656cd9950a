package httpserver_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idemkit/idem/internal/httpserver"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// serve runs h behind New and LimitListener on a loopback port.
func serve(t *testing.T, h http.Handler, cfg httpserver.Config) string {
	t.Helper()
	c, err := cfg.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httpserver.New(h, c, nil)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(c.Limit(ln))
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
	return ln.Addr().String()
}

// readsBody answers 200 after reading the whole body, 400 if it cannot.
var readsBody = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	if _, err := io.Copy(io.Discard, r.Body); err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	w.WriteHeader(http.StatusOK)
})

// get sends GET / on a fresh connection and reads the answer; the client
// gives up after 10s, which fails the test.
func get(t *testing.T, addr string) (*http.Response, error) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprint(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("no answer within 10s")
	}
	if err != nil {
		return nil, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp, nil
}

// TestConnectionsBeyondTheLimitAreRefused: with MaxConns 3 and three
// connections held open (sending nothing), a fourth gets 503
// TOO_MANY_CONNECTIONS with Retry-After at once and is closed; once one of
// the three closes, a new connection is served.
func TestConnectionsBeyondTheLimitAreRefused(t *testing.T) {
	t.Parallel()
	addr := serve(t, readsBody, httpserver.Config{MaxConns: 3, MaxConnsPerClient: 3, ReadHeaderTimeout: 30 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 40 * time.Second})
	var held []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
	}
	// The server accepts in order; a fourth is refused once the three are
	// accepted.
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := get(t, addr)
		if err == nil && resp.StatusCode == http.StatusServiceUnavailable {
			if resp.Header.Get("Retry-After") != "1" || resp.Header.Get("Content-Type") != "application/problem+json" || !resp.Close {
				t.Fatalf("refusal: %v close %v", resp.Header, resp.Close)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a fourth connection was served (%v %v) while three were held", resp, err)
		}
	}
	_ = held[0].Close()
	deadline = time.Now().Add(20 * time.Second)
	for {
		resp, err := get(t, addr)
		if err == nil && resp.StatusCode == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no connection served after a slot freed: %v %v", resp, err)
		}
		time.Sleep(10 * time.Millisecond) // polling interval
	}
}

// TestTimeoutsCloseSlowClients: headers that never end, a body that never
// arrives and an idle keep-alive are each closed (or answered) by the
// server at their timeout.
func TestTimeoutsCloseSlowClients(t *testing.T) {
	t.Parallel()
	addr := serve(t, readsBody, httpserver.Config{ReadHeaderTimeout: 200 * time.Millisecond, ReadTimeout: 300 * time.Millisecond, IdleTimeout: 300 * time.Millisecond, WriteTimeout: 5 * time.Second})
	for _, req := range []string{
		"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: 1\r\n",
		"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{",
		"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{\r\n",
		"GET / HTTP/1.1\r\nHost: x\r\n\r\n", // then idle
	} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		fmt.Fprint(c, req)
		// Read until the server closes: an answer may come first.
		_, err = io.Copy(io.Discard, c)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Errorf("%q: held for 20s", req)
		}
		c.Close()
	}
}

func TestConfigWithDefaults(t *testing.T) {
	t.Parallel()
	def, err := (*httpserver.Config)(nil).WithDefaults()
	if err != nil || def.ReadTimeout != httpserver.ReadTimeoutDefault || def.MaxConns != httpserver.MaxConnsDefault || def.WriteTimeout <= def.ReadTimeout {
		t.Fatalf("defaults %+v %v", def, err)
	}
	srv := httpserver.New(http.NotFoundHandler(), def, nil)
	if srv.ReadHeaderTimeout != def.ReadHeaderTimeout || srv.ReadTimeout != def.ReadTimeout || srv.WriteTimeout != def.WriteTimeout ||
		srv.IdleTimeout != def.IdleTimeout || srv.MaxHeaderBytes != def.MaxHeaderBytes {
		t.Fatalf("server %+v does not carry %+v", srv, def)
	}
	for _, tt := range []struct {
		cfg   httpserver.Config
		field string
	}{
		{httpserver.Config{ReadTimeout: -1}, "ReadTimeout"},
		{httpserver.Config{ReadTimeout: time.Minute, WriteTimeout: time.Minute}, "WriteTimeout"},
		{httpserver.Config{ReadHeaderTimeout: time.Minute, ReadTimeout: time.Second}, "ReadHeaderTimeout"},
		{httpserver.Config{MaxConns: -1}, "MaxConns"},
		{httpserver.Config{MaxHeaderBytes: 100}, "MaxHeaderBytes"},
	} {
		_, err := tt.cfg.WithDefaults()
		if !errors.Is(err, httpserver.ErrInvalidConfig) || !strings.Contains(err.Error(), tt.field) {
			t.Errorf("%+v: %v, want an error naming %s", tt.cfg, err, tt.field)
		}
	}
}

// TestFromEnv reads every limit under a prefix. Not parallel: it sets the
// environment.
func TestFromEnv(t *testing.T) {
	for k, v := range map[string]string{
		"T_READ_HEADER_TIMEOUT": "1s", "T_READ_TIMEOUT": "2s", "T_WRITE_TIMEOUT": "3s",
		"T_IDLE_TIMEOUT": "4s", "T_MAX_HEADER_BYTES": "8192", "T_MAX_CONNS": "7",
		"T_MAX_CONNS_PER_CLIENT": "5", "T_MAX_REQUESTS_PER_CONN": "9", "T_MAX_CONN_AGE": "5m",
	} {
		t.Setenv(k, v)
	}
	c, err := httpserver.FromEnv("T_")
	want := httpserver.Config{ReadHeaderTimeout: time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 3 * time.Second, IdleTimeout: 4 * time.Second, MaxHeaderBytes: 8192, MaxConns: 7,
		MaxConnsPerClient: 5, MaxRequestsPerConn: 9, MaxConnAge: 5 * time.Minute}
	if err != nil || c != want {
		t.Fatalf("%+v %v, want %+v", c, err, want)
	}
	t.Setenv("T_MAX_CONNS", "many")
	if _, err := httpserver.FromEnv("T_"); err == nil || !strings.Contains(err.Error(), "T_MAX_CONNS") {
		t.Fatalf("bad T_MAX_CONNS: %v", err)
	}
	t.Setenv("T_MAX_CONNS", "7")
	t.Setenv("T_WRITE_TIMEOUT", "1s")
	if _, err := httpserver.FromEnv("T_"); err == nil || !strings.Contains(err.Error(), "WriteTimeout") {
		t.Fatalf("write timeout below the read timeout: %v", err)
	}
}

// TestListenerCountsAndCloseEndsRefusals: Open and Refused count what the
// listener serves and refuses, and Close returns only once the refusals in
// flight have ended, so that a stopped server leaves nothing running: a
// refused client whose header never ends would otherwise hold a goroutine
// for a second after Close. Not parallel: it looks for refusals in every
// goroutine's stack, and another test's refusal would be one (make test
// once saw a parallel test's refusal draining its client).
func TestListenerCountsAndCloseEndsRefusals(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := httpserver.LimitListener(raw, 1)
	accepted := make(chan net.Conn)
	acceptErr := make(chan error, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				acceptErr <- err
				return
			}
			accepted <- c
		}
	}()
	held, err := net.Dial("tcp", raw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	served := <-accepted
	if ln.Open() != 1 || ln.Refused() != 0 {
		t.Fatalf("one connection served: Open %d Refused %d", ln.Open(), ln.Refused())
	}
	slow, err := net.Dial("tcp", raw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	fmt.Fprint(slow, "GET / HTTP/1.1\r\nHost: x\r\n") // a header that never ends
	for deadline := time.Now().Add(20 * time.Second); ln.Refused() != 1; {
		if time.Now().After(deadline) {
			t.Fatalf("the second connection was not refused: Refused %d", ln.Refused())
		}
		time.Sleep(5 * time.Millisecond) // polling interval
	}
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-acceptErr; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v", err)
	}
	// The refused connection is closed by then, and no refusal runs.
	_ = slow.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadAll(slow); errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the refused connection is still open after Close: %v", err)
	}
	buf := make([]byte, 1<<20)
	if stacks := string(buf[:runtime.Stack(buf, true)]); strings.Contains(stacks, "httpserver.answerRefusal") {
		t.Fatalf("a refusal still runs after Close:\n%s", stacks)
	}
	served.Close()
	if ln.Open() != 0 {
		t.Fatalf("Open %d after the served connection closed", ln.Open())
	}
}

// TestReadEnvKeepsProgramDefaults: ReadEnv changes only the fields whose
// variable is set, so a program keeps defaults of its own. Not parallel:
// it sets the environment.
func TestReadEnvKeepsProgramDefaults(t *testing.T) {
	t.Setenv("P_READ_TIMEOUT", "7s")
	t.Setenv("P_MAX_CONNS", "9")
	c := httpserver.Config{ReadTimeout: time.Second, WriteTimeout: time.Minute, MaxConns: 3, MaxHeaderBytes: 8192}
	if err := c.ReadEnv("P_"); err != nil {
		t.Fatal(err)
	}
	want := httpserver.Config{ReadTimeout: 7 * time.Second, WriteTimeout: time.Minute, MaxConns: 9, MaxHeaderBytes: 8192}
	if c != want {
		t.Fatalf("%+v, want %+v", c, want)
	}
	t.Setenv("P_IDLE_TIMEOUT", "0")
	if err := c.ReadEnv("P_"); err == nil || !strings.Contains(err.Error(), "P_IDLE_TIMEOUT") {
		t.Fatalf("P_IDLE_TIMEOUT=0: %v", err)
	}
}

// keepAlive is a real TCP client from the loopback address src that sends
// GET requests on one keep-alive connection.
type keepAlive struct {
	c  net.Conn
	br *bufio.Reader
}

func dialFrom(t *testing.T, src, addr string) (*keepAlive, error) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = c.Close() })
	return &keepAlive{c: c, br: bufio.NewReader(c)}, nil
}

// get sends GET path and reads the answer; ok is false when the
// connection was refused or closed.
func (k *keepAlive) get(path string) (*http.Response, bool) {
	_ = k.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(k.c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path); err != nil {
		return nil, false
	}
	resp, err := http.ReadResponse(k.br, nil)
	if err != nil {
		return nil, false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp, resp.StatusCode == http.StatusOK
}

// TestOneClientCannotStarveReadyz: one client address opens as many
// keep-alive connections as it can and keeps them busy; another (the
// orchestrator's probe) still gets /readyz 200, because one address holds
// at most MaxConnsPerClient slots. Then two addresses fill every slot
// with idle keep-alives: the probe's connection sheds the longest idle
// one and is served. On main the first client held all 16 slots and the
// probe got 503 TOO_MANY_CONNECTIONS.
func TestOneClientCannotStarveReadyz(t *testing.T) {
	t.Parallel()
	c, err := (&httpserver.Config{MaxConns: 16}).WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httpserver.New(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) }), c, nil)
	lim := c.Limit(ln)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lim)
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
	addr := ln.Addr().String()

	var attacker []*keepAlive
	for range 16 {
		k, err := dialFrom(t, "127.0.0.2", addr)
		if err != nil {
			continue
		}
		if _, ok := k.get("/healthz"); ok {
			attacker = append(attacker, k)
		}
	}
	if len(attacker) != c.MaxConnsPerClient {
		t.Errorf("one address holds %d connections, want %d", len(attacker), c.MaxConnsPerClient)
	}
	probe := func() int {
		k, err := dialFrom(t, "127.0.0.1", addr)
		if err != nil {
			return 0
		}
		resp, _ := k.get("/readyz")
		_ = k.c.Close()
		if resp == nil {
			return 0
		}
		return resp.StatusCode
	}
	if code := probe(); code != http.StatusOK {
		t.Fatalf("/readyz while one client holds what it can: %d, want 200", code)
	}
	// A second address takes the other half: every slot is held by idle
	// keep-alives.
	for range 8 {
		if k, err := dialFrom(t, "127.0.0.3", addr); err == nil {
			if _, ok := k.get("/healthz"); ok {
				attacker = append(attacker, k)
			}
		}
	}
	if code := probe(); code != http.StatusOK {
		t.Fatalf("/readyz with every slot held idle: %d, want 200 (an idle one shed)", code)
	}
	if lim.Shed() == 0 {
		t.Error("no idle connection was shed")
	}
}

// TestConnectionLifeIsBounded: a keep-alive connection is closed after
// MaxRequestsPerConn requests, and after the first request past
// MaxConnAge.
func TestConnectionLifeIsBounded(t *testing.T) {
	t.Parallel()
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	addr := serve(t, ok, httpserver.Config{MaxRequestsPerConn: 3})
	k, err := dialFrom(t, "127.0.0.1", addr)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		resp, _ := k.get("/")
		if resp == nil || resp.Close != (i == 3) {
			t.Fatalf("request %d: %v (close %v)", i, resp, resp != nil && resp.Close)
		}
	}
	if _, ok := k.get("/"); ok {
		t.Fatal("a fourth request was served on the connection")
	}

	addr = serve(t, ok, httpserver.Config{MaxConnAge: 100 * time.Millisecond})
	k, err = dialFrom(t, "127.0.0.1", addr)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, _ := k.get("/")
		if resp == nil {
			t.Fatal("the connection closed without a Connection: close answer")
		}
		if resp.Close {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a connection outlived MaxConnAge")
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
}
