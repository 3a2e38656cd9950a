package idempotency

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/failpoint"
	"github.com/idemkit/idem/internal/startstop"
)

// Middleware guards handlers with Idempotency-Key. Create it with New, wrap
// handlers with Wrap, and run the retention purge with Start, Stop and
// HardStop.
type Middleware struct {
	store Store
	txs   TxStore
	cfg   *config
	cache *replayCache
	svc   startstop.Service
}

// New returns a Middleware over store. cfg must set Scope; other fields
// default as documented on Config. ModeTransactional needs a TxStore
// (PostgresStore). A bad store or Config is an error wrapping
// ErrInvalidConfig that names the field.
func New(store Store, cfg *Config) (*Middleware, error) {
	if store == nil {
		return nil, invalidf("the store is nil")
	}
	c, err := newConfig(cfg)
	if err != nil {
		return nil, err
	}
	m := &Middleware{store: store, cfg: c, cache: newReplayCache(c.ReplayCacheBytes)}
	if c.Mode == ModeTransactional {
		txs, ok := store.(TxStore)
		if !ok {
			return nil, invalidf("Config.Mode %s needs a TxStore (such as PostgresStore), got %T", c.Mode, store)
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

// request is one guarded request on its way through the middleware.
type request struct {
	// ctx is the request's context as the EventBegin hook returned it.
	ctx   context.Context
	begin time.Time
	ev    Event
	claim Claim
}

// hook reports e, a later event of rq.
func (m *Middleware) hook(rq *request, e Event) {
	e.Elapsed = time.Since(rq.begin)
	idem.CallHook(m.cfg.Hook, rq.ctx, e)
}

func (m *Middleware) serve(next http.Handler, w http.ResponseWriter, r *http.Request) {
	if !m.cfg.methods[r.Method] {
		next.ServeHTTP(w, r)
		return
	}
	rq := &request{begin: time.Now(), ev: Event{Method: r.Method, Route: m.cfg.Route(r), Mode: m.cfg.Mode}}
	begin := rq.ev
	begin.Kind = EventBegin
	rq.ctx = idem.CallHook(m.cfg.Hook, r.Context(), begin)
	if rq.ctx != r.Context() {
		r = r.WithContext(rq.ctx)
	}
	bodyRead := false
	reject := func(status int, code, detail string, err error) {
		e := rq.ev
		e.Kind, e.Status, e.Err = EventRejected, status, err
		m.hook(rq, e)
		if !bodyRead && r.ContentLength != 0 {
			// A refusal from the headers alone: without this, net/http
			// would try to read (up to 256 KiB of) the unread body before
			// the answer goes out, so a client whose body never comes
			// would not get its 400 until a timeout. Closing instead of
			// draining answers at once.
			w.Header().Set("Connection", "close")
		}
		writeProblem(w, status, code, detail)
	}

	key, err := keyFromValues(r.Header.Values(idem.HeaderKey))
	if errors.Is(err, ErrKeyRequired) {
		reject(http.StatusBadRequest, idem.CodeKeyRequired, "this request needs an Idempotency-Key header", err)
		return
	}
	if err != nil {
		reject(http.StatusBadRequest, idem.CodeKeyInvalid, fmt.Sprintf("the Idempotency-Key must be 1 to %d visible ASCII characters, bare or as a quoted string, in one header", idem.MaxKeyLength), err)
		return
	}
	scope, err := m.cfg.Scope(r)
	if err != nil {
		reject(http.StatusUnauthorized, idem.CodeScopeUnknown, "the request has no principal to scope its Idempotency-Key", err)
		return
	}
	// The handler reads the principal through PrincipalFromContext
	// instead of computing it a second time.
	rq.ctx = context.WithValue(rq.ctx, principalKey{}, scope)
	r = r.WithContext(rq.ctx)
	body, err := readBody(r, m.cfg.MaxRequestBody)
	bodyRead = err == nil
	if errors.Is(err, ErrBodyTooLarge) {
		reject(http.StatusRequestEntityTooLarge, idem.CodeBodyTooLarge, fmt.Sprintf("the request body exceeds %d bytes", m.cfg.MaxRequestBody), err)
		return
	}
	if err != nil {
		// The client went away mid-body (or sent a broken one): there is no
		// request to protect. 400 is what net/http answers itself.
		reject(http.StatusBadRequest, idem.CodeBodyUnreadable, "the request body could not be read", err)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }

	fp, err := m.cfg.fingerprint(r, body)
	if m.rejectBody(err, reject) {
		return
	}
	m.guard(w, rq, &httpHandler{next: next, r: r, rec: newRecorder(w)}, scope, key, fp)
}

// rejectBody refuses a body the fingerprint could not take (too deep,
// ambiguous). It reports whether it did.
func (m *Middleware) rejectBody(err error, reject func(status int, code, detail string, err error)) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, ErrBodyTooDeep):
		reject(http.StatusBadRequest, idem.CodeBodyTooDeep, fmt.Sprintf("the JSON body nests objects and arrays deeper than %d levels", m.cfg.MaxBodyDepth), err)
	default: // ErrBodyAmbiguous
		reject(http.StatusBadRequest, idem.CodeBodyAmbiguous, "an object in the JSON body has two members whose names are equal ignoring case; send each member once", err)
	}
	return true
}

