package paysim

import (
	"bufio"
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/httpserver"
	"github.com/idemkit/idem/internal/problem"
)

// Defaults for Config.
const (
	// ScopeDefault is the principal of a request without an Authorization
	// header.
	ScopeDefault = "paysim"
	// LeaseDefault is how long a charge holds its key before a retry may
	// take it over.
	LeaseDefault = 30 * time.Second
	// MaxLedgerEntriesDefault bounds the keys a simulator remembers.
	MaxLedgerEntriesDefault = 1_000_000
	// MaxLedgerBytesDefault bounds the memory they hold: 256 MiB.
	MaxLedgerBytesDefault = 256 << 20
	// ReadHeaderTimeoutDefault bounds the reading of a request's header.
	ReadHeaderTimeoutDefault = 5 * time.Second
	// ReadTimeoutDefault bounds the reading of a whole request, body
	// included.
	ReadTimeoutDefault = 10 * time.Second
	// WriteTimeoutDefault bounds a request from the end of its header to
	// the end of its answer (Config.Latency is added to it).
	WriteTimeoutDefault = 30 * time.Second
	// IdleTimeoutDefault is how long a keep-alive connection may wait for
	// its next request.
	IdleTimeoutDefault = 60 * time.Second
	// MaxConnsDefault bounds the connections served at once.
	MaxConnsDefault = 256
	// MaxHeaderBytesDefault bounds a request's header: 32 KiB.
	MaxHeaderBytesDefault = 32 << 10
)

// Bounds of what a client sends, not configurable: they are part of the
// contract (docs/contracts.md).
const (
	// MaxFieldLength is the longest order_id or customer_id, in bytes.
	// It is the key's bound too (idem.MaxKeyLength).
	MaxFieldLength = 255
	// MaxPrincipalLength is the longest principal (the Authorization
	// header value), in bytes.
	MaxPrincipalLength = 1024
	// MinLedgerTokenLength is the shortest Config.LedgerToken.
	MinLedgerTokenLength = 16
	// LedgerPageMax is the largest limit of GET /ledger?limit=.
	LedgerPageMax = 10_000
	// maxChargeBody bounds the POST /charges body: far above what three
	// fields within their bounds take, even \u-escaped.
	maxChargeBody = 64 << 10
)

// Problem codes paysim writes itself (the idempotency middleware writes
// the IDEMPOTENCY_KEY_* ones). docs/problems.md describes each.
const (
	CodeMalformedJSON = "MALFORMED_JSON"                  // 400: not one JSON object of the contract's shape
	CodeInvalidCharge = "INVALID_CHARGE"                  // 422: a field is missing, empty or out of range
	CodeCardDeclined  = "CARD_DECLINED"                   // 402: a definitive refusal, recorded; nothing charged, ever, for this key
	CodeProviderFault = "PROVIDER_FAULT"                  // 500 or 503: injected failure or abandoned charge, nothing charged
	CodeNotFound      = "NOT_FOUND"                       // 404
	CodeMethod        = "METHOD_NOT_ALLOWED"              // 405
	CodeFieldTooLong  = "FIELD_TOO_LONG"                  // 400: order_id, customer_id or the principal is over its bound; nothing stored
	CodeLedgerFull    = "LEDGER_FULL"                     // 507: a new key on a ledger at its bounds; nothing charged or stored
	CodeInvalidPage   = "INVALID_PAGE"                    // 400: GET /ledger's after or limit is not a valid value
	CodeTooManyConns  = httpserver.CodeTooManyConnections // "TOO_MANY_CONNECTIONS", 503 with Retry-After: over Config.MaxConns; the connection is closed
)

// ErrInvalidConfig is returned by New for a bad Config; the error names
// the field.
var ErrInvalidConfig = errors.New("paysim: invalid config")

