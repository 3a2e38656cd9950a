package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/problem"
	"github.com/idemkit/idem/internal/startstop"
	"github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/outbox"
)

// DB is what the console needs: statements only (a *pgxpool.Pool).
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Defaults of Config.
const (
	SampleIntervalDefault = 30 * time.Second
	SampleWindowDefault   = time.Hour
	LeaseTTLDefault       = outbox.LeaseTTLDefault
	SessionTTLDefault     = 8 * time.Hour
)

// ErrInvalidConfig is returned by New for a bad Config; the error names
// the field.
var ErrInvalidConfig = errors.New("console: invalid config")

// Config configures a Console. A nil Config means all defaults.
type Config struct {
	// Token, when set, is required on every request: as "Authorization:
	// Bearer TOKEN" or through the login form, which starts a server-side
	// session (a random id in an HttpOnly, SameSite=Strict cookie that
	// expires after SessionTTL; the token itself is never stored in the
	// browser). It is compared in constant time. Set it whenever the
	// handler is reachable from anything but loopback, or by other users
	// of the host; with no token, the console answers only requests whose
	// peer address is loopback and whose Host is a loopback name (so a
	// web page cannot reach it by DNS rebinding), and every local user
	// can act through it. `idem console` always sets one. Defaults to "".
	Token string
	// SessionTTL is how long a sign-in lasts. Defaults to
	// SessionTTLDefault (8h).
	SessionTTL time.Duration
	// TrustedProxies are the peers whose X-Forwarded-Proto: https is
	// believed: behind such a TLS-terminating proxy the cookies are
	// Secure and named __Host-, as on direct TLS. Defaults to none.
	TrustedProxies []netip.Prefix
	// DLQ reads and redrives dead-letter topics; nil hides the
	// dead-letter page. Defaults to nil.
	DLQ *kafka.DLQ
	// DeadLetterTopics are the topics the dead-letter page lists.
	// Defaults to none.
	DeadLetterTopics []string
	// SampleInterval is how often Start's sampler records the outbox
	// backlog for the chart. Defaults to SampleIntervalDefault (30s).
	SampleInterval time.Duration
	// SampleWindow is how much backlog history the chart shows.
	// Defaults to SampleWindowDefault (1h).
	SampleWindow time.Duration
	// LeaseTTL is the relays' LeaseTTL, to count expired leases.
	// Defaults to LeaseTTLDefault.
	LeaseTTL time.Duration
	// Logger receives one line per action (who, what, which event) and
	// per refused request. Defaults to slog.Default().
	Logger *slog.Logger
}

// Console is the admin web console: an http.Handler to mount on an admin
// port (or to serve with `idem console`), plus a backlog sampler with
// Start and Stop.
type Console struct {
	db     DB
	cfg    Config
	admin  *outbox.Admin
	keys   *idempotency.PostgresStore
	log    *slog.Logger
	secret []byte
	mux    *http.ServeMux
	svc    startstop.Service

	smu      sync.Mutex
	sessions map[string]*session

	mu        sync.Mutex
	samples   []sample
	keyEvents []keyEvent
}

type sample struct {
	At      time.Time
	Pending int64
	Dead    int64
}