// guard is the engine, once the request is accepted: the replay cache,
// then the claim, the handler's run and the outcome, in the Config's mode.
// w takes the middleware's own answers; h runs and delivers the handler.
func (m *Middleware) guard(w http.ResponseWriter, rq *request, h Handler, scope, key string, fp Fingerprint) {
	rq.claim = Claim{
		Key:         HashKey(scope, rq.ev.Method, rq.ev.Route, key),
		Fingerprint: fp,
		Lease:       m.cfg.Lease,
		Retention:   m.cfg.Retention,
	}
	if e := m.cache.get(rq.claim.Key, time.Now()); e != nil {
		res := ClaimResult{Outcome: OutcomeMismatch}
		if e.fp == rq.claim.Fingerprint {
			res = ClaimResult{Outcome: OutcomeCompleted, Response: e.resp}
		}
		m.answer(w, rq, res, nil)
		return
	}
	if m.cfg.Mode == ModeTransactional {
		m.serveTx(h, w, rq)
		return
	}
	m.serveTwoStep(h, w, rq)
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
type claimFunc func(ctx context.Context, c Claim) (*ClaimTx, ClaimResult, error)

// claimWaiting claims, and while the key is in progress and Config.Wait
// allows, polls until the first request completes (replay), releases or
// loses its lease (claim), or the wait ends (in progress). sent is when the
// claim that produced the result left this process: the store started any
// lease it granted at that moment or later.
func (m *Middleware) claimWaiting(ctx context.Context, claim claimFunc, c Claim) (tx *ClaimTx, res ClaimResult, sent time.Time, err error) {
	sent = time.Now()
	tx, res, err = claim(ctx, c)
	if err != nil || res.Outcome != OutcomeInProgress || m.cfg.Wait <= 0 {
		return tx, res, sent, err
	}
	deadline := time.Now().Add(m.cfg.Wait)
	pause := 5 * time.Millisecond
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return nil, res, sent, nil
		}
		t.Reset(min(pause, left))
		select {
		case <-ctx.Done():
			return nil, res, sent, nil
		case <-t.C:
		}
		pause = min(pause*2, 200*time.Millisecond)
		sent = time.Now()
		tx, res, err = claim(ctx, c)
		if err != nil || res.Outcome != OutcomeInProgress {
			return tx, res, sent, err
		}
	}
}