// Config sets up a simulator. A nil Config means all defaults: no faults.
type Config struct {
	// FailRate is the probability that a charge fails with 500 before
	// anything is charged (the idempotency middleware then releases the
	// key, so a retry charges afresh). Defaults to 0.
	FailRate float64
	// DropRate is the probability that a 201 (a new charge or a replay) is
	// not delivered: the charge is in the ledger and in the idempotency
	// store, and the connection is closed without a response. Defaults to
	// 0.
	DropRate float64
	// DeclineRate is the share of idempotency keys whose charge is
	// declined: a definitive 402 CARD_DECLINED problem, recorded in the
	// ledger as a decline and never charged. Whether a key is declined
	// depends on Seed and the key only, so every attempt with the key gets
	// the same answer (the first is also stored and replayed). Defaults to
	// 0.
	DeclineRate float64
	// Latency is added to every charge after its key is claimed and before
	// it is charged, which widens the in-progress window. Defaults to 0.
	Latency time.Duration
	// Seed makes faults reproducible: the n-th arrival of a given key
	// gets the same faults for the same seed, however requests interleave.
	// Defaults to 0.
	Seed uint64
	// Scope returns the principal that scopes Idempotency-Keys. Defaults to
	// the Authorization header value, or ScopeDefault without one.
	Scope func(r *http.Request) (string, error)
	// Lease is the idempotency lease of a charge in progress. Defaults to
	// LeaseDefault (30s).
	Lease time.Duration
	// Logger, when set, gets one line per charge step (started, charged,
	// fault) with the key and order, and Serve's net/http errors. Defaults
	// to nil (no logs).
	Logger *slog.Logger

	// MaxLedgerEntries bounds how many idempotency keys the simulator
	// remembers: every key that passed validation and reached the charge
	// step, whatever became of it (a charge, a decline, or a fault that
	// left it unsettled); each has at most one ledger entry. A new key
	// beyond it is answered 507 LEDGER_FULL, nothing charged; a key
	// already known keeps its answer. At most math.MaxInt32. Defaults to
	// MaxLedgerEntriesDefault (1,000,000).
	MaxLedgerEntries int
	// MaxLedgerBytes bounds the memory those keys hold, as the ledger
	// estimates it (each key's and entry's strings plus a fixed overhead
	// per key, entry and principal that covers the ledger's indexes, the
	// fault counters and the idempotency record). A new key beyond it is
	// 507 LEDGER_FULL like above. Defaults to MaxLedgerBytesDefault
	// (256 MiB).
	MaxLedgerBytes int64
	// LedgerToken, when set, lets GET /ledger with "Authorization: Bearer
	// <LedgerToken>" see every principal's entries (an auditor, the chaos
	// harness). Any other request sees only its own principal's entries.
	// At least MinLedgerTokenLength visible ASCII characters. Defaults to
	// "" (nobody sees another principal's entries).
	LedgerToken string
	// Hook is called for every event of the idempotency middleware in
	// front of POST /charges (idempotency.Config.Hook), after the
	// simulator's own counting: for tracing and metrics (package
	// idemotel's RequestHook). Defaults to nil.
	Hook func(ctx context.Context, e idempotency.Event) context.Context
	// Store holds the idempotency records of POST /charges (two-step
	// mode): a shared one (idempotency.PostgresStore, a Redis store) lets
	// several simulators, or a restarted one, answer a key alike, while
	// each keeps its own ledger. Defaults to a new
	// idempotency.MemoryStore.
	Store idempotency.Store
	// Wrap, when set, wraps the simulator's whole handler, every route:
	// the place for what must see the request before the middleware does,
	// such as the extraction of an incoming trace context (package
	// idemotel's Handler), so that the Hook's span continues the caller's
	// trace. Serve and ServeHTTP both serve the wrapped handler. Defaults
	// to nil.
	Wrap func(http.Handler) http.Handler

	// The HTTP server's bounds, used by Serve (not by ServeHTTP: a caller
	// with its own http.Server sets its own). They are the bounds of
	// idem's other programs (billing's HTTP_* limits), checked the same
	// way, with paysim's defaults.

	// ReadHeaderTimeout bounds the reading of a request's header, from the
	// connection's first byte (or the end of the previous answer); at most
	// ReadTimeout. Defaults to ReadHeaderTimeoutDefault (5s).
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds the reading of a whole request, body included: a
	// body that never arrives or trickles in is cut at this point (400
	// REQUEST_BODY_UNREADABLE when the answer can still be written) and
	// the connection closed. Defaults to ReadTimeoutDefault (10s).
	ReadTimeout time.Duration
	// WriteTimeout bounds a request from the end of its header to the end
	// of its answer; Serve adds Latency so that a slow charge is still
	// answered. With Latency it must exceed ReadTimeout, since it runs
	// across the body's read. It also bounds a GET /ledger answer.
	// Defaults to WriteTimeoutDefault (30s).
	WriteTimeout time.Duration
	// IdleTimeout is how long a keep-alive connection may wait for its
	// next request before it is closed. Defaults to IdleTimeoutDefault
	// (60s).
	IdleTimeout time.Duration
	// MaxConns bounds the connections Serve serves at once on each
	// listener it is given. One more has its request's header read and
	// answered 503 TOO_MANY_CONNECTIONS with Retry-After: 1, and is closed
	// (beyond 64 such answers in flight, closed without one). The read
	// timeouts above make sure a held connection frees its place.
	// Defaults to MaxConnsDefault (256).
	MaxConns int
	// MaxHeaderBytes bounds a request's header; a larger one is 431. At
	// least 4096. Defaults to MaxHeaderBytesDefault (32 KiB).
	MaxHeaderBytes int
}

func (c *Config) withDefaults() Config {
	var out Config
	if c != nil {
		out = *c
	}
	if out.Scope == nil {
		out.Scope = authorizationScope
	}
	if out.Lease == 0 {
		out.Lease = LeaseDefault
	}
	if out.MaxLedgerEntries == 0 {
		out.MaxLedgerEntries = MaxLedgerEntriesDefault
	}
	if out.MaxLedgerBytes == 0 {
		out.MaxLedgerBytes = MaxLedgerBytesDefault
	}
	if out.ReadHeaderTimeout == 0 {
		out.ReadHeaderTimeout = ReadHeaderTimeoutDefault
	}
	if out.ReadTimeout == 0 {
		out.ReadTimeout = ReadTimeoutDefault
	}
	if out.WriteTimeout == 0 {
		out.WriteTimeout = WriteTimeoutDefault
	}
	if out.IdleTimeout == 0 {
		out.IdleTimeout = IdleTimeoutDefault
	}
	if out.MaxConns == 0 {
		out.MaxConns = MaxConnsDefault
	}
	if out.MaxHeaderBytes == 0 {
		out.MaxHeaderBytes = MaxHeaderBytesDefault
	}
	return out
}

