// Package faultproxy is a TCP proxy for fault injection: it listens on a
// local address, forwards every accepted connection to one target, and on
// demand cuts every open connection at once (both sides get a TCP RST) or
// stalls them (bytes stop flowing in both directions, as over a network
// partition that TCP has not noticed yet).
//
// The chaos harness of examples/billing puts one in front of PostgreSQL and
// one in front of the Kafka broker, so that the services under test see
// connection resets and hangs in the middle of their work, not only clean
// process restarts.
//
// What it guarantees: bytes are forwarded unchanged and in order in each
// direction; Cut closes every connection open when it is called (a
// connection accepted concurrently with Cut may survive it); connections
// accepted after Cut returns work normally; Close closes the listener and
// every connection and waits for the proxy's goroutines.
//
// What it does not: it is not a load balancer (one target), it does not
// speak TLS or any protocol, and a stall holds data in the proxy's buffers
// (up to 32 KiB per direction and connection), so the sender's writes may
// still succeed during a stall.
package faultproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Proxy forwards connections from its listen address to Target.
type Proxy struct {
	target string
	ln     net.Listener
	dialer net.Dialer
	// ctx ends with Close, so that a dial in progress does not hold Close
	// for the dial timeout.
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex
	conns   map[*pair]struct{}
	closed  bool
	stalled chan struct{} // non-nil while stalled; closed when the stall ends
	cuts    int
	accepts int

	wg sync.WaitGroup
}

// pair is one proxied connection: the accepted side and the dialed side.
type pair struct {
	client, server net.Conn
}

// Listen starts a proxy on listenAddr ("127.0.0.1:0" for any free port)
// that forwards to target. The target need not be up: a connection accepted
// while it is down is closed at once (the client sees it reset), and later
// ones reach it once it is back.
func Listen(listenAddr, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", listenAddr)
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen %s: %w", listenAddr, err)
	}
	p := &Proxy{target: target, ln: ln, conns: map[*pair]struct{}{}, dialer: net.Dialer{Timeout: 5 * time.Second}}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address the proxy listens on.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Target is the address connections are forwarded to.
func (p *Proxy) Target() string { return p.target }

// Open is the number of proxied connections open now.
func (p *Proxy) Open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Stats reports connections accepted and connections cut so far.
func (p *Proxy) Stats() (accepted, cut int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepts, p.cuts
}

// Cut resets every open connection: both the client's side and the
// target's side are closed with SO_LINGER 0, so each peer gets an RST, not
// a clean FIN, and reads and writes in flight fail at once. A stall in
// progress ends. It returns how many connections it cut.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	conns := p.conns
	p.conns = map[*pair]struct{}{}
	p.cuts += len(conns)
	stall := p.stalled
	p.mu.Unlock()
	for c := range conns {
		c.reset()
	}
	// The stall ends only now: a pipe held at the gate must find its
	// sockets closed, not forward the held bytes in the moment before the
	// reset (seen under load: the client read the answer to a request sent
	// during the stall, after the cut). Only the stall the cut found ends:
	// one begun since is not this cut's.
	p.mu.Lock()
	if p.stalled == stall {
		p.endStallLocked()
	}
	p.mu.Unlock()
	return len(conns)
}

// Stall stops forwarding bytes on every connection, open or accepted
// meanwhile, for d (or until Cut, Resume or Close), then resumes. Each peer
// sees a connection that is up and silent. Stall does not block.
func (p *Proxy) Stall(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.stalled != nil {
		return
	}
	ch := make(chan struct{})
	p.stalled = ch
	// The timer is the only goroutine a stall starts; it ends with the
	// stall or with Close (endStallLocked closes ch first either way).
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			p.Resume()
		case <-ch:
		}
	}()
}

// Resume ends a stall early.
func (p *Proxy) Resume() {
	p.mu.Lock()
	p.endStallLocked()
	p.mu.Unlock()
}

func (p *Proxy) endStallLocked() {
	if p.stalled != nil {
		close(p.stalled)
		p.stalled = nil
	}
}

// gate blocks while the proxy is stalled; false means the connection was
// cut or the proxy closed meanwhile (done closed).
func (p *Proxy) gate(done <-chan struct{}) bool {
	for {
		p.mu.Lock()
		ch := p.stalled
		p.mu.Unlock()
		if ch == nil {
			return true
		}
		select {
		case <-ch:
		case <-done:
			return false
		}
	}
}

// Close stops accepting, closes every connection (with an RST, as Cut) and
// waits for the proxy's goroutines. Safe to call twice.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.wg.Wait()
		return nil
	}
	p.closed = true
	conns := p.conns
	p.conns = map[*pair]struct{}{}
	p.mu.Unlock()
	p.cancel()
	err := p.ln.Close()
	for c := range conns {
		c.reset()
	}
	p.Resume() // after the resets, as in Cut
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return // closed
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	server, err := p.dialer.DialContext(p.ctx, "tcp", p.target)
	if err != nil {
		resetConn(client)
		return
	}
	pr := &pair{client: client, server: server}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		pr.reset()
		return
	}
	p.conns[pr] = struct{}{}
	p.accepts++
	p.mu.Unlock()

	done := make(chan struct{})
	var once sync.Once
	finish := func() { once.Do(func() { close(done) }) }
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pipe(server, client, done, finish) }()
	go func() { defer wg.Done(); p.pipe(client, server, done, finish) }()
	wg.Wait()

	p.mu.Lock()
	_, mine := p.conns[pr]
	delete(p.conns, pr)
	p.mu.Unlock()
	if mine {
		// Ended by a peer, not by Cut: pass the close on cleanly.
		_ = client.Close()
		_ = server.Close()
	}
}

// pipe copies src to dst until either side fails. A clean EOF from src is
// passed on as a half close (CloseWrite), so protocols that shut down one
// direction first still work; any error ends both directions.
func (p *Proxy) pipe(dst, src net.Conn, done <-chan struct{}, finish func()) {
	buf := make([]byte, 32<<10)
	for {
		n, rerr := src.Read(buf)
		if n > 0 {
			if !p.gate(done) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				finish()
				closeBoth(dst, src)
				return
			}
		}
		if rerr != nil {
			if errors.Is(rerr, io.EOF) {
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
					return
				}
			}
			finish()
			closeBoth(dst, src)
			return
		}
	}
}

func closeBoth(a, b net.Conn) {
	_ = a.Close()
	_ = b.Close()
}

// reset sets SO_LINGER 0 on both sides before closing either: a pipe
// goroutine that notices the first close and closes the other side itself
// then sends an RST too, never a clean FIN.
func (c *pair) reset() {
	for _, x := range []net.Conn{c.client, c.server} {
		if tc, ok := x.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
	}
	_ = c.client.Close()
	_ = c.server.Close()
}

// resetConn closes c with SO_LINGER 0: the kernel discards unsent data and
// sends an RST.
func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}
