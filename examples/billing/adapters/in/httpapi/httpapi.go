// Package httpapi is billing's inbound HTTP adapter: the API of
// docs/contracts.md behind bearer-token principals, every POST behind the
// idempotency middleware in transactional mode (the handler's writes and
// its outbox events commit with the idempotency record) or, over another
// store such as Redis (Config.Store), in two-step mode with each POST
// marked in its own transaction so that a re-run is harmless, errors as
// problem+json, and /healthz, /readyz, /metrics (served by
// internal/httpserver's bounded server). docs/security.md lists every
// limit.
package httpapi

import (
	"bytes"
	"context"
	"crypto/subtle"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"reflect"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/billing/adapters/out/postgres"
	"github.com/idemkit/idem/examples/billing/domain"
	"github.com/idemkit/idem/examples/billing/usecase"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/problem"
	"github.com/idemkit/idem/outbox"
)

// DefaultTokens is BILLING_API_TOKENS when unset: demo principals whose
// secrets are public (they are in this file). app.Run refuses them on a
// listener that is not loopback, and warns loudly on loopback.
const DefaultTokens = "alice-token:alice,bob-token:bob"

// MinTokenLength is the shortest secret accepted on a listener that is not
// loopback: 16 bytes (for example 32 hex digits of 16 random bytes is
// twice that). Shorter secrets, like the demo's, are allowed on loopback
// only, with a warning.
const MinTokenLength = 16

// Problem codes of billing's own errors (the middleware's are in package
// idempotency).
const (
	CodeUnauthorized    = "UNAUTHORIZED"
	CodeMalformedJSON   = "MALFORMED_JSON"
	CodeValidation      = "VALIDATION_FAILED"
	CodeOrderNotFound   = "ORDER_NOT_FOUND"
	CodePaymentNotFound = "PAYMENT_NOT_FOUND"
	CodeOrderState      = "ORDER_STATE_CONFLICT"
	CodeNotFound        = "NOT_FOUND"
	CodeInternal        = "INTERNAL"
	// CodeInvalidText (400): an id in the path or a JSON string is not
	// valid UTF-8 or holds a control character (NUL included).
	CodeInvalidText = "INVALID_TEXT"
	// CodeAmountTooLarge (422): an amount above domain.MaxAmountKopecks.
	CodeAmountTooLarge = "AMOUNT_TOO_LARGE"
	// CodeCustomerMismatch (422): a payment's customer_id is not its
	// order's.
	CodeCustomerMismatch = "CUSTOMER_MISMATCH"
	// CodeExceedsOutstanding (409): a payment above what its order still
	// owes (the total less its payments that are not FAILED).
	CodeExceedsOutstanding = "AMOUNT_EXCEEDS_OUTSTANDING"
	// CodeOrderHasPayments (409): a confirm of an order with payments.
	CodeOrderHasPayments = "ORDER_HAS_PAYMENTS"
)

// MaxDetailLen bounds the detail of every problem billing writes: a detail
// may quote input (an unknown member's name), and a stored 4xx must never
// grow with what a client sends.
const MaxDetailLen = problem.MaxDetail

// ErrBadTokens is a BILLING_API_TOKENS value that does not parse.
var ErrBadTokens = errors.New("billing: BILLING_API_TOKENS must be token:principal[,token:principal...]")

// Token is one bearer token and its principal.
type Token struct{ Secret, Principal string }

// ParseTokens parses "token1:alice,token2:bob". One secret given twice is
// an error (with two principals it would authenticate as the last one):
// one principal may have several secrets, for rotation.
func ParseTokens(s string) ([]Token, error) {
	var out []Token
	seen := map[string]string{}
	for _, pair := range strings.Split(s, ",") {
		pair = strings.TrimSpace(pair)
		secret, principal, ok := strings.Cut(pair, ":")
		if !ok || secret == "" || principal == "" {
			return nil, fmt.Errorf("%w: bad entry %q", ErrBadTokens, redactEntry(pair))
		}
		if first, dup := seen[secret]; dup {
			return nil, fmt.Errorf("%w: one secret is given twice (principals %q and %q)", ErrBadTokens, first, principal)
		}
		seen[secret] = principal
		out = append(out, Token{Secret: secret, Principal: principal})
	}
	return out, nil
}

