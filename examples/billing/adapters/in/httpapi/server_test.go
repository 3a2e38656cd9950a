package httpapi_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/httpserver"
)

// serve runs f's handler behind NewServer and LimitListener on a loopback
// port, with cfg's limits; it returns the address.
func (f *fixture) serve(t *testing.T, cfg httpserver.Config) string {
	t.Helper()
	c, err := cfg.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httpserver.New(f.h, c, nil)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(httpserver.LimitListener(ln, c.MaxConns))
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
	return ln.Addr().String()
}

// dial opens a raw client connection whose reads give up after limit: a
// server that should have answered (or closed) by then has not.
func dial(t *testing.T, addr string, limit time.Duration) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	_ = c.SetDeadline(time.Now().Add(limit))
	return c
}

// readResponse reads one response from c; an EOF or reset before it (the
// server closed the connection) is errClosed, and the client's own
// deadline is a failure.
func readResponse(t *testing.T, c net.Conn, what string) (*http.Response, error) {
	t.Helper()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("%s: nothing from the server before the client's deadline: the connection is held open", what)
	}
	if err != nil {
		return nil, errClosed
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp, nil
}

var errClosed = errors.New("closed by the server")

// TestSlowBodyIsCutAtReadTimeout: an authenticated POST whose body never
// arrives (a Content-Length never met, a chunked body that stops) is cut
// when ReadTimeout ends: the server answers or closes the connection,
// instead of holding it.
func TestSlowBodyIsCutAtReadTimeout(t *testing.T) {
	t.Parallel()
	f := setup(t)
	addr := f.serve(t, httpserver.Config{ReadHeaderTimeout: 200 * time.Millisecond, ReadTimeout: 300 * time.Millisecond, WriteTimeout: 5 * time.Second})
	for _, head := range []string{
		"Content-Length: 100\r\n\r\n{\"customer_id\"",
		"Transfer-Encoding: chunked\r\n\r\n4\r\n{\"cu\r\n",
	} {
		c := dial(t, addr, 20*time.Second)
		fmt.Fprintf(c, "POST /orders HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nIdempotency-Key: slow-1\r\nContent-Type: application/json\r\n%s", aliceSecret, head)
		resp, err := readResponse(t, c, head)
		if err == nil && resp.StatusCode < 400 {
			t.Errorf("%q: %d, want the request refused", head, resp.StatusCode)
		}
	}
	if n := f.count(t, `SELECT count(*) FROM orders`); n != 0 {
		t.Fatalf("%d orders from bodies that never arrived", n)
	}
}

// TestIdleKeepAliveIsClosed: a connection that sent one request and then
// nothing is closed after IdleTimeout.
func TestIdleKeepAliveIsClosed(t *testing.T) {
	t.Parallel()
	f := setup(t)
	addr := f.serve(t, httpserver.Config{IdleTimeout: 300 * time.Millisecond})
	c := dial(t, addr, 20*time.Second)
	br := bufio.NewReader(c)
	fmt.Fprint(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("healthz: %v %v", resp, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		t.Fatalf("idle connection: %v, want it closed by the server (EOF)", err)
	}
}

// TestUnauthenticatedSlowPOSTGets401AtOnce: a POST without a valid token
// whose body is still coming (Content-Length or chunked) gets its 401
// before the body is read, long before ReadTimeout (30s here; the client
// waits 10s at most), and the connection is closed after it.
func TestUnauthenticatedSlowPOSTGets401AtOnce(t *testing.T) {
	t.Parallel()
	f := setup(t)
	addr := f.serve(t, httpserver.Config{ReadTimeout: 30 * time.Second, WriteTimeout: 40 * time.Second})
	for _, tt := range []struct{ auth, head string }{
		{"", "Content-Length: 1000\r\n\r\n{\"customer_id\""},
		{"Authorization: Bearer wrong\r\n", "Content-Length: 1000\r\n\r\n{\"customer_id\""},
		{"", "Transfer-Encoding: chunked\r\n\r\n4\r\n{\"cu\r\n"},
		{"", "Content-Length: 1000000\r\n\r\n{"},
	} {
		c := dial(t, addr, 10*time.Second)
		fmt.Fprintf(c, "POST /orders HTTP/1.1\r\nHost: x\r\n%sIdempotency-Key: k\r\n%s", tt.auth, tt.head)
		resp, err := readResponse(t, c, tt.head)
		if err != nil || resp.StatusCode != http.StatusUnauthorized || !resp.Close {
			t.Errorf("%q %q: %v %v, want 401 with Connection: close", tt.auth, tt.head, resp, err)
		}
	}
}
