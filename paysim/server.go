package paysim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempotency"
)

// Defaults for Config.
const (
	// ScopeDefault is the principal of a request without an Authorization
	// header.
	ScopeDefault = "paysim"
	// LeaseDefault is how long a charge holds its key before a retry may
	// take it over.
	LeaseDefault = 30 * time.Second
	// maxChargeBody bounds the POST /charges body.
	maxChargeBody = 64 << 10
)

// Problem codes paysim writes itself (the idempotency middleware writes
// the IDEMPOTENCY_KEY_* ones). docs/problems.md describes each.
const (
	CodeMalformedJSON = "MALFORMED_JSON"     // 400: not one JSON object of the contract's shape
	CodeInvalidCharge = "INVALID_CHARGE"     // 422: a field is missing, empty or out of range
	CodeCardDeclined  = "CARD_DECLINED"      // 402: a definitive refusal, recorded; nothing charged, ever, for this key
	CodeProviderFault = "PROVIDER_FAULT"     // 500 or 503: injected failure or abandoned charge, nothing charged
	CodeNotFound      = "NOT_FOUND"          // 404
	CodeMethod        = "METHOD_NOT_ALLOWED" // 405
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
	// fault) with the key and order. Defaults to nil (no logs).
	Logger *slog.Logger
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
	}
	return nil
}

// Stats counts what the simulator did, for tests, logs and GET /metrics.
type Stats struct {
	Charged    int64 // ledger rows inserted
	Replayed   int64 // answers replayed from the idempotency store
	InProgress int64 // 409 IDEMPOTENCY_KEY_IN_PROGRESS answers
	Reused     int64 // 409 IDEMPOTENCY_KEY_REUSED answers (middleware or ledger)
	Failed     int64 // injected 500s
	Dropped    int64 // responses dropped after the charge
	Invalid    int64 // charges rejected as malformed or invalid (400, 422)
	Declined   int64 // declines recorded in the ledger (402 CARD_DECLINED)
}

// Server is the payment-provider simulator, an http.Handler:
//
//	POST /charges  Idempotency-Key, {"order_id","customer_id","amount_kopecks"} → 201 {"charge_id"} or 402 CARD_DECLINED
//	GET  /ledger   → {"charges":[{"charge_id","idempotency_key","order_id","customer_id","principal","amount_kopecks","created_at"}…],
//	                  "declines":[{"decline_id","idempotency_key","order_id","customer_id","principal","amount_kopecks","code","created_at"}…]}
//	GET  /healthz  → 200
//	GET  /metrics  → Prometheus text: paysim_charges_total, paysim_replays_total, ...
//
// POST /charges goes through the idempotency middleware over a
// MemoryStore: the same key and body replay the first answer
// (Idempotent-Replayed: true), a different body is 409
// IDEMPOTENCY_KEY_REUSED, a key still being charged is 409
// IDEMPOTENCY_KEY_IN_PROGRESS with Retry-After.
type Server struct {
	cfg     Config
	ledger  *Ledger
	faults  *faults
	mw      *idempotency.Middleware
	handler http.Handler

	charged, replayed, inProgress, reused, failed, dropped, invalid, declined atomic.Int64
}

// New returns a simulator with an empty ledger.
func New(cfg *Config) (*Server, error) {
	c := cfg.withDefaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: c, ledger: NewLedger(), faults: newFaults(c.Seed, c.FailRate, c.DropRate, c.DeclineRate)}
	mw, err := idempotency.New(idempotency.NewMemoryStore(), &idempotency.Config{
		Scope:     c.Scope,
		Lease:     c.Lease,
		Retention: max(idempotency.RetentionDefault, c.Lease),
		Hook:      s.hook,
	})
	if err != nil {
		return nil, fmt.Errorf("paysim: %w", err)
	}
	s.mw = mw
	mux := http.NewServeMux()
	mux.Handle("POST /charges", s.dropping(mw.Wrap(http.HandlerFunc(s.charge))))
	mux.HandleFunc("GET /ledger", s.listLedger)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /metrics", s.metrics)
	for _, p := range []string{"/charges", "/ledger", "/healthz", "/metrics"} {
		mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
			writeProblem(w, http.StatusMethodNotAllowed, CodeMethod, r.Method+" is not allowed on "+r.URL.Path)
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, http.StatusNotFound, CodeNotFound, "no such resource: "+r.URL.Path)
	})
	s.handler = mux
	return s, nil
}

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
	}
}