// ErrUnsafeTokens is a token set that must not serve a listener reachable
// from other hosts: the public demo tokens, or a secret shorter than
// MinTokenLength.
var ErrUnsafeTokens = errors.New("billing: API tokens unfit for a listener that is not loopback")

// CheckTokens decides whether tokens may guard a listener; public is true
// when the listener is not loopback. On a public listener the demo tokens
// (DefaultTokens) and secrets shorter than MinTokenLength are an error
// wrapping ErrUnsafeTokens; on loopback they are allowed, and each is
// returned as a warning to log loudly.
func CheckTokens(tokens []Token, public bool) (warnings []string, err error) {
	demo, _ := ParseTokens(DefaultTokens)
	var problems []string
	for _, t := range tokens {
		switch {
		case isDemo(t, demo):
			problems = append(problems, fmt.Sprintf("principal %q uses a public demo token (BILLING_API_TOKENS unset or set to the demo's)", t.Principal))
		case len(t.Secret) < MinTokenLength:
			problems = append(problems, fmt.Sprintf("principal %q has a token of %d bytes, below the minimum of %d", t.Principal, len(t.Secret), MinTokenLength))
		}
	}
	if len(problems) == 0 {
		return nil, nil
	}
	if public {
		return nil, fmt.Errorf("%w: %s; set BILLING_API_TOKENS to secrets of at least %d bytes, or listen on loopback", ErrUnsafeTokens, strings.Join(problems, "; "), MinTokenLength)
	}
	for i, p := range problems {
		problems[i] = "INSECURE TOKENS, tolerated on loopback only: " + p
	}
	return problems, nil
}

func isDemo(t Token, demo []Token) bool {
	for _, d := range demo {
		if t.Secret == d.Secret {
			return true
		}
	}
	return false
}

func redactEntry(pair string) string {
	if _, p, ok := strings.Cut(pair, ":"); ok {
		return "***:" + p
	}
	return "***"
}

// Config wires the handler.
type Config struct {
	// DB serves reads and the middleware's transactions (a pool). Required
	// unless SQLDB is set.
	DB idempotency.DB
	// SQLDB, when set, runs the API on database/sql instead of DB
	// (billing's BILLING_DATA_LAYER=sql): reads on SQLDB, the middleware's
	// transactions through idempotency.NewSQLStore, the handlers' writes
	// in the *sql.Tx of idempotency.SQLTxFromContext, and two-step mode's
	// own transactions begun on SQLDB. Defaults to nil (pgx, on DB).
	SQLDB *sql.DB
	// Tokens are the accepted bearer tokens. Required.
	Tokens []Token
	// Ready answers /readyz (lifecycle.Group.ReadyHandler). Required.
	Ready http.Handler
	// Metrics counts requests and idempotency events. Required.
	Metrics *Metrics
	// MetricsHandler is served on GET /metrics (Metrics.Handler, with its
	// access rule). Defaults to nil: /metrics is not on this handler (it is
	// on the admin listener, see AdminHandler).
	MetricsHandler http.Handler
	// Logger receives internal errors. Defaults to slog.Default().
	Logger *slog.Logger
	// Hook is added to the idempotency middleware's hook, after the
	// Metrics' (idempotency.Config.Hook): tracing, other metrics.
	// Defaults to nil.
	Hook func(ctx context.Context, e idempotency.Event) context.Context

	// Store holds the idempotency records. Nil means PostgreSQL (DB) in
	// transactional mode: a POST's writes, its outbox events and its
	// stored answer commit together. Any other store (Redis: IDEMPOTENCY_STORE)
	// runs the middleware in two-step mode, where a POST commits its own
	// transaction before the store completes the key: see runTwoStep for
	// how a re-run of a POST whose completion was lost stays harmless.
	// Defaults to nil.
	Store idempotency.Store

	// UnsafeNoFingerprint switches the request fingerprint check off (the
	// chaos harness's BILLING_UNSAFE=fingerprint): the fingerprint covers
	// no body member, so a key reused with another amount replays the first
	// answer instead of IDEMPOTENCY_KEY_REUSED. For proving the audit can
	// fail; never in production. Defaults to false.
	UnsafeNoFingerprint bool
	// UnsafeNoLease switches in-flight protection off
	// (BILLING_UNSAFE=lease): a duplicate that arrives while the first
	// request is still running executes again. See noLeaseConfig. For
	// proving the audit can fail; never in production. Defaults to false.
	UnsafeNoLease bool
	// WALOutboxPrefix, when set, makes the handlers emit their events into
	// the WAL with that prefix (postgres.ContextWithWALOutbox: billing's
	// OUTBOX_MODE=wal) instead of the outbox table. Defaults to "".
	WALOutboxPrefix string
}

