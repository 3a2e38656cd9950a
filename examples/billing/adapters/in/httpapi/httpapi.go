// Package httpapi is billing's inbound HTTP adapter: the API of
// docs/contracts.md behind bearer-token principals, every POST behind the
// idempotency middleware in transactional mode (the handler's writes and
// its outbox events commit with the idempotency record), errors as
// problem+json, and /healthz, /readyz, /metrics.
package httpapi

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/examples/billing/adapters/out/postgres"
	"github.com/idemkit/idem/examples/billing/domain"
	"github.com/idemkit/idem/examples/billing/usecase"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/outbox"
)

// DefaultTokens is BILLING_API_TOKENS when unset: demo principals only.
const DefaultTokens = "alice-token:alice,bob-token:bob"

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
)

// ErrBadTokens is a BILLING_API_TOKENS value that does not parse.
var ErrBadTokens = errors.New("billing: BILLING_API_TOKENS must be token:principal[,token:principal...]")

// Token is one bearer token and its principal.
type Token struct{ Secret, Principal string }

// ParseTokens parses "token1:alice,token2:bob".
func ParseTokens(s string) ([]Token, error) {
	var out []Token
	for _, pair := range strings.Split(s, ",") {
		pair = strings.TrimSpace(pair)
		secret, principal, ok := strings.Cut(pair, ":")
		if !ok || secret == "" || principal == "" {
			return nil, fmt.Errorf("%w: bad entry %q", ErrBadTokens, redactEntry(pair))
		}
		out = append(out, Token{Secret: secret, Principal: principal})
	}
	return out, nil
}

func redactEntry(pair string) string {
	if _, p, ok := strings.Cut(pair, ":"); ok {
		return "***:" + p
	}
	return "***"
}

// Config wires the handler.
type Config struct {
	// DB serves reads and the middleware's transactions (a pool). Required.
	DB idempotency.DB
	// Tokens are the accepted bearer tokens. Required.
	Tokens []Token
	// Ready answers /readyz (lifecycle.Group.ReadyHandler). Required.
	Ready http.Handler
	// Metrics is served on /metrics and counts requests. Required.
	Metrics *Metrics
	// Logger receives internal errors. Defaults to slog.Default().
	Logger *slog.Logger

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
	db  idempotency.DB
	log *slog.Logger
	// ownTx: POST handlers run their own transaction instead of the
	// middleware's (UnsafeNoLease).
	ownTx bool
}

// NewHandler returns the billing API and the idempotency middleware (whose
// Start/Stop run the retention purge).
func NewHandler(cfg Config) (http.Handler, *idempotency.Middleware, error) {
	if cfg.DB == nil || len(cfg.Tokens) == 0 || cfg.Ready == nil || cfg.Metrics == nil {
		return nil, nil, errors.New("billing: httpapi.Config needs DB, Tokens, Ready and Metrics")
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
		Hook: cfg.Metrics.IdempotencyHook,
	}
	if cfg.UnsafeNoFingerprint {
		icfg.FingerprintFields = []string{unsafeNoSuchMember}
	}
	if cfg.UnsafeNoLease {
		noLeaseConfig(icfg)
	}
	mw, err := idempotency.New(idempotency.NewPostgresStore(cfg.DB), icfg)
	if err != nil {
		return nil, nil, err
	}
	a := &api{db: cfg.DB, log: log, ownTx: cfg.UnsafeNoLease}
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
	mux.Handle("GET /metrics", cfg.Metrics.Handler())
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, http.StatusNotFound, CodeNotFound, "no such route")
	})
	return cfg.Metrics.countRequests(mux), mw, nil
}

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
				writeProblem(w, http.StatusUnauthorized, CodeUnauthorized, "a valid bearer token is required")
				return
			}
			next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, principal)))
		})
	}
}

// repo returns the repository for a request: bound to the middleware's
// transaction on a POST (so that the writes commit with the idempotency
// record), to the pool on a GET.
func (a *api) repo(r *http.Request) (usecase.Repository, bool) {
	if r.Method == http.MethodGet {
		return postgres.New(a.db), true
	}
	tx, ok := idempotency.TxFromContext(r.Context())
	if !ok {
		return nil, false
	}
	return postgres.New(tx), true
}

// decode reads a JSON object strictly: unknown members and trailing data
// are errors, so that a typo ("amount" for "amount_kopecks") is a 400, not
// a zero amount.
func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data after the JSON object")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data after the JSON object")
	}
	return nil
}

