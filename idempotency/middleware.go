package idempotency

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Middleware guards handlers with Idempotency-Key. Create it with New, wrap
// handlers with Wrap, and run the purge loop with Start and Stop.
type Middleware struct {
	store Store
	txs   TxStore
	cfg   *config
	cache *replayCache

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// New returns a Middleware over store. cfg must set Scope; other fields
// default as documented on Config. ModeTransactional needs a TxStore
// (PostgresStore).
func New(store Store, cfg *Config) (*Middleware, error) {
	if store == nil {
		return nil, errors.New("idempotency: store is nil")
	}
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	m := &Middleware{store: store, cfg: c, cache: newReplayCache(c.ReplayCacheBytes)}
	if c.Mode == ModeTransactional {
		txs, ok := store.(TxStore)
		if !ok {
			return nil, fmt.Errorf("idempotency: Config.Mode %s needs a TxStore (such as PostgresStore), got %T", c.Mode, store)
		}
		m.txs = txs
	}
	return m, nil
}

// Wrap is the middleware: func(http.Handler) http.Handler, for
// http.ServeMux (mw.Wrap(h)) and chi (r.Use(mw.Wrap) or r.With(mw.Wrap)).
func (m *Middleware) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.serve(next, w, r)
	})
}

func (m *Middleware) hook(ctx context.Context, e Event) {
	if m.cfg.Hook != nil {
		m.cfg.Hook(ctx, e)
	}
}

// request is one guarded request on its way through the middleware.
type request struct {
	ev    Event
	claim Claim
}

func (m *Middleware) serve(next http.Handler, w http.ResponseWriter, r *http.Request) {
	if !m.cfg.methods[r.Method] {
		next.ServeHTTP(w, r)
		return
	}
	ctx := r.Context()
	route := m.cfg.Route(r)
	rq := &request{ev: Event{Method: r.Method, Route: route, Mode: m.cfg.Mode}}
	reject := func(status int, code, detail string, err error) {
		e := rq.ev
		e.Kind, e.Status, e.Err = EventRejected, status, err
		m.hook(ctx, e)
		writeProblem(w, status, code, detail)
	}

	key, err := keyFromRequest(r)
	if errors.Is(err, ErrKeyRequired) {
		reject(http.StatusBadRequest, CodeKeyRequired, "this request needs an Idempotency-Key header", err)
		return
	}
	if err != nil {
		reject(http.StatusBadRequest, CodeKeyInvalid, "the Idempotency-Key must be 1 to 255 visible ASCII characters, bare or as a quoted string", err)
		return
	}
	scope, err := m.cfg.Scope(r)
	if err != nil {
		reject(http.StatusUnauthorized, CodeScopeUnknown, "the request has no principal to scope its Idempotency-Key", err)
		return
	}
	body, err := readBody(r, m.cfg.MaxRequestBody)
	if errors.Is(err, ErrBodyTooLarge) {
		reject(http.StatusRequestEntityTooLarge, CodeBodyTooLarge, fmt.Sprintf("the request body exceeds %d bytes", m.cfg.MaxRequestBody), err)
		return
	}
	if err != nil {
		// The client went away mid-body (or sent a broken one): there is no
		// request to protect. 400 is what net/http answers itself.
		reject(http.StatusBadRequest, CodeBodyUnreadable, "the request body could not be read", err)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }

	rq.claim = Claim{
		Key:         HashKey(scope, r.Method, route, key),
		Fingerprint: m.cfg.fingerprint(r, body),
		Lease:       m.cfg.Lease,
		Retention:   m.cfg.Retention,
	}
	if e := m.cache.get(rq.claim.Key, time.Now()); e != nil {
		res := ClaimResult{Outcome: OutcomeMismatch}
		if e.fp == rq.claim.Fingerprint {
			res = ClaimResult{Outcome: OutcomeCompleted, Response: e.resp}
		}
		m.answer(w, r, rq, res, nil)
		return
	}
	if m.cfg.Mode == ModeTransactional {
		m.serveTx(next, w, r, rq)
		return
	}
	m.serveTwoStep(next, w, r, rq)
}

func readBody(r *http.Request, max int64) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return []byte{}, nil
	}
	if r.ContentLength > max {
		return nil, ErrBodyTooLarge
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, ErrBodyTooLarge
	}
	return b, nil
}

// claimFunc claims once: Store.Claim, or TxStore.BeginClaim (tx non-nil
// when claimed).
type claimFunc func(ctx context.Context, c Claim) (pgx.Tx, ClaimResult, error)

// claimWaiting claims, and while the key is in progress and Config.Wait
// allows, polls until the first request completes (replay), releases or
// loses its lease (claim), or the wait ends (in progress).
func (m *Middleware) claimWaiting(ctx context.Context, claim claimFunc, c Claim) (pgx.Tx, ClaimResult, error) {
	tx, res, err := claim(ctx, c)
	if err != nil || res.Outcome != OutcomeInProgress || m.cfg.Wait <= 0 {
		return tx, res, err
	}
	deadline := time.Now().Add(m.cfg.Wait)
	pause := 5 * time.Millisecond
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return nil, res, nil
		}
		t.Reset(min(pause, left))
		select {
		case <-ctx.Done():
			return nil, res, nil
		case <-t.C:
		}
		pause = min(pause*2, 200*time.Millisecond)
		tx, res, err = claim(ctx, c)
		if err != nil || res.Outcome != OutcomeInProgress {
			return tx, res, err
		}
	}
}

