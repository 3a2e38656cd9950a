// Package httpserver builds the HTTP servers of idem's programs with
// bounded resources for anonymous clients: read-header, read, write and
// idle timeouts, a header size bound (New), and a bound on open
// connections that answers the ones beyond it at once with 503
// TOO_MANY_CONNECTIONS (LimitListener). billing and paysim both serve
// through it.
// FromEnv and Config.ReadEnv read the limits from PREFIX_READ_TIMEOUT and
// the like.
//
// It guarantees that no connection is held longer than its timeouts allow
// and that at most MaxConns are open; it does not rate-limit requests, and
// a handler that reads its body must still bound it (http.MaxBytesReader or
// the idempotency middleware's MaxRequestBody).
package httpserver

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem/internal/cli"
	"github.com/idemkit/idem/internal/problem"
)

// Defaults of Config. Together they bound what an anonymous client
// can hold: a connection at most MaxConns of, a request's headers for
// ReadHeaderTimeout, its body for the rest of ReadTimeout, an idle
// keep-alive for IdleTimeout.
const (
	ReadHeaderTimeoutDefault = 5 * time.Second
	// ReadTimeoutDefault covers the headers and the whole body: a 1 MiB
	// body (the idempotency middleware's limit) at 100 KB/s fits.
	ReadTimeoutDefault = 15 * time.Second
	// WriteTimeoutDefault runs from the end of the headers to the end of
	// the response, so it must cover the body's read, the handler (its
	// idempotency lease, 30s by default) and the commit: 60s does.
	WriteTimeoutDefault = 60 * time.Second
	// IdleTimeoutDefault closes a keep-alive connection idle that long.
	// Behind a load balancer, make it longer than the balancer's own idle
	// timeout, so that the balancer, not billing, closes first.
	IdleTimeoutDefault = 60 * time.Second
	// MaxHeaderBytesDefault bounds the request line and headers: an
	// Idempotency-Key is at most 255 bytes and a token a few dozen.
	MaxHeaderBytesDefault = 64 << 10
	// MaxConnsDefault bounds the open connections of one listener.
	MaxConnsDefault = 512
	// MaxRequestsPerConnDefault: after this many requests a keep-alive
	// connection is closed (the answer says Connection: close).
	MaxRequestsPerConnDefault = 1000
	// MaxConnAgeDefault: a connection older than this is closed after its
	// current request.
	MaxConnAgeDefault = 10 * time.Minute
)

// ErrInvalidConfig is a Config that WithDefaults refuses.
var ErrInvalidConfig = errors.New("httpserver: invalid config")

// Config bounds the resources of one HTTP listener. The environment
// variable of each field is FromEnv's, with billing's prefix HTTP_.
type Config struct {
	// ReadHeaderTimeout bounds reading a request's line and headers
	// (HTTP_READ_HEADER_TIMEOUT). Defaults to ReadHeaderTimeoutDefault (5s).
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole request, body included
	// (HTTP_READ_TIMEOUT): a body that never arrives, or arrives a byte at
	// a time, is cut there. Defaults to ReadTimeoutDefault (15s).
	ReadTimeout time.Duration
	// WriteTimeout bounds a request from the end of its headers to the end
	// of its response (HTTP_WRITE_TIMEOUT); it must exceed ReadTimeout.
	// Defaults to WriteTimeoutDefault (60s).
	WriteTimeout time.Duration
	// IdleTimeout closes a keep-alive connection that sends no new request
	// (HTTP_IDLE_TIMEOUT). Defaults to IdleTimeoutDefault (60s).
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds the request line and headers
	// (HTTP_MAX_HEADER_BYTES); larger requests get 431. Defaults to
	// MaxHeaderBytesDefault (64 KiB).
	MaxHeaderBytes int
	// MaxConns bounds the open connections (HTTP_MAX_CONNS); see
	// LimitListener for the ones beyond it. Defaults to MaxConnsDefault
	// (512).
	MaxConns int
	// MaxConnsPerClient bounds the connections of one client address
	// (HTTP_MAX_CONNS_PER_CLIENT), so that one client cannot hold every
	// slot. Behind a load balancer, whose connections all come from a few
	// addresses, raise it to MaxConns. Defaults to half of MaxConns (at
	// least 1).
	MaxConnsPerClient int
	// MaxRequestsPerConn closes a keep-alive connection after that many
	// requests (HTTP_MAX_REQUESTS_PER_CONN). Defaults to
	// MaxRequestsPerConnDefault (1000).
	MaxRequestsPerConn int
	// MaxConnAge closes a connection after the first request that ends
	// past that age (HTTP_MAX_CONN_AGE). Defaults to MaxConnAgeDefault
	// (10m).
	MaxConnAge time.Duration
}