// unsafeNoSuchMember is the only body member the fingerprint covers under
// UnsafeNoFingerprint: no request has it, so every body fingerprints alike.
const unsafeNoSuchMember = "\x00billing-unsafe: no request has this member"

// noLeaseConfig turns icfg into the "no lease" configuration of
// UnsafeNoLease.
//
// In transactional mode there is no lease to shorten: the claim is an
// advisory lock held by the request's open transaction, and the record is
// written with the handler's writes in one commit, so a duplicate in flight
// is told IDEMPOTENCY_KEY_IN_PROGRESS and, should it slip past the lock, its
// commit is refused by the record's unique key and rolls its writes back.
// Taking only the lock away would therefore still be safe. "No lease" is the
// two-step design with a lease of (next to) nothing:
//
//  1. the claim commits at once with locked_until = now(), so it protects
//     nothing while the handler runs: a duplicate arriving a moment later
//     sees an expired lease and takes the key over;
//  2. each handler commits its own writes (order, payment, outbox event) in
//     its own transaction, on a context not bound to the lease;
//  3. both runs store their answers (the later one is fenced out, its
//     effects stay): two payments, two ChargeRequested, two charges.
//
// A retry after the first request completed is still replayed: only
// concurrent duplicates get through, which is exactly what a lease is for.
func noLeaseConfig(icfg *idempotency.Config) {
	icfg.Mode = idempotency.ModeTwoStep
	icfg.Lease = time.Nanosecond // rounds to 0 in the database: locked_until = now()
}

type principalKey struct{}

func principalOf(ctx context.Context) (string, bool) {
	p, ok := ctx.Value(principalKey{}).(string)
	return p, ok
}

type api struct {
	db  postgres.DB
	log *slog.Logger
	// ownTx: POST handlers run their own transaction instead of the
	// middleware's (UnsafeNoLease).
	ownTx bool
	// twoStep: the store is not PostgreSQL's transactional one (Config.Store):
	// POST handlers run runTwoStep.
	twoStep bool
}

// NewHandler returns the billing API and the idempotency middleware (whose
// Start/Stop run the retention purge).
func NewHandler(cfg Config) (http.Handler, *idempotency.Middleware, error) {
	if (cfg.DB == nil && cfg.SQLDB == nil) || len(cfg.Tokens) == 0 || cfg.Ready == nil || cfg.Metrics == nil {
		return nil, nil, errors.New("billing: httpapi.Config needs DB (or SQLDB), Tokens, Ready and Metrics")
	}
	var db postgres.DB
	if cfg.SQLDB != nil {
		db = postgres.SQL(cfg.SQLDB)
	} else {
		db = postgres.PGX(cfg.DB)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	icfg := &idempotency.Config{
		Scope: func(r *http.Request) (string, error) {
			p, ok := principalOf(r.Context())
			if !ok {
				return "", errors.New("no principal")
			}
			return p, nil
		},
		Mode: idempotency.ModeTransactional,
		Hook: idem.JoinHooks(cfg.Metrics.IdempotencyHook, cfg.Hook),
	}
	if cfg.UnsafeNoFingerprint {
		icfg.FingerprintFields = []string{unsafeNoSuchMember}
	}
	store := db.IdempotencyStore()
	if cfg.Store != nil {
		store = cfg.Store
		icfg.Mode = idempotency.ModeTwoStep
	}
	if cfg.UnsafeNoLease {
		noLeaseConfig(icfg)
	}
	mw, err := idempotency.New(store, icfg)
	if err != nil {
		return nil, nil, err
	}
	a := &api{db: db, log: log, ownTx: cfg.UnsafeNoLease, twoStep: cfg.Store != nil}
	auth := authenticate(cfg.Tokens)
	post := func(h http.HandlerFunc) http.Handler { return auth(mw.Wrap(h)) }

	mux := http.NewServeMux()
	mux.Handle("POST /orders", post(a.createOrder))
	mux.Handle("POST /orders/{id}/confirm", post(a.confirmOrder))
	mux.Handle("POST /payments", post(a.createPayment))
	mux.Handle("GET /orders/{id}", auth(http.HandlerFunc(a.getOrder)))
	mux.Handle("GET /payments/{id}", auth(http.HandlerFunc(a.getPayment)))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.Handle("GET /readyz", cfg.Ready)
	if cfg.MetricsHandler != nil {
		mux.Handle("GET /metrics", cfg.MetricsHandler)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		problem.Write(w, http.StatusNotFound, CodeNotFound, "no such route")
	})
	var h http.Handler = mux
	if prefix := cfg.WALOutboxPrefix; prefix != "" {
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mux.ServeHTTP(w, r.WithContext(postgres.ContextWithWALOutbox(r.Context(), prefix)))
		})
	}
	return cfg.Metrics.countRequests(closeOnUnreadBody(h)), mw, nil
}

