package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemkit/idem"
)

// order is an order the driver created; confirmed once its confirm POST
// got a 200.
type order struct {
	ID         string
	CustomerID string
	Total      int64
	Confirmed  bool
	// ForPayment marks an order created to carry a payment: it stays NEW
	// and must never be charged on its own.
	ForPayment bool
}

// payment is a payment the driver created (201).
type payment struct {
	ID         string
	OrderID    string
	CustomerID string
	Amount     int64
}

// keyRecord is the first final answer the driver saw for one
// Idempotency-Key, which every later answer must repeat.
type keyRecord struct {
	path   string
	status int
	header http.Header // the replayHeaders only
	body   []byte
	seen   int
}

// replayHeaders are the response headers a replay must repeat: the
// idempotency middleware's default allow-list
// (idempotency.ReplayHeadersDefault), which billing keeps.
var replayHeaders = []string{"Content-Type", "Content-Language", "Location"}

// driver is the load driver: it creates and confirms orders and creates
// payments against the billing instances, retrying every POST with the
// same key (unless the key layer is unsafe) until it gets a final answer.
type driver struct {
	cfg       *Config
	runID     string
	hc        *http.Client
	instances []*proc
	report    func(v Violation)

	mu        sync.Mutex
	keys      map[string]*keyRecord
	orders    []*order
	payments  []*payment
	latencies []time.Duration
	// latencyAt is when each latency's POST ended, dropsAt when each
	// answer was thrown away, both since hist.t0 (the timeline's).
	latencyAt []time.Duration
	dropsAt   []time.Duration
	// createdAt is when each order and payment id was first answered.
	createdAt map[string]time.Duration

	ops           atomic.Int64 // POSTs with a final answer
	requests      atomic.Int64 // HTTP attempts
	retries       atomic.Int64 // attempts after the first, per POST
	replays       atomic.Int64 // answers with Idempotent-Replayed: true
	inProgress    atomic.Int64 // 409 IDEMPOTENCY_KEY_IN_PROGRESS
	clientDrops   atomic.Int64 // answers discarded on purpose
	duplicates    atomic.Int64 // concurrent duplicates sent
	freshKeys     atomic.Int64 // unsafe=key: keys minted for a retry
	reuseProbes   atomic.Int64 // keys sent again with another body
	reuseRejected atomic.Int64 // ... and refused with IDEMPOTENCY_KEY_REUSED
	transportErr  atomic.Int64
	status5xx     atomic.Int64

	// hist is every attempt, for the model-based audit (history.go).
	hist *history
}

func newDriver(cfg *Config, runID string, instances []*proc, report func(Violation)) *driver {
	tr := &http.Transport{MaxIdleConnsPerHost: 32, IdleConnTimeout: 30 * time.Second}
	return &driver{
		cfg:       cfg,
		runID:     runID,
		hc:        &http.Client{Transport: tr},
		instances: instances,
		report:    report,
		keys:      map[string]*keyRecord{},
		hist:      newHistory(),
		createdAt: map[string]time.Duration{},
	}
}

func (d *driver) close() { d.hc.CloseIdleConnections() }

// task is one unit of load, run by one worker.
type task struct {
	n          int
	forPayment bool
	rng        *rand.Rand
}

