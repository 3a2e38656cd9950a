package idempotency_test

import (
	"net"
	"strconv"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/testdb"
)

// faultProxy is a TCP proxy in front of PostgreSQL that can partition the
// network: while cut, it moves no bytes in either direction and keeps every
// connection open, as a dropped route or a stalled switch does (no RST, no
// FIN). New connections are accepted and then hang too. Heal moves the
// held bytes on.
type faultProxy struct {
	ln       net.Listener
	upstream string

	mu     sync.Mutex
	cut    chan struct{} // non-nil while cut; closed by Heal
	closed chan struct{}
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

func newFaultProxy(t *testing.T, upstream string) *faultProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{ln: ln, upstream: upstream, closed: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

// poolThrough returns a pool to db's schema whose connections go through
// a new faultProxy.
func poolThrough(t *testing.T, db *testdb.DB) (*pgxpool.Pool, *faultProxy) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	p := newFaultProxy(t, net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	addr := p.ln.Addr().(*net.TCPAddr)
	cfg.ConnConfig.Host = addr.IP.String()
	cfg.ConnConfig.Port = uint16(addr.Port)
	cfg.ConnConfig.Fallbacks = nil
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, p
}

// Partition stops every byte until Heal.
func (p *faultProxy) Partition() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut == nil {
		p.cut = make(chan struct{})
	}
}

// Heal lets the bytes through again.
func (p *faultProxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cut != nil {
		close(p.cut)
		p.cut = nil
	}
}

// pass blocks while the network is cut; false once the proxy closes.
func (p *faultProxy) pass() bool {
	p.mu.Lock()
	cut := p.cut
	p.mu.Unlock()
	if cut == nil {
		return true
	}
	select {
	case <-cut:
		return true
	case <-p.closed:
		return false
	}
}

func (p *faultProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.closed:
		c.Close()
		return false
	default:
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *faultProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			return
		}
		p.wg.Go(func() {
			if !p.pass() {
				return
			}
			u, err := net.Dial("tcp", p.upstream)
			if err != nil {
				c.Close()
				return
			}
			if !p.track(u) {
				c.Close()
				return
			}
			var wg sync.WaitGroup
			wg.Go(func() { p.pipe(u, c) })
			wg.Go(func() { p.pipe(c, u) })
			wg.Wait()
		})
	}
}

func (p *faultProxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.pass() {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return // EOF or a closed connection: close the other side too
		}
	}
}

func (p *faultProxy) close() {
	p.mu.Lock()
	close(p.closed)
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}