// AdminHandler is the admin listener's handler (ADMIN_ADDR): metrics (the
// guarded Metrics.Handler) on GET /metrics, and /healthz and /readyz as on
// the API, for probes that should not take the API's connections.
func AdminHandler(metrics, ready http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metrics)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.Handle("GET /readyz", ready)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		problem.Write(w, http.StatusNotFound, CodeNotFound, "no such route")
	})
	return closeOnUnreadBody(mux)
}

// closeOnUnreadBody answers "Connection: close" whenever a response starts
// before the request body was read to its end (a 401, a 404, a 413): else
// net/http, to reuse the connection, would first read and discard the rest
// of the body (up to 256 KiB), and a client sending it slowly, or never,
// would hold the answer back until the read timeout.
func closeOnUnreadBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
			next.ServeHTTP(w, r)
			return
		}
		body := &eofTracker{ReadCloser: r.Body}
		r.Body = body
		next.ServeHTTP(&closeWriter{ResponseWriter: w, body: body}, r)
	})
}

type eofTracker struct {
	io.ReadCloser
	eof bool
}

func (b *eofTracker) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if errors.Is(err, io.EOF) {
		b.eof = true
	}
	return n, err
}

type closeWriter struct {
	http.ResponseWriter
	body    *eofTracker
	started bool
}

func (c *closeWriter) start() {
	if !c.started {
		c.started = true
		if !c.body.eof {
			c.Header().Set("Connection", "close")
		}
	}
}

func (c *closeWriter) WriteHeader(code int) {
	if code >= 200 {
		c.start()
	}
	c.ResponseWriter.WriteHeader(code)
}

func (c *closeWriter) Write(b []byte) (int, error) {
	c.start()
	return c.ResponseWriter.Write(b)
}

func (c *closeWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// authenticate resolves the bearer token to a principal, or answers 401.
// Tokens are compared in constant time.
func authenticate(tokens []Token) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h := r.Header.Get("Authorization")
			scheme, secret, _ := strings.Cut(h, " ")
			principal := ""
			if strings.EqualFold(scheme, "Bearer") && secret != "" {
				for _, t := range tokens {
					if subtle.ConstantTimeCompare([]byte(secret), []byte(t.Secret)) == 1 {
						principal = t.Principal
					}
				}
			}
			if principal == "" {
				w.Header().Set("WWW-Authenticate", `Bearer realm="billing"`)
				problem.Write(w, http.StatusUnauthorized, CodeUnauthorized, "a valid bearer token is required")
				return
			}
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, principal)))
		})
	}
}

// isRead reports a request that only reads: GET, and HEAD, which the mux
// routes to the GET patterns.
func isRead(r *http.Request) bool {
	return r.Method == http.MethodGet || r.Method == http.MethodHead
}