// run drives all tasks with cfg.Concurrency workers and returns when
// every task has its final answers or ctx ends.
func (d *driver) run(ctx context.Context) {
	tasks := make(chan task)
	var wg sync.WaitGroup
	for range d.cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for t := range tasks {
				d.runTask(ctx, t)
			}
		}()
	}
	// Orders and payments interleaved, so that chaos hits both; paced over
	// LoadDuration, so that kills land among requests in flight rather
	// than after a burst.
	o, p := 0, 0
	start := time.Now()
	interval := d.cfg.LoadDuration / time.Duration(max(d.cfg.Orders+d.cfg.Payments, 1))
	for k := 0; o < d.cfg.Orders || p < d.cfg.Payments; k++ {
		if wait := time.Until(start.Add(time.Duration(k) * interval)); wait > 0 && !sleep(ctx, wait) {
			break
		}
		var t task
		if p >= d.cfg.Payments || (o < d.cfg.Orders && o*d.cfg.Payments <= p*d.cfg.Orders) {
			t = task{n: o}
			o++
		} else {
			t = task{n: p, forPayment: true}
			p++
		}
		// Each task's decisions come from its own generator, seeded from
		// the run seed and the task, so a seed replays the same decisions.
		kind := uint64(1)
		if t.forPayment {
			kind = 2
		}
		t.rng = rand.New(rand.NewPCG(uint64(d.cfg.Seed), kind<<32|uint64(t.n)))
		select {
		case tasks <- t:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	close(tasks)
	wg.Wait()
}

func (d *driver) runTask(ctx context.Context, t task) {
	kind := "order"
	if t.forPayment {
		kind = "payorder"
	}
	cust := fmt.Sprintf("c%d", t.n%7)
	// Order totals are whole roubles, payment amounts never are: a ledger
	// charge matches one expected charge by (order, amount) unambiguously.
	total := int64(100 * (1 + t.rng.IntN(500)))
	body, _ := json.Marshal(map[string]any{"customer_id": cust, "total_kopecks": total})
	st, resp, err := d.post(ctx, t, "/orders", body, d.key(kind, t.n, "create"), http.StatusCreated, false)
	if err != nil {
		return
	}
	var created struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	}
	if json.Unmarshal(resp, &created) != nil || created.ID == "" {
		d.report(Violation{Kind: "bad-response", Subject: kind, Detail: fmt.Sprintf("POST /orders %d: no id in %q", st, clip(resp))})
		return
	}
	o := &order{ID: created.ID, CustomerID: cust, Total: total, ForPayment: t.forPayment}
	d.mu.Lock()
	d.createdAt["order "+o.ID] = time.Since(d.hist.t0)
	d.orders = append(d.orders, o)
	d.mu.Unlock()
	if d.cfg.Unsafe != UnsafeKey && !t.forPayment && (t.n == 0 || t.rng.Float64() < reuseRate) {
		d.probeFields(ctx, t.rng, "/orders", d.key(kind, t.n, "create"),
			map[string]any{"customer_id": cust, "total_kopecks": total},
			map[string]any{"customer_id": otherCustomer(cust), "total_kopecks": total + 100})
	}

	if !t.forPayment {
		_, _, err := d.post(ctx, t, "/orders/"+o.ID+"/confirm", nil, d.key(kind, t.n, "confirm"), http.StatusOK, false)
		if err == nil {
			d.mu.Lock()
			o.Confirmed = true
			d.mu.Unlock()
		}
		return
	}
	amount := total - int64(1+t.rng.IntN(99))
	body, _ = json.Marshal(map[string]any{"order_id": o.ID, "customer_id": cust, "amount_kopecks": amount})
	// The first payments always lose their first answer: in an unsafe=key
	// run that guarantees a retry with a fresh key, hence a second charge.
	forceDrop := t.n < 2
	st, resp, err = d.post(ctx, t, "/payments", body, d.key("payment", t.n, "create"), http.StatusCreated, forceDrop)
	if err != nil {
		return
	}
	var pay struct {
		ID string `json:"id"`
	}
	if json.Unmarshal(resp, &pay) != nil || pay.ID == "" {
		d.report(Violation{Kind: "bad-response", Subject: "payment", Detail: fmt.Sprintf("POST /payments %d: no id in %q", st, clip(resp))})
		return
	}
	d.mu.Lock()
	d.createdAt["payment "+pay.ID] = time.Since(d.hist.t0)
	d.payments = append(d.payments, &payment{ID: pay.ID, OrderID: o.ID, CustomerID: cust, Amount: amount})
	d.mu.Unlock()
	if d.cfg.Unsafe != UnsafeKey && (t.n == 0 || t.rng.Float64() < reuseRate) {
		// Every member in turn, so that a fingerprint covering only some
		// of them (the amount, say) is caught whichever it leaves out.
		d.probeFields(ctx, t.rng, "/payments", d.key("payment", t.n, "create"),
			map[string]any{"order_id": o.ID, "customer_id": cust, "amount_kopecks": amount},
			map[string]any{"order_id": o.ID + "x", "customer_id": otherCustomer(cust), "amount_kopecks": amount + 1})
	}
}