// answer handles every outcome but a claim. It reports whether it wrote
// the response.
func (m *Middleware) answer(w http.ResponseWriter, r *http.Request, rq *request, res ClaimResult, err error) bool {
	ctx := r.Context()
	e := rq.ev
	if err != nil {
		e.Kind, e.Status, e.Err = EventStoreError, http.StatusServiceUnavailable, fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
		m.hook(ctx, e)
		// Fail closed: the handler never runs unprotected.
		w.Header().Set("Retry-After", "1")
		writeProblem(w, http.StatusServiceUnavailable, CodeStoreUnavailable, "the idempotency store is unavailable; retry with the same key")
		return true
	}
	switch res.Outcome {
	case OutcomeCompleted:
		m.cache.put(rq.claim.Key, rq.claim.Fingerprint, res.Response, res.ExpiresIn, time.Now())
		e.Kind, e.Status = EventReplay, res.Response.Status
		m.hook(ctx, e)
		writeResponse(w, res.Response, true)
		return true
	case OutcomeMismatch:
		e.Kind, e.Status = EventMismatch, m.cfg.MismatchStatus
		m.hook(ctx, e)
		writeProblem(w, m.cfg.MismatchStatus, CodeKeyReused, "this Idempotency-Key was used with a different request")
		return true
	case OutcomeInProgress:
		e.Kind, e.Status = EventConflict, http.StatusConflict
		m.hook(ctx, e)
		w.Header().Set("Retry-After", retryAfter(res.RetryAfter))
		writeProblem(w, http.StatusConflict, CodeKeyInProgress, "a request with this Idempotency-Key is in progress; retry later")
		return true
	case OutcomeClaimed, OutcomeTookOver:
		e.Kind = EventClaim
		if res.Outcome == OutcomeTookOver {
			e.Kind = EventTakeover
		}
		e.Fence = res.Fence
		m.hook(ctx, e)
		return false
	}
	e.Kind, e.Status, e.Err = EventStoreError, http.StatusServiceUnavailable, fmt.Errorf("%w: outcome %d", ErrStoreUnavailable, res.Outcome)
	m.hook(ctx, e)
	writeProblem(w, http.StatusServiceUnavailable, CodeStoreUnavailable, "the idempotency store gave an unknown answer")
	return true
}

// retryAfter is whole seconds, rounded up, at least 1.
func retryAfter(d time.Duration) string {
	s := int64((d + time.Second - 1) / time.Second)
	if s < 1 {
		s = 1
	}
	return strconv.FormatInt(s, 10)
}

// run calls the handler on a recorder, catching a panic so that the claim
// is released (or rolled back) before the panic goes on.
func run(next http.Handler, rec *recorder, r *http.Request) (panicked bool, pv any) {
	defer func() {
		if v := recover(); v != nil {
			panicked, pv = true, v
		}
	}()
	next.ServeHTTP(rec, r)
	return false, nil
}

// stored returns what is kept of the handler's response.
func (m *Middleware) stored(rec *recorder) *Response {
	resp := &Response{Status: rec.statusCode(), Header: m.cfg.replayHeadersOf(rec.header), Body: rec.body.Bytes()}
	if len(resp.Body) > m.cfg.MaxResponseBody {
		resp.Body = []byte{}
	}
	return resp
}

func (m *Middleware) serveTwoStep(next http.Handler, w http.ResponseWriter, r *http.Request, rq *request) {
	ctx := r.Context()
	claim := func(ctx context.Context, c Claim) (pgx.Tx, ClaimResult, error) {
		res, err := m.store.Claim(ctx, c)
		return nil, res, err
	}
	_, res, err := m.claimWaiting(ctx, claim, rq.claim)
	if m.answer(w, r, rq, res, err) {
		return
	}
	fence := res.Fence

	// The handler's context ends with the lease: after it, a retry may take
	// the key over, and this run's completion will be fenced out.
	hctx, cancel := context.WithTimeout(ctx, m.cfg.Lease)
	rec := newRecorder(w)
	panicked, pv := run(next, rec, r.WithContext(hctx))
	cancel()

	// Crash window: if the process dies here, the claim stays until its
	// lease ends in database time; then exactly one retry takes it over
	// (with a new fence) and this run's completion, if it ever came, would
	// be rejected.
	status := rec.statusCode()
	store := !panicked && !rec.noStore && m.cfg.StoreStatus(status)
	if rec.status == 0 && ctx.Err() != nil && !m.cfg.KeepOnClientGone {
		store = false // the client left and the handler wrote nothing
	}
	dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.CompletionTimeout)
	defer dcancel()
	e := rq.ev
	e.Fence, e.Status = fence, status
	if store {
		err = m.store.Complete(dctx, rq.claim.Key, fence, m.stored(rec), m.cfg.Retention)
		e.Kind = EventComplete
	} else {
		err = m.store.Release(dctx, rq.claim.Key, fence)
		e.Kind = EventRelease
	}
	switch {
	case errors.Is(err, ErrFenced):
		e.Kind, e.Err = EventFenced, err
	case err != nil:
		e.Kind, e.Err = EventStoreError, fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
	}
	m.hook(ctx, e)
	if panicked {
		panic(pv)
	}
	// The handler's effects happened: its response goes out even if storing
	// it failed (a retry after the lease then runs the handler again, which
	// is what the hook's store_error event warns about).
	rec.send()
}