// repo returns the repository for a request: bound to the middleware's
// transaction on a POST (so that the writes commit with the idempotency
// record), to the pool on a read.
func (a *api) repo(r *http.Request) (usecase.Repository, bool) {
	if isRead(r) {
		return a.db.Reader(), true
	}
	return a.db.RequestRepo(r.Context())
}

// errMalformed is a body that is not the JSON object a route takes; its
// text is the problem's detail, bounded (it never quotes unbounded input).
type errMalformed struct{ detail string }

func (e errMalformed) Error() string { return e.detail }

// decode reads a JSON object strictly, for v (a pointer to a struct of
// string and number fields): the body must be valid UTF-8 (RFC 8259;
// encoding/json would silently turn bad bytes into U+FFFD), every member
// name must be one of v's, exactly (encoding/json matches names without
// regard to case, so {"Total_Kopecks":1} would pass), at most once (a
// repeated name would let the last value win unseen), and nothing may
// follow the object. So a typo ("amount" for "amount_kopecks") is a 400,
// not a zero amount.
func decode(body []byte, v any) error {
	if !utf8.Valid(body) {
		return errMalformed{"the body is not valid UTF-8"}
	}
	names := jsonNames(v)
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return errMalformed{"the body must be one JSON object"}
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return errMalformed{"malformed JSON: " + err.Error()}
		}
		name, _ := tok.(string)
		if !names[name] {
			return errMalformed{fmt.Sprintf("unknown member %q", problem.Clip(name, 40))}
		}
		if seen[name] {
			return errMalformed{fmt.Sprintf("member %q is repeated", name)}
		}
		seen[name] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return errMalformed{"malformed JSON: " + err.Error()}
		}
	}
	if _, err := dec.Token(); err != nil {
		return errMalformed{"malformed JSON: " + err.Error()}
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errMalformed{"trailing data after the JSON object"}
	}
	strict := json.NewDecoder(bytes.NewReader(body))
	strict.DisallowUnknownFields()
	if err := strict.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			// te.Value can be the literal itself (a number of any length).
			return errMalformed{fmt.Sprintf("member %q must be a JSON %s", te.Field, jsonKind(te.Type))}
		}
		return errMalformed{"malformed JSON: " + err.Error()}
	}
	return nil
}

// jsonNames are the member names of the struct v points to.
func jsonNames(v any) map[string]bool {
	t := reflect.TypeOf(v).Elem()
	out := map[string]bool{}
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			out[name] = true
		}
	}
	return out
}

func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "integer within 64 bits"
	}
	return t.String()
}

// body reads the request body (the middleware has buffered it and bounded
// its size) and decodes it into v. On failure it writes the problem,
// marked not to be stored, and returns false.
func (a *api) body(w http.ResponseWriter, r *http.Request, v any) bool {
	b, err := io.ReadAll(r.Body)
	if err == nil {
		err = decode(b, v)
	}
	if err != nil {
		idempotency.DoNotStore(w)
		problem.Write(w, http.StatusBadRequest, CodeMalformedJSON, err.Error())
		return false
	}
	return true
}

func (a *api) createOrder(w http.ResponseWriter, r *http.Request) {
	var cmd usecase.CreateOrder
	if !a.body(w, r, &cmd) {
		return
	}
	op := a.operation(r)
	if op != "" {
		cmd.ID = "ord_" + op[:20]
	}
	a.run(w, r, http.StatusCreated, func(ctx context.Context, repo usecase.Repository, owner string) (any, error) {
		return usecase.CreateOrderExec(ctx, repo, owner, cmd)
	}, op, func(ctx context.Context, repo usecase.Repository, owner string) (any, error) {
		return usecase.GetOrderExec(ctx, repo, owner, cmd.ID)
	})
}

func (a *api) confirmOrder(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	a.run(w, r, http.StatusOK, func(ctx context.Context, repo usecase.Repository, owner string) (any, error) {
		return usecase.ConfirmOrderExec(ctx, repo, owner, id)
	}, a.operation(r), func(ctx context.Context, repo usecase.Repository, owner string) (any, error) {
		return usecase.GetOrderExec(ctx, repo, owner, id)
	})
}