// otherCustomer is a customer id other than c.
func otherCustomer(c string) string { return c + "x" }

// probeFields sends, under key (already used with base), base with one
// member replaced by its alt value, for every member of alt in turn.
func (d *driver) probeFields(ctx context.Context, rng *rand.Rand, path, key string, base, alt map[string]any) {
	names := make([]string, 0, len(alt))
	for k := range alt {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, name := range names {
		b := make(map[string]any, len(base))
		for k, v := range base {
			b[k] = v
		}
		b[name] = alt[name]
		body, _ := json.Marshal(b)
		d.probeReuse(ctx, rng, path, body, key, name)
	}
}

// reuseRate is the share of orders and payments whose key the driver then
// reuses with another body (each member changed in turn), a client bug the
// fingerprint check must refuse.
const reuseRate = 0.1

// probeReuse sends body (field changed) under a key already used with
// another body. The only right answer is IDEMPOTENCY_KEY_REUSED (409, or
// 422 per the IETF draft): a replay would tell the client that its second
// request was accepted when the first was executed, and a fresh execution
// would charge twice. The answer is not recorded as a replay of the key.
func (d *driver) probeReuse(ctx context.Context, rng *rand.Rand, path string, body []byte, key, field string) {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.OpTimeout)
	defer cancel()
	d.reuseProbes.Add(1)
	last := -1
	for attempt := 0; ; attempt++ {
		inst, err := d.pick(ctx, rng, last)
		if err != nil {
			d.report(Violation{Kind: "no-final-answer", Subject: path, Detail: fmt.Sprintf("key %s reused: %v", key, err)})
			return
		}
		last = inst
		d.requests.Add(1)
		done := d.hist.call(attemptID{op: key, key: key, n: attempt, probe: true}, path, body)
		st, hdr, resp, err := d.do(ctx, d.instances[inst].addr, path, body, key)
		done(st, hdr, resp, err)
		switch {
		case err != nil && ctx.Err() != nil:
			d.report(Violation{Kind: "no-final-answer", Subject: path, Detail: fmt.Sprintf("key %s reused: %v", key, err)})
			return
		case err != nil, st >= 500, problemCode(resp) == idem.CodeKeyInProgress:
			backoff(ctx, rng, attempt)
			continue
		case (st == http.StatusConflict || st == http.StatusUnprocessableEntity) && problemCode(resp) == "IDEMPOTENCY_KEY_REUSED":
			d.reuseRejected.Add(1)
			return
		}
		d.report(Violation{Kind: "key-reuse-accepted", Subject: path,
			Detail: fmt.Sprintf("key %s sent again with another %s got %d %s, want 409 IDEMPOTENCY_KEY_REUSED", key, field, st, clip(resp))})
		return
	}
}

func (d *driver) key(kind string, n int, step string) string {
	return fmt.Sprintf("%s-%s-%d-%s", d.runID, kind, n, step)
}

var errGaveUp = errors.New("chaos: no final answer")

// post sends one logical POST until it gets a final answer, and sometimes
// a concurrent duplicate of it. It returns the first final answer.
func (d *driver) post(ctx context.Context, t task, path string, body []byte, key string, want int, forceDrop bool) (int, []byte, error) {
	start := time.Now()
	var dup sync.WaitGroup
	if t.rng.Float64() < d.cfg.DuplicateRate {
		d.duplicates.Add(1)
		dupKey := key
		if d.cfg.Unsafe == UnsafeKey {
			dupKey = key + "-dup"
		}
		dup.Add(1)
		seed := t.rng.Uint64()
		go func() {
			defer dup.Done()
			rng := rand.New(rand.NewPCG(seed, 1))
			_, _, _ = d.attempts(ctx, rng, path, body, key, dupKey, true, want, false)
		}()
	}
	st, resp, err := d.attempts(ctx, t.rng, path, body, key, key, false, want, forceDrop)
	dup.Wait()
	if err == nil {
		d.ops.Add(1)
		d.mu.Lock()
		d.latencies = append(d.latencies, time.Since(start))
		d.latencyAt = append(d.latencyAt, time.Since(d.hist.t0))
		d.mu.Unlock()
	}
	return st, resp, err
}