func (c *Config) validate() error {
	switch {
	case !(c.FailRate >= 0 && c.FailRate <= 1):
		return fmt.Errorf("%w: FailRate %v is outside [0, 1]", ErrInvalidConfig, c.FailRate)
	case !(c.DropRate >= 0 && c.DropRate <= 1):
		return fmt.Errorf("%w: DropRate %v is outside [0, 1]", ErrInvalidConfig, c.DropRate)
	case !(c.DeclineRate >= 0 && c.DeclineRate <= 1):
		return fmt.Errorf("%w: DeclineRate %v is outside [0, 1]", ErrInvalidConfig, c.DeclineRate)
	case c.Latency < 0:
		return fmt.Errorf("%w: Latency %v is negative", ErrInvalidConfig, c.Latency)
	case c.Lease < 0:
		return fmt.Errorf("%w: Lease %v is negative", ErrInvalidConfig, c.Lease)
	case c.MaxLedgerEntries < 0 || c.MaxLedgerEntries > math.MaxInt32:
		return fmt.Errorf("%w: MaxLedgerEntries %d is outside [1, %d]", ErrInvalidConfig, c.MaxLedgerEntries, math.MaxInt32)
	case c.MaxLedgerBytes < 0:
		return fmt.Errorf("%w: MaxLedgerBytes %d is negative", ErrInvalidConfig, c.MaxLedgerBytes)
	case c.LedgerToken != "" && (len(c.LedgerToken) < MinLedgerTokenLength || !visibleASCII(c.LedgerToken)):
		return fmt.Errorf("%w: LedgerToken must be at least %d visible ASCII characters", ErrInvalidConfig, MinLedgerTokenLength)
	case c.ReadHeaderTimeout < 0:
		return fmt.Errorf("%w: ReadHeaderTimeout %v is negative", ErrInvalidConfig, c.ReadHeaderTimeout)
	case c.ReadTimeout < 0:
		return fmt.Errorf("%w: ReadTimeout %v is negative", ErrInvalidConfig, c.ReadTimeout)
	case c.WriteTimeout < 0:
		return fmt.Errorf("%w: WriteTimeout %v is negative", ErrInvalidConfig, c.WriteTimeout)
	case c.IdleTimeout < 0:
		return fmt.Errorf("%w: IdleTimeout %v is negative", ErrInvalidConfig, c.IdleTimeout)
	case c.MaxConns < 0:
		return fmt.Errorf("%w: MaxConns %d is negative", ErrInvalidConfig, c.MaxConns)
	case c.MaxHeaderBytes < 0:
		return fmt.Errorf("%w: MaxHeaderBytes %d is negative", ErrInvalidConfig, c.MaxHeaderBytes)
	}
	return nil
}

func visibleASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// Stats counts what the simulator did, for tests, logs and GET /metrics.
type Stats struct {
	Charged    int64 // ledger rows inserted
	Replayed   int64 // answers replayed from the idempotency store
	InProgress int64 // 409 IDEMPOTENCY_KEY_IN_PROGRESS answers
	Reused     int64 // 409 IDEMPOTENCY_KEY_REUSED answers (middleware or ledger)
	Failed     int64 // injected 500s
	Dropped    int64 // responses dropped after the charge
	Invalid    int64 // charges rejected as malformed, over-long or invalid (400, 413, 422)
	Declined   int64 // declines recorded in the ledger (402 CARD_DECLINED)
	LedgerFull int64 // new keys refused on a full ledger (507 LEDGER_FULL)
	Refused    int64 // connections refused over Config.MaxConns (503 TOO_MANY_CONNECTIONS)
}

// Server is the payment-provider simulator, an http.Handler:
//
//	POST /charges  Idempotency-Key, {"order_id","customer_id","amount_kopecks"} → 201 {"charge_id"} or 402 CARD_DECLINED
//	GET  /ledger   ?after=&limit= → {"charges":[{"charge_id","idempotency_key","order_id","customer_id","principal","amount_kopecks","created_at"}…],
//	                  "declines":[{"decline_id","idempotency_key","order_id","customer_id","principal","amount_kopecks","code","created_at"}…],
//	                  "next"} (the caller's own entries; every principal's with Config.LedgerToken)
//	GET  /healthz  → 200
//	GET  /metrics  → Prometheus text: paysim_charges_total, paysim_replays_total, ...
//
// POST /charges is validated first (key, principal, body, field sizes,
// room in the ledger): a refusal there stores nothing, so a corrected
// retry with the same key is a new attempt. It then goes through the
// idempotency middleware over Config.Store: the same key and body replay
// the first answer (Idempotent-Replayed: true), a different body is 409
// IDEMPOTENCY_KEY_REUSED, a key still being charged is 409
// IDEMPOTENCY_KEY_IN_PROGRESS with Retry-After.
//
// Serve runs it on a listener with the Config's timeouts and connection
// bound; ServeHTTP under another http.Server gets that server's.
type Server struct {
	cfg     Config
	ledger  *Ledger
	faults  *faults
	mw      *idempotency.Middleware
	handler http.Handler
	http    *http.Server
	// maxConns is the bound of each listener Serve wraps; lns are those
	// listeners, for Stats and GET /metrics.
	maxConns int
	lnsMu    sync.Mutex
	lns      []*httpserver.Listener

	charged, replayed, inProgress, reused, failed, dropped, invalid, declined, ledgerFull atomic.Int64
}