// FromEnv reads a Config from the environment (ReadEnv with prefix), each
// unset variable left at its default, and returns the result of
// WithDefaults. A bad value is a *cli.UsageError naming the variable or the
// field.
func FromEnv(prefix string) (Config, error) {
	var c Config
	if err := c.ReadEnv(prefix); err != nil {
		return Config{}, err
	}
	out, err := c.WithDefaults()
	if err != nil {
		return Config{}, cli.Usagef("%v", err)
	}
	return out, nil
}

// ReadEnv sets each field of c whose variable is set: prefix +
// READ_HEADER_TIMEOUT, READ_TIMEOUT, WRITE_TIMEOUT, IDLE_TIMEOUT (positive
// Go durations), MAX_HEADER_BYTES and MAX_CONNS (positive integers). A
// field whose variable is unset keeps its value, so that a program can
// start from defaults of its own, read the environment over them, and then
// its flags over that. A bad value is a *cli.UsageError naming the
// variable. It does not check the fields against each other: WithDefaults
// does, once every source is read.
func (c *Config) ReadEnv(prefix string) error {
	var err error
	for _, d := range []struct {
		key string
		dst *time.Duration
	}{
		{"READ_HEADER_TIMEOUT", &c.ReadHeaderTimeout},
		{"READ_TIMEOUT", &c.ReadTimeout},
		{"WRITE_TIMEOUT", &c.WriteTimeout},
		{"IDLE_TIMEOUT", &c.IdleTimeout},
		{"MAX_CONN_AGE", &c.MaxConnAge},
	} {
		if *d.dst, err = cli.DurationEnv(prefix+d.key, *d.dst); err != nil {
			return err
		}
	}
	if c.MaxHeaderBytes, err = cli.IntEnv(prefix+"MAX_HEADER_BYTES", c.MaxHeaderBytes); err != nil {
		return err
	}
	if c.MaxConns, err = cli.IntEnv(prefix+"MAX_CONNS", c.MaxConns); err != nil {
		return err
	}
	if c.MaxConnsPerClient, err = cli.IntEnv(prefix+"MAX_CONNS_PER_CLIENT", c.MaxConnsPerClient); err != nil {
		return err
	}
	if c.MaxRequestsPerConn, err = cli.IntEnv(prefix+"MAX_REQUESTS_PER_CONN", c.MaxRequestsPerConn); err != nil {
		return err
	}
	return nil
}