// hook counts the middleware's answers to POST /charges.
func (s *Server) hook(_ context.Context, e idempotency.Event) {
	switch e.Kind {
	case idempotency.EventReplay:
		s.replayed.Add(1)
	case idempotency.EventConflict:
		s.inProgress.Add(1)
	case idempotency.EventMismatch:
		s.reused.Add(1)
	}
}

// metrics is GET /metrics in the Prometheus text format, written by hand
// to keep the simulator free of a metrics library.
func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	st := s.Stats()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	fmt.Fprintf(w, "# HELP paysim_charges_total Charges written to the ledger.\n# TYPE paysim_charges_total counter\npaysim_charges_total %d\n", st.Charged)
	fmt.Fprintf(w, "# HELP paysim_replays_total Charge answers replayed from the idempotency store.\n# TYPE paysim_replays_total counter\npaysim_replays_total %d\n", st.Replayed)
	fmt.Fprintf(w, "# HELP paysim_conflicts_total 409 answers by problem code.\n# TYPE paysim_conflicts_total counter\n")
	fmt.Fprintf(w, "paysim_conflicts_total{code=%q} %d\npaysim_conflicts_total{code=%q} %d\n", idem.CodeKeyInProgress, st.InProgress, idem.CodeKeyReused, st.Reused)
	fmt.Fprintf(w, "# HELP paysim_faults_total Injected faults by kind.\n# TYPE paysim_faults_total counter\n")
	fmt.Fprintf(w, "paysim_faults_total{kind=\"fail\"} %d\npaysim_faults_total{kind=\"drop\"} %d\n", st.Failed, st.Dropped)
	fmt.Fprintf(w, "# HELP paysim_rejected_total Charges rejected as malformed or invalid.\n# TYPE paysim_rejected_total counter\npaysim_rejected_total %d\n", st.Invalid)
	fmt.Fprintf(w, "# HELP paysim_declines_total Charges declined (402 CARD_DECLINED), recorded in the ledger.\n# TYPE paysim_declines_total counter\npaysim_declines_total %d\n", st.Declined)
	fmt.Fprintf(w, "# HELP paysim_ledger_rows Rows in the ledger.\n# TYPE paysim_ledger_rows gauge\npaysim_ledger_rows %d\n", s.ledger.Len())
}

// Start runs the idempotency store's purge loop until Stop or ctx ends.
// Safe to call twice.
func (s *Server) Start(ctx context.Context) error { return s.mw.Start(ctx) }

// Stop ends the purge loop. Safe to call twice and before Start.
func (s *Server) Stop(ctx context.Context) error { return s.mw.Stop(ctx) }

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
	var req chargeRequest
	if err := decodeStrict(r.Body, &req); err != nil {
		s.invalid.Add(1)
		writeProblem(w, http.StatusBadRequest, CodeMalformedJSON, err.Error())
		return
	}
	if msg := req.invalid(); msg != "" {
		s.invalid.Add(1)
		writeProblem(w, http.StatusUnprocessableEntity, CodeInvalidCharge, msg)
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
	if errors.Is(err, ErrLedgerConflict) {
		s.reused.Add(1)
		// Reached only when the middleware's store forgot the key (after
		// retention, or a restart of the store): the ledger is the last line.
		writeProblem(w, http.StatusConflict, idem.CodeKeyReused, "this Idempotency-Key was settled for a different request")
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

// decodeStrict decodes exactly one JSON object with only known members.
func decodeStrict(r io.Reader, v any) error {
	dec := json.NewDecoder(io.LimitReader(r, maxChargeBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("the body is not a charge object: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("the body has data after the charge object")
	}
	return nil
}

func (s *Server) listLedger(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(s.ledger.Entries())
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

// writeProblem writes an RFC 9457 problem with idem's code member.
func writeProblem(w http.ResponseWriter, status int, code, detail string) {
	w.Header().Set("Content-Type", idem.ProblemContentType)
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(idempotency.Problem{
		Type:   "https://github.com/idemkit/idem/blob/main/docs/problems.md#" + strings.ToLower(strings.ReplaceAll(code, "_", "-")),
		Title:  http.StatusText(status),
		Status: status,
		Detail: detail,
		Code:   code,
	})
}