// answer handles every outcome but a claim. It reports whether it wrote
// the response.
func (m *Middleware) answer(w http.ResponseWriter, rq *request, res ClaimResult, err error) bool {
	e := rq.ev
	if err != nil {
		e.Kind, e.Status, e.Err = EventStoreError, http.StatusServiceUnavailable, fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
		m.hook(rq, e)
		// Fail closed: the handler never runs unprotected.
		w.Header().Set("Retry-After", "1")
		writeProblem(w, http.StatusServiceUnavailable, idem.CodeStoreUnavailable, "the idempotency store is unavailable; retry with the same key")
		return true
	}
	switch res.Outcome {
	case OutcomeCompleted:
		m.cache.put(rq.claim.Key, rq.claim.Fingerprint, res.Response, min(res.ExpiresIn, m.cfg.ReplayCacheTTL), time.Now())
		e.Kind, e.Status = EventReplay, res.Response.Status
		m.hook(rq, e)
		writeResponse(w, res.Response, true)
		return true
	case OutcomeMismatch:
		e.Kind, e.Status = EventMismatch, m.cfg.MismatchStatus
		m.hook(rq, e)
		writeProblem(w, m.cfg.MismatchStatus, idem.CodeKeyReused, "this Idempotency-Key was used with a different request")
		return true
	case OutcomeInProgress:
		e.Kind, e.Status = EventConflict, http.StatusConflict
		m.hook(rq, e)
		w.Header().Set("Retry-After", retryAfter(res.RetryAfter))
		writeInProgress(w)
		return true
	case OutcomeClaimed, OutcomeTookOver:
		e.Kind = EventClaim
		if res.Outcome == OutcomeTookOver {
			e.Kind = EventTakeover
		}
		e.Fence = res.Fence
		m.hook(rq, e)
		return false
	}
	e.Kind, e.Status, e.Err = EventStoreError, http.StatusServiceUnavailable, fmt.Errorf("%w: outcome %d", ErrStoreUnavailable, res.Outcome)
	m.hook(rq, e)
	writeProblem(w, http.StatusServiceUnavailable, idem.CodeStoreUnavailable, "the idempotency store gave an unknown answer")
	return true
}

func writeInProgress(w http.ResponseWriter) {
	writeProblem(w, http.StatusConflict, idem.CodeKeyInProgress, "a request with this Idempotency-Key is in progress; retry later")
}

// writeLostAnswer answers a request whose response is stored but is not
// sent (the failpoint's error action at HTTPResponseStored): the retry
// gets the stored response.
func writeLostAnswer(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "1")
	writeProblem(w, http.StatusServiceUnavailable, idem.CodeStoreUnavailable, "the response is stored but could not be sent; retry with the same key to get it")
}

// retryAfter is whole seconds, rounded up, at least 1.
func retryAfter(d time.Duration) string {
	s := int64((d + time.Second - 1) / time.Second)
	if s < 1 {
		s = 1
	}
	return strconv.FormatInt(s, 10)
}

// run runs the handler under ctx, catching a panic so that the claim is
// released (or rolled back) before the panic goes on. It returns what the
// handler wrote and its status (200 when it wrote nothing).
func run(h Handler, ctx context.Context) (resp *Response, noStore bool, status int, panicked bool, pv any) {
	func() {
		defer func() {
			if v := recover(); v != nil {
				panicked, pv = true, v
			}
		}()
		h.Run(ctx)
	}()
	resp, noStore = h.Response()
	status = resp.Status
	if status == 0 {
		status = http.StatusOK
	}
	return resp, noStore, status, panicked, pv
}

// stored returns what is kept of the handler's response.
func (m *Middleware) stored(hr *Response, status int) *Response {
	resp := &Response{Status: status, Header: m.cfg.replayHeadersOf(hr.Header), Body: hr.Body}
	if len(resp.Body) > m.cfg.MaxResponseBody {
		resp.Body = []byte{}
	}
	return resp
}

