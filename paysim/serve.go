package paysim

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Serve accepts connections on ln and serves the simulator on them with
// the Config's bounds: ReadHeaderTimeout, ReadTimeout, WriteTimeout (plus
// Latency), IdleTimeout, MaxHeaderBytes, and at most MaxConns connections
// at once; one more is answered 503 TOO_MANY_CONNECTIONS and closed. Like
// http.Server.Serve it returns http.ErrServerClosed after Shutdown, and
// it closes ln.
func (s *Server) Serve(ln net.Listener) error {
	return s.http.Serve(s.lns.wrap(ln))
}

// Shutdown stops Serve gracefully, as http.Server.Shutdown does: no new
// connections, in-flight requests finish (each charge is either charged
// and answered or not charged), idle connections close. It waits for the
// refusals of connections over the limit too. ctx bounds the wait; when it
// ends first Shutdown returns its error and leaves the rest running.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.http.Shutdown(ctx)
	done := make(chan struct{})
	go func() { s.lns.refusing.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		if err == nil {
			err = ctx.Err()
		}
	}
	return err
}

// maxRefusing bounds the 503 answers to connections over the limit being
// written at once; beyond it a connection over the limit is closed without
// one. Each takes at most refuseTimeout.
const (
	maxRefusing   = 64
	refuseTimeout = time.Second
)

// listeners counts the connections Serve serves and refuses the ones over
// the limit.
type listeners struct {
	slots    chan struct{} // one per connection being served
	refusals chan struct{} // one per refusal being written
	refusing sync.WaitGroup
	refused  atomic.Int64
}

func newListeners(maxConns int) *listeners {
	return &listeners{slots: make(chan struct{}, maxConns), refusals: make(chan struct{}, maxRefusing)}
}

func (l *listeners) open() int { return len(l.slots) }

func (l *listeners) wrap(ln net.Listener) net.Listener { return &limitListener{Listener: ln, l: l} }

type limitListener struct {
	net.Listener
	l *listeners
}

// Accept returns the next connection that fits under the limit, refusing
// the others as they come. The limit is on connections accepted, not
// requests: a keep-alive connection holds its place until it closes, which
// the read and idle timeouts bound.
func (ll *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := ll.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case ll.l.slots <- struct{}{}:
			return &limitConn{Conn: c, release: func() { <-ll.l.slots }}, nil
		default:
			ll.l.refused.Add(1)
			ll.l.refuse(c)
		}
	}
}

// refuse answers a connection over the limit with a 503 problem and
// closes it, in the background and bounded: it reads the request's header
// first (a response sent before the request is one an HTTP client may
// discard as unsolicited), writes the answer, closes its side and drains
// what the client still sends, so that closing does not reset the
// connection before the answer is read. All of it within refuseTimeout.
func (l *listeners) refuse(c net.Conn) {
	select {
	case l.refusals <- struct{}{}:
	default:
		c.Close() // too many refusals in flight: no answer
		return
	}
	l.refusing.Add(1)
	go func() {
		defer l.refusing.Done()
		defer func() { <-l.refusals }()
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(refuseTimeout))
		br := bufio.NewReaderSize(io.LimitReader(c, 16<<10), 4<<10)
		for continued := false; ; {
			line, err := br.ReadSlice('\n')
			if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
				return // no whole request header: nothing to answer
			}
			if !continued && (string(line) == "\r\n" || string(line) == "\n") {
				break // the empty line that ends the header
			}
			continued = errors.Is(err, bufio.ErrBufferFull)
		}
		io.WriteString(c, tooManyConnsResponse)
		if cw, ok := c.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
			_, _ = io.Copy(io.Discard, io.LimitReader(c, 64<<10))
		}
	}()
}

var tooManyConnsResponse = func() string {
	body := `{"type":"https://github.com/idemkit/idem/blob/main/docs/problems.md#too-many-connections","title":"Service Unavailable","status":503,` +
		`"detail":"paysim serves a bounded number of connections at once (--max-conns); retry later","code":"` + CodeTooManyConns + `"}` + "\n"
	return "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/problem+json\r\nRetry-After: 1\r\nConnection: close\r\n" +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}()

// limitConn gives its place back once, when it is closed (by net/http, by
// a hijacker such as the drop fault, or by Shutdown).
type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// CloseWrite lets net/http half-close a connection it is done with, as it
// does for a *net.TCPConn.
func (c *limitConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

var _ http.Handler = (*Server)(nil)