func (a *api) createPayment(w http.ResponseWriter, r *http.Request) {
	var cmd usecase.CreatePayment
	if !a.body(w, r, &cmd) {
		return
	}
	op := a.operation(r)
	if op != "" {
		cmd.ID = "pay_" + op[:20]
	}
	a.run(w, r, http.StatusCreated, func(ctx context.Context, repo usecase.Repository, owner string) (any, error) {
		return usecase.CreatePaymentExec(ctx, repo, owner, cmd)
	}, op, func(ctx context.Context, repo usecase.Repository, owner string) (any, error) {
		return usecase.GetPaymentExec(ctx, repo, owner, cmd.ID)
	})
}

// HTTPOperationsConsumer is the processed_event consumer id under which
// two-step mode marks the POSTs it has run (runTwoStep).
const HTTPOperationsConsumer = "billing-http"

// operation names a POST in two-step mode: the hex of a hash of the
// principal, the method, the route, the path (with its query: one key sent
// to the confirms of two orders names two operations, as the middleware's
// fingerprint tells them apart) and the Idempotency-Key, so that every run
// of one request (a retry after a lost completion) gets the same name, and
// two requests never do. "" in transactional mode, where nothing needs it.
// The middleware has checked the key before the handler runs.
func (a *api) operation(r *http.Request) string {
	if !a.twoStep || a.ownTx {
		return ""
	}
	owner, _ := principalOf(r.Context())
	key, err := idem.ParseKey(r.Header.Get(idem.HeaderKey))
	if err != nil {
		return ""
	}
	h := idempotency.HashKey("billing-operation\x00"+owner, r.Method, r.Pattern+"\x00"+r.URL.EscapedPath()+"?"+r.URL.RawQuery, key)
	return hex.EncodeToString(h[:])
}

func (a *api) getOrder(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	a.run(w, r, http.StatusOK, func(ctx context.Context, repo usecase.Repository, owner string) (any, error) {
		return usecase.GetOrderExec(ctx, repo, owner, id)
	}, "", nil)
}

func (a *api) getPayment(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	a.run(w, r, http.StatusOK, func(ctx context.Context, repo usecase.Repository, owner string) (any, error) {
		return usecase.GetPaymentExec(ctx, repo, owner, id)
	}, "", nil)
}

// useCase is one route's work on a repository, for a principal.
type useCase func(ctx context.Context, repo usecase.Repository, owner string) (any, error)

// run executes a use case and writes its result or its problem. A POST
// passes its operation name (a.operation) and again, which reads what the
// operation made, for two-step mode (runTwoStep); a read passes "" and
// nil.
func (a *api) run(w http.ResponseWriter, r *http.Request, okStatus int, uc useCase, op string, again useCase) {
	owner, _ := principalOf(r.Context())
	if a.ownTx && !isRead(r) {
		a.runOwnTx(w, r, okStatus, owner, uc)
		return
	}
	if a.twoStep && !isRead(r) {
		a.runTwoStep(w, r, okStatus, owner, op, uc, again)
		return
	}
	repo, ok := a.repo(r)
	if !ok {
		a.log.Error("billing: POST handler without the middleware's transaction", "path", r.URL.Path)
		problem.Write(w, http.StatusInternalServerError, CodeInternal, "internal error")
		return
	}
	v, err := uc(r.Context(), repo, owner)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(okStatus)
	_ = json.NewEncoder(w).Encode(v)
}