func (m *Middleware) serveTwoStep(h Handler, w http.ResponseWriter, rq *request) {
	claim := func(ctx context.Context, c Claim) (*ClaimTx, ClaimResult, error) {
		res, err := m.store.Claim(ctx, c)
		return nil, res, err
	}
	_, res, sent, err := m.claimWaiting(rq.ctx, claim, rq.claim)
	if m.answer(w, rq, res, err) {
		return
	}
	fence := res.Fence

	// The handler's context and the claim's lease (see keepLease): the
	// context ends before the lease can run out, and the lease is renewed
	// while the handler runs.
	hctx, stop := m.keepLease(rq, fence, sent)
	hr, noStore, status, panicked, pv := run(h, hctx)
	stop()

	ctx := rq.ctx
	store := !panicked && !noStore && m.cfg.StoreStatus(status)
	if hr.Status == 0 && ctx.Err() != nil && !m.cfg.KeepOnClientGone {
		store = false // the client left and the handler wrote nothing
	}
	e := rq.ev
	e.Fence, e.Status = fence, status

	// Crash window (failpoint.HTTPHandlerDone): the handler's effects have
	// happened, nothing is stored, and no heartbeat renews the lease any
	// more. If the process dies here:
	//  1. retries get 409 in progress until the lease ends, in database
	//     time (at most Lease after the last renewal);
	//  2. then exactly one retry takes the key over with a new fence and
	//     runs the handler again: two-step mode re-runs, it does not roll
	//     back, so effects outside the store must be idempotent themselves;
	//  3. this run's completion, if it ever came, would be fenced out.
	// The error action stands for a store that fails the completion.
	if ferr := failpoint.Inject(failpoint.HTTPHandlerDone); ferr != nil {
		e.Kind, e.Err = EventStoreError, fmt.Errorf("%w: %w", ErrStoreUnavailable, ferr)
		m.hook(rq, e)
		if panicked {
			panic(pv)
		}
		h.Send()
		return
	}
	dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.CompletionTimeout)
	defer dcancel()
	if store {
		err = m.store.Complete(dctx, rq.claim.Key, fence, m.stored(hr, status), m.cfg.Retention)
		e.Kind = EventComplete
	} else {
		err = m.store.Release(dctx, rq.claim.Key, fence)
		e.Kind = EventRelease
	}
	switch {
	case errors.Is(err, ErrFenced):
		// A newer owner holds the key: this run's lease ran out (its
		// context ended first, see keepLease) and a retry took the key
		// over. Its response is not sent, whatever it is: the client
		// would hold two different answers for one key. It is told the
		// key is in progress, and its retry gets the new owner's stored
		// answer.
		e.Kind, e.Err, e.Status = EventFenced, err, http.StatusConflict
		m.hook(rq, e)
		if panicked {
			panic(pv)
		}
		w.Header().Set("Retry-After", "1")
		writeInProgress(w)
		return
	case err != nil:
		e.Kind, e.Err = EventStoreError, fmt.Errorf("%w: %w", ErrStoreUnavailable, err)
	}
	m.hook(rq, e)
	if panicked {
		panic(pv)
	}
	// Crash window (failpoint.HTTPResponseStored): the response is stored
	// and not sent. A process that dies here leaves a completed record:
	// the retry gets it replayed, and the handler does not run again.
	if store && err == nil {
		if ferr := failpoint.Inject(failpoint.HTTPResponseStored); ferr != nil {
			writeLostAnswer(w)
			return
		}
	}
	// The handler's effects happened: its response goes out even if storing
	// it failed (a retry after the lease then runs the handler again, which
	// is what the hook's store_error event warns about).
	h.Send()
}

func (m *Middleware) serveTx(h Handler, w http.ResponseWriter, rq *request) {
	ct, res, sent, err := m.claimWaiting(rq.ctx, m.txs.BeginClaim, rq.claim)
	if m.answer(w, rq, res, err) {
		return
	}
	fence := res.Fence

	// The open transaction holds the key (an advisory lock): there is no
	// lease to renew. HandlerTimeout bounds how long it stays open,
	// reckoned from when the claim was sent.
	hctx, cancel := context.WithDeadline(context.WithValue(rq.ctx, txKey{}, ct), sent.Add(m.cfg.HandlerTimeout))
	hr, noStore, status, panicked, pv := run(h, hctx)
	cancel()

	ctx := rq.ctx
	store := !panicked && !noStore && m.cfg.StoreStatus(status)
	if ctx.Err() != nil && !m.cfg.KeepOnClientGone {
		store = false // the client left: roll back, its retry runs afresh
	}
	dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.CompletionTimeout)
	defer dcancel()
	e := rq.ev
	e.Fence, e.Status = fence, status

	// Crash window (failpoint.HTTPHandlerDone): the handler's writes are in
	// the open transaction, nothing is committed. A process that dies here
	// takes its connection along: PostgreSQL rolls the transaction back
	// and drops its advisory lock, so the key is free at once and the
	// retry runs the handler again on a clean slate, once in effect. The
	// error action stands for a commit that fails.
	if ferr := failpoint.Inject(failpoint.HTTPHandlerDone); ferr != nil {
		_ = ct.Rollback(dctx)
		e.Kind, e.Err, e.Status = EventStoreError, fmt.Errorf("%w: %w", ErrStoreUnavailable, ferr), http.StatusServiceUnavailable
		m.hook(rq, e)
		if panicked {
			panic(pv)
		}
		w.Header().Set("Retry-After", "1")
		writeProblem(w, http.StatusServiceUnavailable, idem.CodeStoreUnavailable, "the request could not be committed; retry with the same key")
		return
	}
	if store {
		// One commit: the claim, the handler's writes and the response.
		err := ct.Commit(dctx, m.stored(hr, status), m.cfg.Retention)
		switch {
		case errors.Is(err, ErrFenced):
			// A two-step claim on the same key slipped in between our read
			// and our record: everything rolled back, and that request owns
			// the key now.
			e.Kind, e.Err, e.Status = EventFenced, err, http.StatusConflict
			m.hook(rq, e)
			w.Header().Set("Retry-After", "1")
			writeInProgress(w)
			return
		case errors.Is(err, ErrTxAborted):
			// The handler answered success after one of its statements
			// failed: nothing committed, the key is free. A retry would do
			// the same, so the client is told, not asked to retry.
			e.Kind, e.Err, e.Status = EventRelease, err, http.StatusInternalServerError
			m.hook(rq, e)
			writeProblem(w, http.StatusInternalServerError, idem.CodeTxAborted, "the handler answered success, but one of its statements had failed: nothing was committed")
			return
		case err != nil:
			e.Kind, e.Err, e.Status = EventStoreError, fmt.Errorf("%w: %w", ErrStoreUnavailable, err), http.StatusServiceUnavailable
			m.hook(rq, e)
			// Whether a failed COMMIT took effect is unknown to us; the
			// client retries with the same key and gets the replay or a
			// fresh run. Never the handler's response: it may not be true.
			w.Header().Set("Retry-After", "1")
			writeProblem(w, http.StatusServiceUnavailable, idem.CodeStoreUnavailable, "the request could not be committed; retry with the same key")
			return
		}
		e.Kind = EventComplete
		m.hook(rq, e)
		// Crash window (failpoint.HTTPResponseStored): committed and not
		// sent. A process that dies here leaves the completed record: the
		// retry gets it replayed, and the handler does not run again.
		if ferr := failpoint.Inject(failpoint.HTTPResponseStored); ferr != nil {
			writeLostAnswer(w)
			return
		}
		h.Send()
		return
	}
	e.Kind = EventRelease
	if err := ct.Rollback(dctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
		// The connection is gone; PostgreSQL rolls back on its side.
		e.Err = err
	}
	m.hook(rq, e)
	if panicked {
		panic(pv)
	}
	h.Send()
}