func (a *api) createOrder(w http.ResponseWriter, r *http.Request) {
	var cmd usecase.CreateOrder
	if err := decode(r, &cmd); err != nil {
		writeProblem(w, http.StatusBadRequest, CodeMalformedJSON, err.Error())
		return
	}
	a.run(w, r, http.StatusCreated, func(ctx context.Context, repo usecase.Repository, owner string) (any, error) {
		return usecase.CreateOrderExec(ctx, repo, owner, cmd)
	})
}

func (a *api) confirmOrder(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	a.run(w, r, http.StatusOK, func(ctx context.Context, repo usecase.Repository, owner string) (any, error) {
		return usecase.ConfirmOrderExec(ctx, repo, owner, id)
	})
}

func (a *api) createPayment(w http.ResponseWriter, r *http.Request) {
	var cmd usecase.CreatePayment
	if err := decode(r, &cmd); err != nil {
		writeProblem(w, http.StatusBadRequest, CodeMalformedJSON, err.Error())
		return
	}
	a.run(w, r, http.StatusCreated, func(ctx context.Context, repo usecase.Repository, owner string) (any, error) {
		return usecase.CreatePaymentExec(ctx, repo, owner, cmd)
	})
}

func (a *api) getOrder(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	a.run(w, r, http.StatusOK, func(ctx context.Context, repo usecase.Repository, owner string) (any, error) {
		return usecase.GetOrderExec(ctx, repo, owner, id)
	})
}

func (a *api) getPayment(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	a.run(w, r, http.StatusOK, func(ctx context.Context, repo usecase.Repository, owner string) (any, error) {
		return usecase.GetPaymentExec(ctx, repo, owner, id)
	})
}

// run executes a use case and writes its result or its problem.
func (a *api) run(w http.ResponseWriter, r *http.Request, okStatus int, uc func(context.Context, usecase.Repository, string) (any, error)) {
	owner, _ := principalOf(r.Context())
	if a.ownTx && r.Method != http.MethodGet {
		a.runOwnTx(w, r, okStatus, owner, uc)
		return
	}
	repo, ok := a.repo(r)
	if !ok {
		a.log.Error("billing: POST handler without the middleware's transaction", "path", r.URL.Path)
		writeProblem(w, http.StatusInternalServerError, CodeInternal, "internal error")
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

// runOwnTx is run for UnsafeNoLease: the use case in its own transaction,
// committed before the answer, on a context detached from the (zero)
// lease's deadline.
func (a *api) runOwnTx(w http.ResponseWriter, r *http.Request, okStatus int, owner string, uc func(context.Context, usecase.Repository, string) (any, error)) {
	var v any
	ctx := context.WithoutCancel(r.Context())
	err := pgx.BeginFunc(ctx, a.db, func(tx pgx.Tx) error {
		var err error
		v, err = uc(ctx, postgres.New(tx), owner)
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
	switch {
	case errors.Is(err, domain.ErrValidation):
		writeProblem(w, http.StatusUnprocessableEntity, CodeValidation, err.Error())
	case errors.Is(err, domain.ErrOrderNotFound):
		writeProblem(w, http.StatusNotFound, CodeOrderNotFound, "no such order")
	case errors.Is(err, domain.ErrPaymentNotFound):
		writeProblem(w, http.StatusNotFound, CodePaymentNotFound, "no such payment")
	case errors.Is(err, domain.ErrOrderState):
		writeProblem(w, http.StatusConflict, CodeOrderState, err.Error())
	case errors.Is(err, outbox.ErrInvalidMessage):
		a.log.Error("billing: outbox message rejected", "path", r.URL.Path, "error", err)
		writeProblem(w, http.StatusInternalServerError, CodeInternal, "internal error")
	default:
		// A 5xx releases the idempotency key and rolls the transaction
		// back: the client's retry with the same key runs again.
		a.log.Error("billing: request failed", "path", r.URL.Path, "error", err)
		writeProblem(w, http.StatusInternalServerError, CodeInternal, "internal error")
	}
}

// Problem is billing's problem+json body (RFC 9457 with a code member).
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	Code   string `json:"code"`
}

func writeProblem(w http.ResponseWriter, status int, code, detail string) {
	b, _ := json.Marshal(Problem{
		Type:   "https://github.com/idemkit/idem/blob/main/docs/problems.md#" + strings.ToLower(strings.ReplaceAll(code, "_", "-")),
		Title:  http.StatusText(status),
		Status: status,
		Detail: detail,
		Code:   code,
	})
	w.Header().Set("Content-Type", idempotency.ProblemContentType)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