func (m *Middleware) serveTx(next http.Handler, w http.ResponseWriter, r *http.Request, rq *request) {
	ctx := r.Context()
	tx, res, err := m.claimWaiting(ctx, m.txs.BeginClaim, rq.claim)
	if m.answer(w, r, rq, res, err) {
		return
	}
	fence := res.Fence

	hctx, cancel := context.WithTimeout(context.WithValue(ctx, txKey{}, pgx.Tx(ownedTx{tx})), m.cfg.Lease)
	rec := newRecorder(w)
	panicked, pv := run(next, rec, r.WithContext(hctx))
	cancel()

	status := rec.statusCode()
	store := !panicked && !rec.noStore && m.cfg.StoreStatus(status)
	if ctx.Err() != nil && !m.cfg.KeepOnClientGone {
		store = false // the client left: roll back, its retry runs afresh
	}
	dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.CompletionTimeout)
	defer dcancel()
	e := rq.ev
	e.Fence, e.Status = fence, status
	if store {
		// One commit: the claim, the handler's writes and the response.
		err := m.txs.CommitComplete(dctx, tx, rq.claim.Key, fence, m.stored(rec), m.cfg.Retention)
		if errors.Is(err, ErrFenced) {
			// A two-step claim on the same key slipped in between our read
			// and our record: everything rolled back, and that request owns
			// the key now.
			e.Kind, e.Err, e.Status = EventFenced, err, http.StatusConflict
			m.hook(ctx, e)
			w.Header().Set("Retry-After", "1")
			writeProblem(w, http.StatusConflict, CodeKeyInProgress, "a request with this Idempotency-Key is in progress; retry later")
			return
		}
		if err != nil {
			e.Kind, e.Err, e.Status = EventStoreError, fmt.Errorf("%w: %w", ErrStoreUnavailable, err), http.StatusServiceUnavailable
			m.hook(ctx, e)
			// Whether a failed COMMIT took effect is unknown to us; the
			// client retries with the same key and gets the replay or a
			// fresh run. Never the handler's response: it may not be true.
			w.Header().Set("Retry-After", "1")
			writeProblem(w, http.StatusServiceUnavailable, CodeStoreUnavailable, "the request could not be committed; retry with the same key")
			return
		}
		e.Kind = EventComplete
		m.hook(ctx, e)
		rec.send()
		return
	}
	e.Kind = EventRelease
	if err := tx.Rollback(dctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		// The connection is gone; PostgreSQL rolls back on its side.
		e.Err = err
	}
	m.hook(ctx, e)
	if panicked {
		panic(pv)
	}
	rec.send()
}

// Start runs the purge loop until Stop or ctx ends: every PurgeInterval it
// deletes expired records in batches of PurgeBatch until a batch comes back
// short. Calling Start on a running Middleware does nothing.
func (m *Middleware) Start(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.done != nil {
		return nil
	}
	ctx, m.cancel = context.WithCancel(ctx)
	m.done = make(chan struct{})
	go m.purgeLoop(ctx, m.done)
	return nil
}

// Stop ends the purge loop and waits for it, or for ctx. It is safe to call
// twice and before Start.
func (m *Middleware) Stop(ctx context.Context) error {
	m.mu.Lock()
	cancel, done := m.cancel, m.done
	m.cancel, m.done = nil, nil
	m.mu.Unlock()
	if cancel == nil {
		return nil
	}
	cancel()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (m *Middleware) purgeLoop(ctx context.Context, done chan struct{}) {
	defer close(done)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		_, err := m.Purge(ctx)
		if err != nil && ctx.Err() == nil {
			m.hook(ctx, Event{Kind: EventStoreError, Mode: m.cfg.Mode, Err: fmt.Errorf("%w: %w", ErrStoreUnavailable, err)})
		}
		t.Reset(m.cfg.PurgeInterval)
	}
}

// Purge deletes expired records now, in batches of PurgeBatch, until a
// batch comes back short, and returns how many it deleted. ctx bounds it.
func (m *Middleware) Purge(ctx context.Context) (int, error) {
	total := 0
	for {
		n, err := m.store.Purge(ctx, m.cfg.PurgeBatch)
		total += n
		if err != nil || n < m.cfg.PurgeBatch {
			return total, err
		}
	}
}