// WithDefaults returns c (nil means all defaults) with every zero field
// set to its default, and validates it: a negative value, or a
// WriteTimeout not above ReadTimeout, is an error wrapping
// ErrInvalidConfig that names the field.
func (c *Config) WithDefaults() (Config, error) {
	var out Config
	if c != nil {
		out = *c
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&out.ReadHeaderTimeout, ReadHeaderTimeoutDefault)
	def(&out.ReadTimeout, ReadTimeoutDefault)
	def(&out.WriteTimeout, WriteTimeoutDefault)
	def(&out.IdleTimeout, IdleTimeoutDefault)
	if out.MaxHeaderBytes == 0 {
		out.MaxHeaderBytes = MaxHeaderBytesDefault
	}
	if out.MaxConns == 0 {
		out.MaxConns = MaxConnsDefault
	}
	if out.MaxConnsPerClient == 0 {
		out.MaxConnsPerClient = perClientDefault(out.MaxConns)
	}
	if out.MaxRequestsPerConn == 0 {
		out.MaxRequestsPerConn = MaxRequestsPerConnDefault
	}
	def(&out.MaxConnAge, MaxConnAgeDefault)
	bad := func(format string, args ...any) (Config, error) {
		return Config{}, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	switch {
	case out.ReadHeaderTimeout < 0, out.ReadTimeout < 0, out.WriteTimeout < 0, out.IdleTimeout < 0:
		return bad("ReadHeaderTimeout, ReadTimeout, WriteTimeout and IdleTimeout must be positive")
	case out.ReadHeaderTimeout > out.ReadTimeout:
		return bad("ReadHeaderTimeout %s must not exceed ReadTimeout %s", out.ReadHeaderTimeout, out.ReadTimeout)
	case out.WriteTimeout <= out.ReadTimeout:
		return bad("WriteTimeout %s must exceed ReadTimeout %s (it runs from the end of the headers, across the body's read)", out.WriteTimeout, out.ReadTimeout)
	case out.MaxHeaderBytes < 4<<10:
		return bad("MaxHeaderBytes %d must be at least 4096", out.MaxHeaderBytes)
	case out.MaxConns < 1:
		return bad("MaxConns %d must be at least 1", out.MaxConns)
	case out.MaxConnsPerClient < 1 || out.MaxConnsPerClient > out.MaxConns:
		return bad("MaxConnsPerClient %d must be 1 to MaxConns %d", out.MaxConnsPerClient, out.MaxConns)
	case out.MaxRequestsPerConn < 1:
		return bad("MaxRequestsPerConn %d must be at least 1", out.MaxRequestsPerConn)
	case out.MaxConnAge < 0:
		return bad("MaxConnAge %s must be positive", out.MaxConnAge)
	}
	return out, nil
}

// New returns the http.Server for h with cfg's timeouts (cfg as returned
// by WithDefaults); its ErrorLog goes to log at level WARN (nil:
// slog.Default()). Serve it on LimitListener(ln, cfg.MaxConns).
func New(h http.Handler, cfg Config, log *slog.Logger) *http.Server {
	if log == nil {
		log = slog.Default()
	}
	maxReq, maxAge := cfg.MaxRequestsPerConn, cfg.MaxConnAge
	bounded := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A connection's whole life is bounded: its last request (by count
		// or by age) is answered with Connection: close.
		if lc, ok := r.Context().Value(connKey{}).(*limitConn); ok {
			n := lc.requests.Add(1)
			if (maxReq > 0 && n >= int64(maxReq)) || (maxAge > 0 && time.Since(lc.born) >= maxAge) {
				w.Header().Set("Connection", "close")
			}
		}
		h.ServeHTTP(w, r)
	})
	return &http.Server{
		Handler: bounded,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, c)
		},
		ConnState: func(c net.Conn, st http.ConnState) {
			if lc, ok := c.(*limitConn); ok {
				lc.l.setState(lc, st)
			}
		},
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		ReadTimeout:       cfg.ReadTimeout,
		WriteTimeout:      cfg.WriteTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    cfg.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

type connKey struct{}

func perClientDefault(conns int) int { return max(1, conns/2) }

// Limit is LimitListener with cfg's MaxConns and MaxConnsPerClient.
func (cfg Config) Limit(ln net.Listener) *Listener {
	l := LimitListener(ln, cfg.MaxConns)
	if cfg.MaxConnsPerClient > 0 {
		l.perClient = cfg.MaxConnsPerClient
	}
	return l
}