// attempts is the retry loop of one POST.
//
// Retried, with the same key, on another live instance: transport errors
// and timeouts (the instance may have died mid-request: the work may or may
// not be done, and the key tells the server which), 5xx, and 409
// IDEMPOTENCY_KEY_IN_PROGRESS (a concurrent attempt holds the key: wait
// Retry-After). Any other answer is final; with probability ClientDropRate
// a final answer is thrown away as if lost on the way back, and the POST is
// retried: the server must replay it.
//
// op is the logical key, recorded in the history with each attempt: key
// itself, unless the driver is unsafe=key and sends another.
// dup marks the concurrent duplicate.
func (d *driver) attempts(ctx context.Context, rng *rand.Rand, path string, body []byte, op, key string, dup bool, want int, forceDrop bool) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.OpTimeout)
	defer cancel()
	drops := 0
	last := -1
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			d.retries.Add(1)
			if d.cfg.Unsafe == UnsafeKey {
				// The bug under test: a client that mints a new key per
				// attempt turns every retry into a new operation.
				d.freshKeys.Add(1)
				key = fmt.Sprintf("%s-r%d", key, attempt)
			}
		}
		inst, err := d.pick(ctx, rng, last)
		if err != nil {
			d.report(Violation{Kind: "no-final-answer", Subject: path, Detail: fmt.Sprintf("key %s: %v after %d attempts", key, err, attempt)})
			return 0, nil, errGaveUp
		}
		last = inst
		d.requests.Add(1)
		done := d.hist.call(attemptID{op: op, key: key, n: attempt, dup: dup}, path, body)
		st, hdr, resp, err := d.do(ctx, d.instances[inst].addr, path, body, key)
		done(st, hdr, resp, err)
		switch {
		case err != nil:
			d.transportErr.Add(1)
			if ctx.Err() != nil {
				d.report(Violation{Kind: "no-final-answer", Subject: path, Detail: fmt.Sprintf("key %s: %v after %d attempts", key, err, attempt+1)})
				return 0, nil, errGaveUp
			}
			backoff(ctx, rng, attempt)
			continue
		case st >= 500:
			d.status5xx.Add(1)
			backoff(ctx, rng, attempt)
			continue
		case st == http.StatusConflict && problemCode(resp) == idem.CodeKeyInProgress:
			d.inProgress.Add(1)
			wait := 100 * time.Millisecond
			if s, err := strconv.Atoi(hdr.Get("Retry-After")); err == nil && s > 0 {
				wait = min(time.Duration(s)*time.Second, time.Second)
			}
			sleep(ctx, wait/2+time.Duration(rng.Int64N(int64(wait/2)+1)))
			continue
		}
		replayed := hdr.Get("Idempotent-Replayed") == "true"
		if replayed {
			d.replays.Add(1)
		}
		d.record(path, key, st, hdr, resp)
		if (forceDrop && drops == 0) || (drops < 2 && rng.Float64() < d.cfg.ClientDropRate) {
			drops++
			d.clientDrops.Add(1)
			d.mu.Lock()
			d.dropsAt = append(d.dropsAt, time.Since(d.hist.t0))
			d.mu.Unlock()
			continue
		}
		if st != want {
			d.report(Violation{Kind: "unexpected-status", Subject: path, Detail: fmt.Sprintf("key %s: %d %s", key, st, clip(resp))})
			return st, resp, fmt.Errorf("chaos: status %d", st)
		}
		return st, resp, nil
	}
}

