package idempotency_test

import (
	"bufio"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/idemkit/idem/idempotency"
)

// TestRefusalFromHeadersDoesNotWaitForTheBody: a POST refused for its
// headers (no key, a bad key, no principal, a declared body over the limit)
// is answered at once, even though its body never arrives. net/http would
// otherwise try to read the unread body before the answer goes out, holding
// the client until a timeout.
func TestRefusalFromHeadersDoesNotWaitForTheBody(t *testing.T) {
	t.Parallel()
	mw, err := idempotency.New(idempotency.NewMemoryStore(), &idempotency.Config{Scope: principal, MaxRequestBody: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Error("the handler ran for a refused request")
	})))
	defer srv.Close()
	testCases := []struct {
		name, headers string
		want          int
	}{
		{"no key", "X-User: alice\r\nContent-Length: 100000\r\n", http.StatusBadRequest},
		{"bad key", "X-User: alice\r\nIdempotency-Key: a b\r\nContent-Length: 100000\r\n", http.StatusBadRequest},
		{"no principal", "Idempotency-Key: k0\r\nContent-Length: 100000\r\n", http.StatusUnauthorized},
		{"declared too large", "X-User: alice\r\nIdempotency-Key: k1\r\nContent-Length: 2000000\r\n", http.StatusRequestEntityTooLarge},
	}
	for _, tt := range testCases {
		t.Run(tt.name, func(t *testing.T) {
			c, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			// Headers only: the body is announced and never sent. The
			// deadline only keeps a broken server from hanging the test.
			if _, err := c.Write([]byte("POST / HTTP/1.1\r\nHost: x\r\n" + tt.headers + "\r\n")); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("no answer while the body was pending: %v", err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != tt.want || !resp.Close {
				t.Fatalf("answer %d, close %v; want %d and Connection: close", resp.StatusCode, resp.Close, tt.want)
			}
		})
	}
}