// LimitListener returns ln holding at most max connections open at once,
// with no bound per client address (Config.Limit sets one: by default
// half of MaxConns; paysim, whose clients are all local, uses none). When
// the pool is near full (seven eighths), each new
// connection closes the connection that has been idle longest between
// keep-alive requests: an idle connection costs its client only a new
// handshake, while a slot held idle can starve a health check.
// A connection beyond the limit is not left waiting in the kernel's
// backlog (where it would hold a client for as long as the slowest of the
// others): its request's header is read and answered at once with 503
// problem+json TOO_MANY_CONNECTIONS, Retry-After: 1 and Connection:
// close, within a second, so that the client (or the load balancer)
// retries elsewhere or later. At most 64 such answers are in flight;
// beyond that a connection is closed without one. The slots are freed when
// the server closes a connection: the read, write and idle timeouts bound
// how long anyone holds one.
func LimitListener(ln net.Listener, max int) *Listener {
	return &Listener{
		Listener:  ln,
		slots:     make(chan struct{}, max),
		refusing:  make(chan struct{}, maxRefusing),
		pending:   map[net.Conn]struct{}{},
		perClient: max,
		clients:   map[string]int{},
		idle:      map[*limitConn]time.Time{},
	}
}

// Listener is LimitListener's net.Listener.
type Listener struct {
	net.Listener
	slots    chan struct{} // one per connection being served
	refusing chan struct{} // one per refusal being written
	refused  atomic.Int64

	mu      sync.Mutex
	closed  bool
	pending map[net.Conn]struct{} // the refusals being written
	wg      sync.WaitGroup        // their goroutines

	perClient int
	cmu       sync.Mutex
	clients   map[string]int           // open connections per client address
	idle      map[*limitConn]time.Time // idle keep-alive connections, since
	shed      atomic.Int64
}

// Shed is the number of idle keep-alive connections closed to make room.
func (l *Listener) Shed() int64 { return l.shed.Load() }

func (l *Listener) setState(c *limitConn, st http.ConnState) {
	l.cmu.Lock()
	defer l.cmu.Unlock()
	if st == http.StateIdle {
		l.idle[c] = time.Now()
		return
	}
	delete(l.idle, c)
}

// shedIdle closes the connection idle longest, if any.
func (l *Listener) shedIdle() bool {
	l.cmu.Lock()
	var oldest *limitConn
	var since time.Time
	for c, t := range l.idle {
		if oldest == nil || t.Before(since) {
			oldest, since = c, t
		}
	}
	if oldest != nil {
		delete(l.idle, oldest)
	}
	l.cmu.Unlock()
	if oldest == nil {
		return false
	}
	l.shed.Add(1)
	_ = oldest.Conn.Close() // the server's read fails and it closes oldest
	return true
}

func clientOf(c net.Conn) string {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.IP.String()
	}
	host, _, err := net.SplitHostPort(c.RemoteAddr().String())
	if err != nil {
		return c.RemoteAddr().String()
	}
	return host
}

// maxRefusing bounds the refusals in flight; each takes at most
// refuseTimeout.
const (
	maxRefusing   = 64
	refuseTimeout = time.Second
)

// Open is the number of connections being served.
func (l *Listener) Open() int { return len(l.slots) }

// Refused is the number of connections refused over the limit so far,
// answered or not.
func (l *Listener) Refused() int64 { return l.refused.Load() }

// Accept returns the next connection that fits under the limit, refusing
// the others as they come. The limit is on connections, not requests: a
// keep-alive connection holds its slot until it closes.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		client := clientOf(c)
		l.cmu.Lock()
		over := l.clients[client] >= l.perClient
		if !over {
			l.clients[client]++
		}
		l.cmu.Unlock()
		if over {
			l.refused.Add(1)
			l.refuse(c)
			continue
		}
		lc := &limitConn{Conn: c, l: l, born: time.Now()}
		lc.release = func() {
			l.cmu.Lock()
			if l.clients[client]--; l.clients[client] <= 0 {
				delete(l.clients, client)
			}
			delete(l.idle, lc)
			l.cmu.Unlock()
			<-l.slots
		}
		if l.take() {
			return lc, nil
		}
		l.cmu.Lock()
		if l.clients[client]--; l.clients[client] <= 0 {
			delete(l.clients, client)
		}
		l.cmu.Unlock()
		l.refused.Add(1)
		l.refuse(c)
	}
}