// record keeps the first final answer per key and checks every later one
// against it: a replay must be the same status, the same replayHeaders and
// the same bytes.
func (d *driver) record(path, key string, st int, hdr http.Header, body []byte) {
	kept := http.Header{}
	for _, h := range replayHeaders {
		if v := hdr.Values(h); len(v) > 0 {
			kept[h] = v
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	r, ok := d.keys[key]
	if !ok {
		d.keys[key] = &keyRecord{path: path, status: st, header: kept, body: body, seen: 1}
		return
	}
	r.seen++
	if diff := answerDiff(r.status, r.header, r.body, st, kept, body); diff != "" {
		d.report(Violation{Kind: "replay-differs", Subject: path, Detail: "key " + key + ": " + diff})
	}
}

// answerDiff says how a later answer differs from the first one ("" when
// it does not): the status, each replayed header, or the first differing
// byte of the bodies with a little context around it.
func answerDiff(st1 int, h1 http.Header, b1 []byte, st2 int, h2 http.Header, b2 []byte) string {
	if st1 != st2 {
		return fmt.Sprintf("status %d first, %d later", st1, st2)
	}
	for _, h := range replayHeaders {
		v1, v2 := strings.Join(h1.Values(h), ", "), strings.Join(h2.Values(h), ", ")
		if v1 != v2 {
			return fmt.Sprintf("header %s %q first, %q later", h, v1, v2)
		}
	}
	if bytes.Equal(b1, b2) {
		return ""
	}
	i := 0
	for i < len(b1) && i < len(b2) && b1[i] == b2[i] {
		i++
	}
	around := func(b []byte) string {
		lo, hi := max(i-16, 0), min(i+16, len(b))
		return fmt.Sprintf("%q", b[lo:hi])
	}
	return fmt.Sprintf("bodies differ at byte %d (of %d and %d): first …%s…, later …%s…", i, len(b1), len(b2), around(b1), around(b2))
}

// pick returns a live instance, preferring one other than last; it waits
// while none is up.
func (d *driver) pick(ctx context.Context, rng *rand.Rand, last int) (int, error) {
	for {
		n := len(d.instances)
		off := rng.IntN(n)
		fallback := -1
		for i := range n {
			j := (off + i) % n
			if !d.instances[j].isUp() {
				continue
			}
			if j != last {
				return j, nil
			}
			fallback = j
		}
		if fallback >= 0 {
			return fallback, nil
		}
		if !sleep(ctx, 50*time.Millisecond) {
			return 0, ctx.Err()
		}
	}
}

func (d *driver) do(ctx context.Context, addr, path string, body []byte, key string) (int, http.Header, []byte, error) {
	actx, cancel := context.WithTimeout(ctx, d.cfg.RequestTimeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(actx, http.MethodPost, "http://"+addr+path, rd)
	if err != nil {
		return 0, nil, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Authorization", "Bearer "+d.cfg.Token)
	req.Header.Set("Idempotency-Key", key)
	resp, err := d.hc.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return 0, nil, nil, err
	}
	return resp.StatusCode, resp.Header, b, nil
}

// get reads a resource, retrying on any instance until a 200 or ctx ends.
func (d *driver) get(ctx context.Context, rng *rand.Rand, path string, out any) error {
	last := -1
	for attempt := 0; ; attempt++ {
		inst, err := d.pick(ctx, rng, last)
		if err != nil {
			return err
		}
		last = inst
		actx, cancel := context.WithTimeout(ctx, d.cfg.RequestTimeout)
		req, _ := http.NewRequestWithContext(actx, http.MethodGet, "http://"+d.instances[inst].addr+path, nil)
		req.Header.Set("Authorization", "Bearer "+d.cfg.Token)
		resp, err := d.hc.Do(req)
		if err == nil {
			b, rerr := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
			if rerr == nil && resp.StatusCode == http.StatusOK {
				cancel()
				return json.Unmarshal(b, out)
			}
			if rerr == nil && resp.StatusCode < 500 {
				cancel()
				return fmt.Errorf("GET %s: %d %s", path, resp.StatusCode, clip(b))
			}
		}
		cancel()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		backoff(ctx, rng, attempt)
	}
}

// problemCode returns the code member of a problem+json body.
func problemCode(body []byte) string {
	var p struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal(body, &p)
	return p.Code
}

func backoff(ctx context.Context, rng *rand.Rand, attempt int) {
	d := min(25*time.Millisecond<<min(attempt, 5), 500*time.Millisecond)
	sleep(ctx, d/2+time.Duration(rng.Int64N(int64(d/2)+1)))
}

// sleep waits d or until ctx ends; it reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func clip(b []byte) string {
	s := string(bytes.TrimSpace(b))
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}