// New returns a simulator with an empty ledger.
func New(cfg *Config) (*Server, error) {
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	s := &Server{
		cfg: c, ledger: newLedger(c.MaxLedgerEntries, c.MaxLedgerBytes),
		faults: newFaults(c.Seed, c.FailRate, c.DropRate, c.DeclineRate),
	}
	store := c.Store
	if store == nil {
		store = idempotency.NewMemoryStore()
	}
	mw, err := idempotency.New(store, &idempotency.Config{
		Scope:     c.Scope,
		Lease:     c.Lease,
		Retention: max(idempotency.RetentionDefault, c.Lease),
		Hook:      idem.JoinHooks(s.hook, c.Hook),
	})
	if err != nil {
		return nil, fmt.Errorf("paysim: %w", err)
	}
	s.mw = mw
	mux := http.NewServeMux()
	mux.Handle("POST /charges", s.gate(s.dropping(mw.Wrap(http.HandlerFunc(s.charge)))))
	mux.HandleFunc("GET /ledger", s.listLedger)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /metrics", s.metrics)
	for _, p := range []string{"/charges", "/ledger", "/healthz", "/metrics"} {
		mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
			writeProblem(w, http.StatusMethodNotAllowed, CodeMethod, clip(r.Method)+" is not allowed on "+r.URL.Path)
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, http.StatusNotFound, CodeNotFound, "no such resource: "+r.URL.Path)
	})
	s.handler = mux
	if c.Wrap != nil {
		s.handler = c.Wrap(mux)
	}
	// The server's bounds are internal/httpserver's, as billing's are;
	// the write timeout also covers the charge's Latency.
	hc, err := (&httpserver.Config{
		ReadHeaderTimeout: c.ReadHeaderTimeout, ReadTimeout: c.ReadTimeout, WriteTimeout: c.WriteTimeout + c.Latency,
		IdleTimeout: c.IdleTimeout, MaxHeaderBytes: c.MaxHeaderBytes, MaxConns: c.MaxConns,
	}).WithDefaults()
	if err != nil {
		msg := strings.TrimPrefix(err.Error(), httpserver.ErrInvalidConfig.Error()+": ")
		if c.Latency > 0 && strings.HasPrefix(msg, "WriteTimeout") {
			msg += fmt.Sprintf(" (WriteTimeout %v plus Latency %v)", c.WriteTimeout, c.Latency)
		}
		return nil, fmt.Errorf("%w: %s", ErrInvalidConfig, msg)
	}
	// net/http's own complaints (an accept error, a malformed request it
	// answered itself) go where the simulator's logs go, and nowhere
	// without a Logger: a client must not be able to write to stderr at
	// will.
	logger := c.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s.http = httpserver.New(s, hc, logger)
	s.maxConns = hc.MaxConns
	return s, nil
}

// clip bounds a piece of the request quoted in an answer, so that what
// follows it in the detail fits too.
func clip(s string) string { return problem.Clip(s, 64) }