// take takes a slot: at once, or, with the pool full, after closing the
// longest idle connection (waiting up to shedWait for its slot). Near
// full, it also sheds one idle connection to keep room.
func (l *Listener) take() bool {
	select {
	case l.slots <- struct{}{}:
		if near := cap(l.slots) - cap(l.slots)/8; cap(l.slots) >= 8 && len(l.slots) >= near {
			l.shedIdle()
		}
		return true
	default:
	}
	if !l.shedIdle() {
		return false
	}
	t := time.NewTimer(shedWait)
	defer t.Stop()
	select {
	case l.slots <- struct{}{}:
		return true
	case <-t.C:
		return false
	}
}

// shedWait bounds the wait for the slot of a shed connection.
const shedWait = 250 * time.Millisecond

// Close closes the listener, ends the refusals still being written (a
// client refused during a shutdown sees its connection close) and returns
// once their goroutines have: http.Server.Shutdown and Serve call it, so a
// stopped server leaves nothing running.
func (l *Listener) Close() error {
	err := l.Listener.Close()
	l.mu.Lock()
	l.closed = true
	for c := range l.pending {
		_ = c.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
	return err
}

// refuse answers c in the background, or closes it when maxRefusing
// answers are already in flight or the listener is closed.
func (l *Listener) refuse(c net.Conn) {
	select {
	case l.refusing <- struct{}{}:
	default:
		_ = c.Close()
		return
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		<-l.refusing
		_ = c.Close()
		return
	}
	l.pending[c] = struct{}{}
	l.wg.Add(1)
	l.mu.Unlock()
	go func() {
		defer l.wg.Done()
		answerRefusal(c)
		_ = c.Close()
		l.mu.Lock()
		delete(l.pending, c)
		l.mu.Unlock()
		<-l.refusing
	}()
}

// CodeTooManyConnections (503) is LimitListener's refusal.
const CodeTooManyConnections = "TOO_MANY_CONNECTIONS"

// refusal is the whole answer to a connection beyond the limit.
var refusal = func() []byte {
	body := problem.Marshal(http.StatusServiceUnavailable, CodeTooManyConnections, "too many open connections; retry later")
	return []byte("HTTP/1.1 503 Service Unavailable\r\n" +
		"Content-Type: " + problem.ContentType + "\r\n" +
		"Cache-Control: no-store\r\n" +
		"Retry-After: 1\r\n" +
		"Connection: close\r\n" +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + string(body))
}()

// answerRefusal writes the refusal to c, all of it within refuseTimeout.
// It reads the request's header first (at most 16 KiB): an answer that
// arrives before its request is one an HTTP client may take for a stray
// byte on an idle connection and discard, or never read because its own
// write failed. It then shuts its write side and drains what the client
// still sends until the client closes: closing a socket with unread data
// makes the kernel reset the connection, which can destroy the answer
// before the client reads it. A client whose header does not arrive in
// time gets no answer.
func answerRefusal(c net.Conn) {
	_ = c.SetDeadline(time.Now().Add(refuseTimeout))
	br := bufio.NewReaderSize(io.LimitReader(c, 16<<10), 4<<10)
	for continued := false; ; {
		line, err := br.ReadSlice('\n')
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return // no whole header: nothing to answer
		}
		if !continued && (string(line) == "\r\n" || string(line) == "\n") {
			break // the empty line that ends the header
		}
		continued = errors.Is(err, bufio.ErrBufferFull)
	}
	if _, err := c.Write(refusal); err != nil {
		return
	}
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(c, 64<<10))
}

// limitConn gives its slot back once, when it is closed (by net/http, by a
// handler that hijacked it, or by a shutdown).
type limitConn struct {
	net.Conn
	l        *Listener
	born     time.Time
	requests atomic.Int64
	once     sync.Once
	release  func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// CloseWrite lets net/http half-close a connection it is done with, as it
// does a *net.TCPConn's, so that an answer written before the request's
// body was read is not destroyed by a reset.
func (c *limitConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