// Start starts the retention purge: every PurgeInterval (and at once) it
// deletes expired records in batches of PurgeBatchSize until a batch comes
// back short. ctx bounds the start only and lends its values to the purge.
// Start on a running Middleware does nothing; after Stop it starts afresh.
// The middleware serves requests whether or not the purge runs.
func (m *Middleware) Start(ctx context.Context) error {
	return m.svc.Start(ctx, func(ctx context.Context, g *startstop.Group) error {
		g.Go(ctx, m.purgeLoop)
		return nil
	})
}

// Stop ends the purge loop: a batch in hand finishes, no other starts. It
// waits for the loop, or for ctx. It is safe before Start, twice and
// concurrently.
func (m *Middleware) Stop(ctx context.Context) error { return m.svc.Stop(ctx) }

// HardStop is Stop that also cancels the batch in hand.
func (m *Middleware) HardStop(ctx context.Context) error { return m.svc.HardStop(ctx) }

func (m *Middleware) purgeLoop(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		work, cancel := startstop.WorkContext(ctx)
		_, _ = m.purge(ctx, work)
		cancel()
		t.Reset(m.cfg.PurgeInterval)
	}
}

// Purge deletes expired records now, in batches of PurgeBatchSize, until a
// batch comes back short, and returns how many it deleted. ctx bounds it.
func (m *Middleware) Purge(ctx context.Context) (int, error) { return m.purge(ctx, ctx) }

// purge is one round: batches run on work; no batch starts once run ends.
func (m *Middleware) purge(run, work context.Context) (int, error) {
	start := time.Now()
	total := 0
	var err error
	for {
		var n int
		n, err = m.store.Purge(work, m.cfg.PurgeBatchSize)
		total += n
		if err != nil || n < m.cfg.PurgeBatchSize || run.Err() != nil {
			break
		}
		// Crash window (failpoint.PurgeMidBatch): one batch deleted, the
		// next not yet. Nothing is lost: the next round deletes the rest.
		if err = failpoint.Inject(failpoint.PurgeMidBatch); err != nil {
			break
		}
	}
	idem.CallHook(m.cfg.Hook, work, Event{Kind: EventPurge, Mode: m.cfg.Mode, Purged: total, Elapsed: time.Since(start), Err: err})
	return total, err
}