func authorizationScope(r *http.Request) (string, error) {
	if a := r.Header.Get("Authorization"); a != "" {
		return a, nil
	}
	return ScopeDefault, nil
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

// Ledger is the simulator's ledger.
func (s *Server) Ledger() *Ledger { return s.ledger }

// Stats returns the counters so far.
func (s *Server) Stats() Stats {
	return Stats{
		Charged: s.charged.Load(), Replayed: s.replayed.Load(), InProgress: s.inProgress.Load(), Reused: s.reused.Load(),
		Failed: s.failed.Load(), Dropped: s.dropped.Load(), Invalid: s.invalid.Load(), Declined: s.declined.Load(),
		LedgerFull: s.ledgerFull.Load(), Refused: s.connections(func(l *httpserver.Listener) int64 { return l.Refused() }),
	}
}

// hook counts the middleware's answers to POST /charges.
func (s *Server) hook(ctx context.Context, e idempotency.Event) context.Context {
	switch e.Kind {
	case idempotency.EventReplay:
		s.replayed.Add(1)
	case idempotency.EventConflict:
		s.inProgress.Add(1)
	case idempotency.EventMismatch:
		s.reused.Add(1)
	}
	return ctx
}

// metrics is GET /metrics in the Prometheus text format, written by hand
// to keep the simulator free of a metrics library. Counts only: it says how
// much, never whose.
func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	st := s.Stats()
	u := s.ledger.Usage()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	fmt.Fprintf(w, "# HELP paysim_charges_total Charges written to the ledger.\n# TYPE paysim_charges_total counter\npaysim_charges_total %d\n", st.Charged)
	fmt.Fprintf(w, "# HELP paysim_replays_total Charge answers replayed from the idempotency store.\n# TYPE paysim_replays_total counter\npaysim_replays_total %d\n", st.Replayed)
	fmt.Fprintf(w, "# HELP paysim_conflicts_total 409 answers by problem code.\n# TYPE paysim_conflicts_total counter\n")
	fmt.Fprintf(w, "paysim_conflicts_total{code=%q} %d\npaysim_conflicts_total{code=%q} %d\n", idem.CodeKeyInProgress, st.InProgress, idem.CodeKeyReused, st.Reused)
	fmt.Fprintf(w, "# HELP paysim_faults_total Injected faults by kind.\n# TYPE paysim_faults_total counter\n")
	fmt.Fprintf(w, "paysim_faults_total{kind=\"fail\"} %d\npaysim_faults_total{kind=\"drop\"} %d\n", st.Failed, st.Dropped)
	fmt.Fprintf(w, "# HELP paysim_rejected_total Charges rejected as malformed, over-long or invalid.\n# TYPE paysim_rejected_total counter\npaysim_rejected_total %d\n", st.Invalid)
	fmt.Fprintf(w, "# HELP paysim_declines_total Charges declined (402 CARD_DECLINED), recorded in the ledger.\n# TYPE paysim_declines_total counter\npaysim_declines_total %d\n", st.Declined)
	fmt.Fprintf(w, "# HELP paysim_ledger_rows Rows in the ledger.\n# TYPE paysim_ledger_rows gauge\npaysim_ledger_rows %d\n", s.ledger.Len())
	fmt.Fprintf(w, "# HELP paysim_ledger_full_total New keys refused because the ledger was at its bounds (507 LEDGER_FULL).\n# TYPE paysim_ledger_full_total counter\npaysim_ledger_full_total %d\n", st.LedgerFull)
	fmt.Fprintf(w, "# HELP paysim_ledger_keys Keys the ledger remembers, against paysim_ledger_keys_max.\n# TYPE paysim_ledger_keys gauge\npaysim_ledger_keys %d\n", u.Keys)
	fmt.Fprintf(w, "# HELP paysim_ledger_keys_max The bound of paysim_ledger_keys.\n# TYPE paysim_ledger_keys_max gauge\npaysim_ledger_keys_max %d\n", u.MaxKeys)
	fmt.Fprintf(w, "# HELP paysim_ledger_bytes Estimated bytes the ledger holds, against paysim_ledger_bytes_max.\n# TYPE paysim_ledger_bytes gauge\npaysim_ledger_bytes %d\n", u.Bytes)
	fmt.Fprintf(w, "# HELP paysim_ledger_bytes_max The bound of paysim_ledger_bytes.\n# TYPE paysim_ledger_bytes_max gauge\npaysim_ledger_bytes_max %d\n", u.MaxBytes)
	fmt.Fprintf(w, "# HELP paysim_connections_open Connections being served.\n# TYPE paysim_connections_open gauge\npaysim_connections_open %d\n", s.connections(func(l *httpserver.Listener) int64 { return int64(l.Open()) }))
	fmt.Fprintf(w, "# HELP paysim_connections_refused_total Connections refused over the limit (503 TOO_MANY_CONNECTIONS).\n# TYPE paysim_connections_refused_total counter\npaysim_connections_refused_total %d\n", st.Refused)
}

// Start runs the idempotency store's purge loop until Stop or ctx ends.
// Safe to call twice.
func (s *Server) Start(ctx context.Context) error { return s.mw.Start(ctx) }

// Stop ends the purge loop. Safe to call twice and before Start.
func (s *Server) Stop(ctx context.Context) error { return s.mw.Stop(ctx) }

// gate is everything POST /charges checks before the idempotency
// middleware, in the order that lets it answer as early as possible:
//
//  1. the Idempotency-Key header and the principal, from the header alone:
//     a request without a usable key or principal is refused before its
//     body is read;
//  2. room in the ledger for a key it does not know (507 LEDGER_FULL),
//     also before the body: a full simulator does not read what it cannot
//     keep, and a key it knows (a retry) always goes on to its answer;
//  3. the body: at most maxChargeBody bytes within Config.ReadTimeout, one
//     JSON object with exactly the contract's members, ids within
//     MaxFieldLength.
//
// None of these refusals reaches the middleware, so none is stored under
// the key: a request refused by validation before anything ran leaves no
// trace (Stripe's rule), and the store holds only keys that reached the
// charge step, each counted by Ledger.admit against the ledger's bounds.
//
// An answer written before the body was read carries Connection: close:
// net/http would otherwise read (up to 256 KiB of) the unread body before
// writing it, and a body that never comes would hold the answer until the
// read timeout. The answer is sent at once; then net/http still reads what
// is left of the body before closing, so that closing does not reset the
// connection under an answer the client has not read yet, and earlyLinger
// bounds that read.
func (s *Server) gate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		early := func() {
			w.Header().Set("Connection", "close")
			_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(earlyLinger))
		}
		vs := r.Header.Values(idem.HeaderKey)
		var key string
		var err error
		if len(vs) == 1 {
			key, err = idem.ParseKey(vs[0])
		}
		if len(vs) != 1 || err != nil {
			// The middleware writes the key's problem (required or
			// invalid), without reading the body.
			early()
			next.ServeHTTP(w, r)
			return
		}
		principal, err := s.cfg.Scope(r)
		if err != nil {
			early()
			next.ServeHTTP(w, r) // the middleware's 401 IDEMPOTENCY_SCOPE_UNKNOWN
			return
		}
		if len(principal) > MaxPrincipalLength {
			s.invalid.Add(1)
			early()
			writeProblem(w, http.StatusBadRequest, CodeFieldTooLong,
				fmt.Sprintf("the principal (the Authorization header) is %d bytes, longer than %d", len(principal), MaxPrincipalLength))
			return
		}
		known := s.ledger.known(principal, key)
		if !known && s.ledger.full() {
			s.ledgerFull.Add(1)
			early()
			writeProblem(w, http.StatusInsufficientStorage, CodeLedgerFull, ledgerFullDetail)
			return
		}
		if r.ContentLength > maxChargeBody {
			s.invalid.Add(1)
			early()
			writeProblem(w, http.StatusRequestEntityTooLarge, idem.CodeBodyTooLarge, fmt.Sprintf("the body exceeds %d bytes", maxChargeBody))
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, maxChargeBody+1))
		switch {
		case err != nil:
			// Cut by the read timeout, the client gone, a broken chunked
			// encoding: nothing to charge.
			s.invalid.Add(1)
			early()
			writeProblem(w, http.StatusBadRequest, idem.CodeBodyUnreadable, "the body did not arrive whole")
			return
		case len(body) > maxChargeBody:
			s.invalid.Add(1)
			early()
			writeProblem(w, http.StatusRequestEntityTooLarge, idem.CodeBodyTooLarge, fmt.Sprintf("the body exceeds %d bytes", maxChargeBody))
			return
		}
		// The whole request is in hand: from here the charge is bounded by
		// Config.Latency and the write timeout, not by the read timeout
		// (whose expiry during a slow charge would cancel the request's
		// context and abandon the charge). Not every ResponseWriter can.
		_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
		req, status, code, msg := parseCharge(body)
		if status != 0 {
			s.invalid.Add(1)
			writeProblem(w, status, code, msg)
			return
		}
		if !known {
			if err := s.ledger.admit(principal, key, len(req.OrderID)+len(req.CustomerID)); err != nil {
				s.ledgerFull.Add(1)
				writeProblem(w, http.StatusInsufficientStorage, CodeLedgerFull, ledgerFullDetail)
				return
			}
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		next.ServeHTTP(w, r)
	})
}