// New returns a console over db (the schema of its search_path).
func New(db DB, cfg *Config) (*Console, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.SampleInterval == 0 {
		c.SampleInterval = SampleIntervalDefault
	}
	if c.SampleWindow == 0 {
		c.SampleWindow = SampleWindowDefault
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = LeaseTTLDefault
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.SessionTTL == 0 {
		c.SessionTTL = SessionTTLDefault
	}
	switch {
	case db == nil:
		return nil, fmt.Errorf("%w: db is nil", ErrInvalidConfig)
	case c.SampleInterval < 0:
		return nil, fmt.Errorf("%w: SampleInterval %s is negative", ErrInvalidConfig, c.SampleInterval)
	case c.SampleWindow < c.SampleInterval:
		return nil, fmt.Errorf("%w: SampleWindow %s is shorter than SampleInterval %s", ErrInvalidConfig, c.SampleWindow, c.SampleInterval)
	case c.SessionTTL < 0:
		return nil, fmt.Errorf("%w: SessionTTL %s is negative", ErrInvalidConfig, c.SessionTTL)
	case c.LeaseTTL < 0:
		return nil, fmt.Errorf("%w: LeaseTTL %s is negative", ErrInvalidConfig, c.LeaseTTL)
	}
	secret := make([]byte, 32)
	if _, err := io.ReadFull(rand.Reader, secret); err != nil {
		return nil, fmt.Errorf("console: random secret: %w", err)
	}
	con := &Console{db: db, cfg: c, admin: outbox.NewAdmin(db), keys: idempotency.NewPostgresStore(db),
		log: c.Logger, secret: secret, mux: http.NewServeMux(), sessions: map[string]*session{}}
	con.routes()
	return con, nil
}

// Start launches the backlog sampler (one GetStatus every
// SampleInterval). The handler works without it; the chart then stays
// empty. ctx bounds the start only.
func (c *Console) Start(ctx context.Context) error {
	return c.svc.Start(ctx, func(ctx context.Context, g *startstop.Group) error {
		g.Go(ctx, c.sampleLoop)
		return nil
	})
}

// Stop stops the sampler and waits for it, or for ctx.
func (c *Console) Stop(ctx context.Context) error { return c.svc.Stop(ctx) }

// HardStop is Stop that also cancels a sample in hand.
func (c *Console) HardStop(ctx context.Context) error { return c.svc.HardStop(ctx) }

func (c *Console) sampleLoop(ctx context.Context) {
	t := time.NewTicker(c.cfg.SampleInterval)
	defer t.Stop()
	for {
		c.Sample(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Sample records the outbox backlog now (the sampler calls it; a test or
// an embedding program may too).
func (c *Console) Sample(ctx context.Context) {
	wctx, cancel := startstop.WorkContext(ctx)
	defer cancel()
	wctx, cancel2 := context.WithTimeout(wctx, 10*time.Second)
	defer cancel2()
	st, err := outbox.GetStatus(wctx, c.db, c.cfg.LeaseTTL, 0)
	if err != nil {
		c.log.WarnContext(ctx, "console: backlog sample failed", "err", err)
		return
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.samples = append(c.samples, sample{At: now, Pending: st.Pending, Dead: st.Dead})
	cut := 0
	for cut < len(c.samples) && now.Sub(c.samples[cut].At) > c.cfg.SampleWindow {
		cut++
	}
	c.samples = append([]sample(nil), c.samples[cut:]...)
}

// ServeHTTP authenticates the request, checks the CSRF field of a state
// change, and serves the pages.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'")
	w.Header().Set("Referrer-Policy", "no-referrer")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if c.cfg.Token == "" && (!loopbackHost(r.Host) || !loopbackPeer(r)) {
		c.refuse(w, r, http.StatusForbidden, "this console has no token and answers only loopback peers on a loopback host name")
		return
	}
	if c.cfg.Token != "" && r.URL.Path != "/login" && !c.authenticated(r) {
		if r.Method == http.MethodGet && !strings.HasPrefix(r.Header.Get("Authorization"), "Bearer ") {
			http.Redirect(w, r, prefixOf(r)+"/login", http.StatusSeeOther)
			return
		}
		c.refuse(w, r, http.StatusUnauthorized, "a valid token is required")
		return
	}
	c.mux.ServeHTTP(w, r)
}

type prefixKey struct{}

// prefixOf is the path the console is mounted under (see Mount), "" at
// the root.
func prefixOf(r *http.Request) string {
	p, _ := r.Context().Value(prefixKey{}).(string)
	return p
}

// Mount returns c under prefix ("/admin/console") for a mux with other
// routes: mux.Handle(prefix+"/", console.Mount(prefix, c)).
func Mount(prefix string, c *Console) http.Handler {
	prefix = strings.TrimSuffix(prefix, "/")
	strip := http.StripPrefix(prefix, c)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		strip.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), prefixKey{}, prefix)))
	})
}

func loopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

const (
	sessionCookie = "idem_console_session"
	csrfCookie    = "idem_console_csrf"
	csrfField     = "csrf"
)

func (c *Console) tokenOK(got string) bool {
	return subtle.ConstantTimeCompare([]byte(got), []byte(c.cfg.Token)) == 1
}

func (c *Console) authenticated(r *http.Request) bool {
	if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		return c.tokenOK(tok)
	}
	return c.sessionOf(r) != nil
}

// csrfToken returns the form token for r's browser, setting the browser's
// random CSRF cookie when it has none. The token is an HMAC of the cookie
// under the process's secret: a page of another origin can neither read
// the cookie nor compute the token.
func (c *Console) csrfToken(w http.ResponseWriter, r *http.Request) string {
	id := ""
	if v := c.cookie(r, csrfCookie); len(v) == 32 {
		id = v
	} else {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		id = hex.EncodeToString(b)
		c.setCookie(w, r, csrfCookie, id, 0)
	}
	return c.mac(id)
}

func (c *Console) mac(id string) string {
	m := hmac.New(sha256.New, c.secret)
	m.Write([]byte("csrf/v1/" + id))
	return hex.EncodeToString(m.Sum(nil))
}

// csrfOK checks a POST's form token against the browser's cookie.
func (c *Console) csrfOK(r *http.Request) bool {
	v := c.cookie(r, csrfCookie)
	if v == "" {
		return false
	}
	return hmac.Equal([]byte(r.PostFormValue(csrfField)), []byte(c.mac(v)))
}

// actor names who acted, for the audit trail and the log: the name given
// at sign-in and the session's tag, or the bearer token's holder, or (with
// no token) the loopback peer.
func (c *Console) actor(r *http.Request) string {
	if s := c.sessionOf(r); s != nil && c.cfg.Token != "" {
		return s.name + " (console session " + s.tag + ")"
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	if c.cfg.Token != "" {
		return "console bearer token@" + host
	}
	return "console@" + host + " (no token)"
}

func (c *Console) refuse(w http.ResponseWriter, r *http.Request, status int, why string) {
	c.log.WarnContext(r.Context(), "console: request refused", "method", r.Method, "path", problem.Clip(r.URL.Path, 100), "status", status, "reason", why, "remote", r.RemoteAddr)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	fmt.Fprintln(w, why)
}