// runTwoStep runs a POST in two-step mode (a store other than
// PostgreSQL's, Config.Store): the middleware claimed the key in that
// store, the use case commits its own transaction here, and the middleware
// then completes the key with the answer. Those are two commits in two
// systems, so:
//
//  1. a crash (or a lost store) after this commit and before the
//     completion leaves the key unanswered: the client's retry, once the
//     lease has run out, runs the handler again;
//  2. so the transaction first marks the operation (op: principal, route
//     and key) in processed_event, and the ids it creates are derived
//     from op, not drawn at random;
//  3. a re-run finds its mark (the insert waits on a concurrent first run's
//     commit and then sees it) and does nothing again: again reads what
//     the first run made (the order or payment of the derived id, the
//     confirmed order) and answers it, so no second order, payment,
//     outbox event or charge is possible.
//
// A refusal rolls its mark back with everything else: a re-run decides
// afresh. What a re-run cannot do is answer exactly what the lost answer
// said: it answers the resource as it is now (a CONFIRMED order, say),
// and a key reused with another body after the record was lost gets that
// resource rather than IDEMPOTENCY_KEY_REUSED.
func (a *api) runTwoStep(w http.ResponseWriter, r *http.Request, okStatus int, owner, op string, uc, again useCase) {
	if op == "" || again == nil {
		a.log.Error("billing: two-step POST without an operation name", "path", problem.Clip(r.URL.Path, 100))
		problem.Write(w, http.StatusInternalServerError, CodeInternal, "internal error")
		return
	}
	ctx := r.Context()
	var v any
	err := a.db.InTx(ctx, func(repo *postgres.Repo) error {
		first, err := repo.MarkProcessed(ctx, HTTPOperationsConsumer, op)
		if err != nil {
			return err
		}
		if first {
			v, err = uc(ctx, repo, owner)
		} else {
			v, err = again(ctx, repo, owner)
		}
		return err
	})
	if err != nil {
		a.fail(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(okStatus)
	_ = json.NewEncoder(w).Encode(v)
}

// runOwnTx is run for UnsafeNoLease: the use case in its own transaction,
// committed before the answer, on a context detached from the (zero)
// lease's deadline.
func (a *api) runOwnTx(w http.ResponseWriter, r *http.Request, okStatus int, owner string, uc useCase) {
	var v any
	ctx := context.WithoutCancel(r.Context())
	err := a.db.InTx(ctx, func(repo *postgres.Repo) error {
		var err error
		v, err = uc(ctx, repo, owner)
		return err
	})
	if err != nil {
		a.fail(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(okStatus)
	_ = json.NewEncoder(w).Encode(v)
}

func (a *api) fail(w http.ResponseWriter, r *http.Request, err error) {
	// Refusals made before the use case touched anything are not stored
	// (idempotency.DoNotStore): a retry, or the corrected request under the
	// same key, runs again. Refusals that depend on what the database held
	// (not found, a state conflict) are stored and replayed like any
	// answer.
	switch {
	case errors.Is(err, domain.ErrInvalidText):
		idempotency.DoNotStore(w)
		problem.Write(w, http.StatusBadRequest, CodeInvalidText, err.Error())
	case errors.Is(err, domain.ErrValidation):
		idempotency.DoNotStore(w)
		problem.Write(w, http.StatusUnprocessableEntity, CodeValidation, err.Error())
	case errors.Is(err, domain.ErrAmountTooLarge):
		idempotency.DoNotStore(w)
		problem.Write(w, http.StatusUnprocessableEntity, CodeAmountTooLarge, err.Error())
	case errors.Is(err, domain.ErrOrderNotFound):
		problem.Write(w, http.StatusNotFound, CodeOrderNotFound, "no such order")
	case errors.Is(err, domain.ErrPaymentNotFound):
		problem.Write(w, http.StatusNotFound, CodePaymentNotFound, "no such payment")
	case errors.Is(err, domain.ErrOrderState):
		problem.Write(w, http.StatusConflict, CodeOrderState, err.Error())
	case errors.Is(err, domain.ErrCustomerMismatch):
		problem.Write(w, http.StatusUnprocessableEntity, CodeCustomerMismatch, err.Error())
	case errors.Is(err, domain.ErrExceedsOutstanding):
		problem.Write(w, http.StatusConflict, CodeExceedsOutstanding, err.Error())
	case errors.Is(err, domain.ErrOrderHasPayments):
		problem.Write(w, http.StatusConflict, CodeOrderHasPayments, err.Error())
	case errors.Is(err, outbox.ErrInvalidMessage):
		a.log.Error("billing: outbox message rejected", "path", problem.Clip(r.URL.Path, 100), "error", err)
		problem.Write(w, http.StatusInternalServerError, CodeInternal, "internal error")
	default:
		// A 5xx releases the idempotency key and rolls the transaction
		// back: the client's retry with the same key runs again.
		a.log.Error("billing: request failed", "path", problem.Clip(r.URL.Path, 100), "error", err)
		problem.Write(w, http.StatusInternalServerError, CodeInternal, "internal error")
	}
}

// Problem is billing's problem+json body (RFC 9457 with a code member).
type Problem = problem.Details