// earlyLinger is how long a connection answered before its body was read
// stays open for the rest of the body.
const earlyLinger = time.Second

const ledgerFullDetail = "the simulator's ledger is at its bounds (--max-ledger-entries, --max-ledger-bytes): nothing was charged; keys it already holds are still answered"

// charge is POST /charges behind the idempotency middleware, which has
// already claimed the key for this body.
func (s *Server) charge(w http.ResponseWriter, r *http.Request) {
	key, err := idem.ParseKey(r.Header.Get(idem.HeaderKey))
	if err != nil {
		// The middleware rejects these first; kept so that the handler is
		// safe on its own.
		writeProblem(w, http.StatusBadRequest, idem.CodeKeyRequired, "POST /charges needs an Idempotency-Key")
		return
	}
	// gate has parsed the same bytes; parsed again so that the handler
	// is safe on its own.
	body, err := io.ReadAll(io.LimitReader(r.Body, maxChargeBody+1))
	if err != nil || len(body) > maxChargeBody {
		s.invalid.Add(1)
		writeProblem(w, http.StatusBadRequest, idem.CodeBodyUnreadable, "the body did not arrive whole")
		return
	}
	req, status, code, msg := parseCharge(body)
	if status != 0 {
		s.invalid.Add(1)
		writeProblem(w, status, code, msg)
		return
	}
	s.log(r.Context(), "charge started", key, req.OrderID)
	if s.cfg.Latency > 0 {
		t := time.NewTimer(s.cfg.Latency)
		select {
		case <-t.C:
		case <-r.Context().Done():
			// The client left, or the lease ended, before the charge:
			// charge nothing and answer 5xx, so that the middleware
			// releases the key and a retry charges afresh.
			t.Stop()
			s.log(r.Context(), "charge abandoned", key, req.OrderID)
			w.Header().Set("Retry-After", "1")
			writeProblem(w, http.StatusServiceUnavailable, CodeProviderFault, "the charge was abandoned before charging; retry with the same key")
			return
		}
	}
	if s.faults.hit(faultFail, key) {
		s.failed.Add(1)
		s.log(r.Context(), "charge failed (injected)", key, req.OrderID)
		writeProblem(w, http.StatusInternalServerError, CodeProviderFault, "injected failure before charging; nothing was charged")
		return
	}
	// The middleware has already resolved the scope; an error here cannot
	// happen for a request it let through.
	principal, _ := s.cfg.Scope(r)
	declineCode := ""
	if s.faults.declined(key) {
		declineCode = CodeCardDeclined
	}
	// The ledger settles the key once: a key it already knows keeps its
	// first answer (charge or decline), which is what the middleware
	// replays too, so even after the middleware's store forgot the key a
	// decline never turns into a charge.
	ch, dec, inserted, err := s.ledger.settle(Charge{IdempotencyKey: key, Principal: principal, OrderID: req.OrderID, CustomerID: req.CustomerID, AmountKopecks: req.AmountKopecks}, declineCode)
	switch {
	case errors.Is(err, ErrLedgerConflict):
		s.reused.Add(1)
		// Reached only when the middleware's store forgot the key (after
		// retention, or a restart of the store): the ledger is the last line.
		writeProblem(w, http.StatusConflict, idem.CodeKeyReused, "this Idempotency-Key was settled for a different request")
		return
	case errors.Is(err, ErrLedgerFull):
		// Only a handler used without gate, or an attempt with longer
		// ids than the one admitted, gets here. A 5xx: the middleware
		// releases the key, and nothing was charged.
		s.ledgerFull.Add(1)
		writeProblem(w, http.StatusInsufficientStorage, CodeLedgerFull, ledgerFullDetail)
		return
	}
	if dec != nil {
		if inserted {
			s.declined.Add(1)
			s.log(r.Context(), "declined", key, req.OrderID, "decline_id", dec.DeclineID)
		}
		writeProblem(w, http.StatusPaymentRequired, CodeCardDeclined, "the charge was declined ("+dec.DeclineID+"); nothing was charged and this key will not be charged")
		return
	}
	if inserted {
		s.charged.Add(1)
		s.log(r.Context(), "charged", key, req.OrderID, "charge_id", ch.ChargeID)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(chargeResponse{ChargeID: ch.ChargeID})
}

func (s *Server) log(ctx context.Context, msg, key, order string, attrs ...any) {
	if s.cfg.Logger != nil {
		s.cfg.Logger.InfoContext(ctx, msg, append([]any{"idempotency_key", key, "order_id", order}, attrs...)...)
	}
}

// parseCharge reads a POST /charges body strictly: one JSON object whose
// members are exactly order_id, customer_id and amount_kopecks, each at
// most once and spelled exactly (encoding/json would take "ORDER_ID" for
// order_id, and the last of two order_ids, so that two bodies the
// middleware fingerprints apart could name one charge, or the reverse),
// valid UTF-8, strings within MaxFieldLength without control characters,
// the amount a positive integer. A value of another shape (an object, an
// array) is refused where it starts, so nesting costs nothing. It returns
// the request, or the status, code and detail of the refusal: 400
// MALFORMED_JSON, 400 FIELD_TOO_LONG, 422 INVALID_CHARGE. The detail names
// the member, never its value.
func parseCharge(body []byte) (req chargeRequest, status int, code, detail string) {
	malformed := func(msg string) (chargeRequest, int, string, string) {
		return chargeRequest{}, http.StatusBadRequest, CodeMalformedJSON, msg
	}
	if !utf8.Valid(body) {
		return malformed("the body is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return malformed("the body is not a charge object: " + syntaxDetail(err))
	}
	seen := map[string]bool{}
	if tok != nil { // null is an object without members
		if d, ok := tok.(json.Delim); !ok || d != '{' {
			return malformed("the body is not a JSON object")
		}
		for dec.More() {
			nt, err := dec.Token()
			if err != nil {
				return malformed("the body is not a charge object: " + syntaxDetail(err))
			}
			name, _ := nt.(string)
			if seen[name] {
				return malformed(fmt.Sprintf("the member %q appears twice", name))
			}
			vt, err := dec.Token()
			if err != nil {
				return malformed("the body is not a charge object: " + syntaxDetail(err))
			}
			switch name {
			case "order_id", "customer_id":
				var v string
				switch x := vt.(type) {
				case nil:
				case string:
					v = x
				default:
					return malformed(name + " must be a string")
				}
				if name == "order_id" {
					req.OrderID = v
				} else {
					req.CustomerID = v
				}
			case "amount_kopecks":
				switch x := vt.(type) {
				case nil:
				case json.Number:
					n, err := strconv.ParseInt(string(x), 10, 64)
					if err != nil {
						return malformed("amount_kopecks must be an integer number of kopecks within int64")
					}
					req.AmountKopecks = n
				default:
					return malformed("amount_kopecks must be a number")
				}
			default:
				return malformed(fmt.Sprintf("unknown member %q (the members are order_id, customer_id, amount_kopecks)", clip(name)))
			}
			seen[name] = true
		}
		if _, err := dec.Token(); err != nil { // the closing brace
			return malformed("the body is not a charge object: " + syntaxDetail(err))
		}
	}
	if _, err := dec.Token(); err != io.EOF {
		return malformed("the body has data after the charge object")
	}
	for _, f := range []struct{ name, v string }{{"order_id", req.OrderID}, {"customer_id", req.CustomerID}} {
		if len(f.v) > MaxFieldLength {
			return chargeRequest{}, http.StatusBadRequest, CodeFieldTooLong, fmt.Sprintf("%s is %d bytes, longer than %d", f.name, len(f.v), MaxFieldLength)
		}
		if strings.ContainsFunc(f.v, unicode.IsControl) {
			return chargeRequest{}, http.StatusUnprocessableEntity, CodeInvalidCharge, f.name + " contains a control character"
		}
	}
	if msg := req.invalid(); msg != "" {
		return chargeRequest{}, http.StatusUnprocessableEntity, CodeInvalidCharge, msg
	}
	return req, 0, "", ""
}

// syntaxDetail describes a decoding error without quoting the input.
func syntaxDetail(err error) string {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("invalid JSON at byte %d", se.Offset)
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return "unexpected end of the body"
	}
	return "invalid JSON"
}

func (req *chargeRequest) invalid() string {
	var missing []string
	if strings.TrimSpace(req.OrderID) == "" {
		missing = append(missing, "order_id")
	}
	if strings.TrimSpace(req.CustomerID) == "" {
		missing = append(missing, "customer_id")
	}
	if len(missing) > 0 {
		return "missing or empty: " + strings.Join(missing, ", ")
	}
	if req.AmountKopecks <= 0 {
		return fmt.Sprintf("amount_kopecks must be positive, got %d", req.AmountKopecks)
	}
	return ""
}

// listLedger is GET /ledger: the caller's view of the ledger (its own
// principal's entries; every principal's with Config.LedgerToken), whole
// or a page of it. The answer is streamed in chunks of the view taken
// under the ledger's lock one at a time, so that a large ledger costs the
// server a chunk of memory per reader, not a copy of the ledger; the
// entries never change, so the chunks are one snapshot, of the instant the
// view's length was read.
func (s *Server) listLedger(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	after, limit := 0, -1
	for _, p := range []struct {
		name string
		dst  *int
		min  int
		max  int
	}{{"after", &after, 0, math.MaxInt32}, {"limit", &limit, 1, LedgerPageMax}} {
		vs, ok := q[p.name]
		if !ok || (p.name == "after" && len(vs) == 1 && vs[0] == "") {
			continue // no after (or an empty one): from the start
		}
		n, err := strconv.Atoi(vs[0])
		if len(vs) != 1 || err != nil || n < p.min || n > p.max {
			writeProblem(w, http.StatusBadRequest, CodeInvalidPage,
				fmt.Sprintf("%s must be one integer in [%d, %d]", p.name, p.min, p.max))
			return
		}
		*p.dst = n
	}
	all := s.ledgerAdmin(r)
	principal := ""
	if !all {
		p, err := s.cfg.Scope(r)
		if err != nil {
			writeProblem(w, http.StatusUnauthorized, idem.CodeScopeUnknown, "the request has no principal whose ledger to show")
			return
		}
		principal = p
	}
	n := s.ledger.viewLen(principal, all)
	end := n
	if limit > 0 {
		end = min(n, after+limit)
	}
	from := min(after, end)

	w.Header().Set("Content-Type", "application/json")
	bw := bufio.NewWriterSize(w, 32<<10)
	const chunk = 1000
	var werr error
	write := func(b []byte) {
		if werr == nil {
			_, werr = bw.Write(b)
		}
	}
	for pass, open := range []string{`{"charges":[`, `],"declines":[`} {
		write([]byte(open))
		first := true
		for i := from; i < end && werr == nil; i += chunk {
			cs, ds := s.ledger.chunk(principal, all, i, min(i+chunk, end), pass == 1)
			for _, v := range anySlice(cs, ds) {
				b, _ := json.Marshal(v)
				if !first {
					write([]byte{','})
				}
				write(b)
				first = false
			}
		}
	}
	write([]byte{']'})
	if end < n {
		write([]byte(`,"next":"` + strconv.Itoa(end) + `"`))
	}
	write([]byte("}\n"))
	if werr == nil {
		bw.Flush()
	}
}

func anySlice(cs []Charge, ds []Decline) []any {
	out := make([]any, 0, len(cs)+len(ds))
	for _, c := range cs {
		out = append(out, c)
	}
	for _, d := range ds {
		out = append(out, d)
	}
	return out
}

// ledgerAdmin reports whether r carries "Authorization: Bearer
// <Config.LedgerToken>", compared in constant time.
func (s *Server) ledgerAdmin(r *http.Request) bool {
	if s.cfg.LedgerToken == "" {
		return false
	}
	got := r.Header.Get("Authorization")
	return subtle.ConstantTimeCompare([]byte(got), []byte("Bearer "+s.cfg.LedgerToken)) == 1
}

// dropping injects "charged, then the connection broke": it lets the
// middleware and the handler finish (the charge is in the ledger and the
// response in the idempotency store), then, for a drawn share of 201s,
// closes the connection instead of answering.
func (s *Server) dropping(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		buf := &bufferedWriter{w: w, header: http.Header{}}
		next.ServeHTTP(buf, r)
		key, _ := idem.ParseKey(r.Header.Get(idem.HeaderKey))
		if buf.statusCode() == http.StatusCreated && s.faults.hit(faultDrop, key) {
			// Step by step, what the client sees: it sent the request, the
			// provider charged and stored the answer, and the connection
			// closes before a single response byte. The client cannot
			// tell this from a request that never arrived, which is the
			// whole reason the retry must carry the same key.
			s.dropped.Add(1)
			if s.cfg.Logger != nil {
				s.cfg.Logger.InfoContext(r.Context(), "response dropped (injected)", "idempotency_key", key)
			}
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				conn.Close()
				return
			}
			// No hijacking (HTTP/2): abort the stream instead.
			panic(http.ErrAbortHandler)
		}
		buf.flushTo(w)
	})
}

// bufferedWriter holds a response until dropping decides its fate.
type bufferedWriter struct {
	w      http.ResponseWriter
	header http.Header
	status int
	body   bytes.Buffer
}

func (b *bufferedWriter) Header() http.Header { return b.header }

func (b *bufferedWriter) WriteHeader(status int) {
	if b.status == 0 && status >= 200 {
		b.status = status
	}
}

func (b *bufferedWriter) Write(p []byte) (int, error) {
	if b.status == 0 {
		b.status = http.StatusOK
	}
	return b.body.Write(p)
}

// Unwrap lets http.ResponseController reach the connection (deadlines).
func (b *bufferedWriter) Unwrap() http.ResponseWriter { return b.w }

func (b *bufferedWriter) statusCode() int {
	if b.status == 0 {
		return http.StatusOK
	}
	return b.status
}

func (b *bufferedWriter) flushTo(w http.ResponseWriter) {
	h := w.Header()
	for k, v := range b.header {
		h[k] = v
	}
	w.WriteHeader(b.statusCode())
	w.Write(b.body.Bytes())
}

// writeProblem writes an RFC 9457 problem with idem's code member, its
// detail bounded (problem.MaxDetail).
func writeProblem(w http.ResponseWriter, status int, code, detail string) {
	problem.Write(w, status, code, detail)
}
