package idemtest

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem"
)

// checks in the order Run performs them.
var checks = []check{
	{CheckBaseline, "a new key with Body succeeds (2xx), one execution", checkBaseline},
	{CheckMissingKey, "a request without a key is refused with 400 (or 428) and not executed", checkMissingKey},
	{CheckInvalidKey, "malformed keys are refused with 400 and not executed; a " + strconv.Itoa(idem.MaxKeyLength) + "-character key is accepted", checkInvalidKey},
	{CheckReplay, "the same key and body again replay the same status, headers (Content-Type, Content-Language, Location) and body, one execution", checkReplay},
	{CheckMismatch, "the same key with a different body (each member changed in turn, nested ones too) is refused with 409 or 422 and does not overwrite the original", checkMismatch},
	{CheckConcurrency, "concurrent requests with one new key cause exactly one execution", checkConcurrency},
	{CheckPrincipals, "the same key from a second principal runs on its own and never replays the first principal's answer", checkPrincipals},
	{CheckQuotedKey, `the sf-string form "key" is accepted and names the same key as the bare form`, checkQuotedKey},
	{CheckRetryAfter, "an in-progress answer (409) carries a valid Retry-After", checkRetryAfter},
	{CheckServerErrorReleased, "after a 5xx a retry with the same key runs again instead of replaying the 5xx", checkServerErrorReleased},
	{CheckExpiry, "after the TTL the key can be used again", checkExpiry},
	{CheckRoutes, "the same key on another route (AltURL) is another operation: executed there, neither refused nor replayed", checkRoutes},
}

// verdict collects failures; the check passes when there are none.
type verdict struct {
	fails []string
}

func (v *verdict) failf(format string, args ...any) {
	v.fails = append(v.fails, fmt.Sprintf(format, args...))
}

func (v *verdict) set(res *Result, passReason string) {
	if len(v.fails) > 0 {
		res.Status, res.Reason = Fail, strings.Join(v.fails, "; ")
		return
	}
	res.Status, res.Reason = Pass, passReason
}

// executions checks a count delta against want. It reports whether a count
// was available.
func (v *verdict) executions(ctx context.Context, c *counter, want int64, what string) bool {
	if !c.has {
		return false
	}
	d, err := c.delta(ctx)
	if err != nil {
		v.failf("%v", err)
		return true
	}
	if d != want {
		v.failf("%s: %d execution(s) counted, want %d", what, d, want)
	}
	return true
}

func markerNote(res *Result, p response) {
	if p.replayed() {
		res.Notes = append(res.Notes, idem.HeaderReplayed+": true present on the replay")
	} else {
		res.Notes = append(res.Notes, idem.HeaderReplayed+" absent on the replay")
	}
}

func checkBaseline(ctx context.Context, r *runner, res *Result) {
	var v verdict
	c := r.startCount(ctx)
	if c.err != nil {
		v.failf("%v", c.err)
		v.set(res, "")
		return
	}
	p := r.do(ctx, res, reqOpts{label: "new key", key: withKey(newKey("baseline")), body: r.t.Body})
	if !p.ok() {
		v.failf("a new key with Body got %s, want 2xx (check the body, headers and URL)", p.describe())
	}
	if p.replayed() {
		v.failf("the first answer to a new key is marked %s", idem.HeaderReplayed)
	}
	counted := v.executions(ctx, c, 1, "one request")
	reason := fmt.Sprintf("%d", p.status)
	if counted {
		reason += ", 1 execution counted"
	}
	v.set(res, reason)
}

func checkMissingKey(ctx context.Context, r *runner, res *Result) {
	var v verdict
	c := r.startCount(ctx)
	p := r.do(ctx, res, reqOpts{label: "no key", body: r.t.Body})
	if p.status != http.StatusBadRequest && p.status != http.StatusPreconditionRequired {
		v.failf("no key got %s, want 400", p.describe())
	}
	v.executions(ctx, c, 0, "a request without a key")
	v.set(res, p.describe())
}

func checkInvalidKey(ctx context.Context, r *runner, res *Result) {
	var v verdict
	base := newKey("invalid")
	bad := []struct{ label, key string }{
		{"256 characters", base + strings.Repeat("x", idem.MaxKeyLength+1-len(base))},
		{"tab inside", base[:10] + "\t" + base[10:]},
		{"space inside", base[:10] + " " + base[10:]},
		{"non-ASCII", base + "-ключ"},
		{"empty", ""},
	}
	c := r.startCount(ctx)
	var got []string
	for _, b := range bad {
		p := r.do(ctx, res, reqOpts{label: "key " + b.label, key: withKey(b.key), body: r.t.Body})
		got = append(got, strconv.Itoa(p.status))
		if p.status != http.StatusBadRequest {
			v.failf("key %s got %s, want 400", b.label, p.describe())
		}
	}
	// net/http refuses to send other control characters; they go by hand.
	for _, b := range []struct{ label, key string }{
		{"control character 0x01", base[:10] + "\x01" + base[10:]},
		{"DEL 0x7f", base[:10] + "\x7f" + base[10:]},
	} {
		o := reqOpts{label: "key " + b.label + " (raw)", key: withKey(b.key), body: r.t.Body}
		p := r.sendRaw(ctx, o)
		if errors.Is(p.err, errRawNeedsHTTP) {
			res.Notes = append(res.Notes, "keys with control characters other than tab were not tried: "+p.err.Error())
			break
		}
		res.Evidence = append(res.Evidence, exchange(o, p))
		got = append(got, strconv.Itoa(p.status))
		if p.status != http.StatusBadRequest {
			v.failf("key %s got %s, want 400", b.label, p.describe())
		}
	}
	v.executions(ctx, c, 0, "malformed keys")
	long := newKey("max")
	long += strings.Repeat("y", idem.MaxKeyLength-len(long))
	c = r.startCount(ctx)
	p := r.do(ctx, res, reqOpts{label: fmt.Sprintf("key %d characters", idem.MaxKeyLength), key: withKey(long), body: r.t.Body})
	if !p.ok() {
		v.failf("a %d-character key got %s, want 2xx", idem.MaxKeyLength, p.describe())
	}
	v.executions(ctx, c, 1, fmt.Sprintf("a %d-character key", idem.MaxKeyLength))
	v.set(res, fmt.Sprintf("malformed → %s; %d chars → %d", strings.Join(got, ","), idem.MaxKeyLength, p.status))
}

func checkReplay(ctx context.Context, r *runner, res *Result) {
	var v verdict
	k := withKey(newKey("replay"))
	c := r.startCount(ctx)
	p1 := r.do(ctx, res, reqOpts{label: "first", key: k, body: r.t.Body})
	p2 := r.do(ctx, res, reqOpts{label: "repeat", key: k, body: r.t.Body})
	if !p1.ok() {
		v.failf("first request got %s, want 2xx", p1.describe())
	}
	if !p2.sameAs(p1) {
		v.failf("repeat got %s with a %s body, want the first answer (%d) byte for byte", p2.describe(), sameness(p1, p2), p1.status)
		if d := bodyDiff(p1.body, p2.body); d != "" && p1.status == p2.status {
			v.failf("%s", d)
		}
	}
	if d := p1.headerDiff(p2); p1.ok() && d != "" {
		v.failf("repeat lost or changed a header: %s", d)
	}
	v.executions(ctx, c, 1, "two requests with one key")
	markerNote(res, p2)
	v.set(res, fmt.Sprintf("%d then identical %d, %s %v", p1.status, p2.status, idem.HeaderReplayed, p2.replayed()))
}

func sameness(a, b response) string {
	if string(a.body) == string(b.body) {
		return "identical"
	}
	return "different"
}

func checkMismatch(ctx context.Context, r *runner, res *Result) {
	var v verdict
	k := withKey(newKey("mismatch"))
	c := r.startCount(ctx)
	p1 := r.do(ctx, res, reqOpts{label: "first", key: k, body: r.t.Body})
	if !p1.ok() {
		v.failf("first request got %s, want 2xx", p1.describe())
	}
	// AltBody, then every member of Body changed in turn: a fingerprint
	// that covers only some members (the amount, the top level) is caught
	// by the first member it leaves out.
	others := append([]variant{{field: "AltBody", body: r.t.AltBody}}, fieldVariants(r.t.Body)...)
	var first response
	for i, o := range others {
		label := "other body (" + o.field + " changed)"
		if i == 0 {
			label = "other body (AltBody)"
		}
		p2 := r.do(ctx, res, reqOpts{label: label, key: k, body: o.body})
		if i == 0 {
			first = p2
		}
		switch {
		case p2.status != http.StatusConflict && p2.status != http.StatusUnprocessableEntity:
			v.failf("%s with the same key got %s, want 409 or 422", label, p2.describe())
		case p2.code == idem.CodeKeyInProgress:
			v.failf("%s with a completed key got %s, want a mismatch", label, p2.describe())
		case p2.replayed():
			v.failf("%s got a replay", label)
		}
	}
	p3 := r.do(ctx, res, reqOpts{label: "first body again", key: k, body: r.t.Body})
	if !p3.sameAs(p1) {
		v.failf("the first body again got %s, want the original answer replayed", p3.describe())
	}
	v.executions(ctx, c, 1, fmt.Sprintf("one key, %d bodies", len(others)+1))
	v.set(res, fmt.Sprintf("%d other bodies (AltBody and %d changed members) → %s; original still replays", len(others), len(others)-1, first.describe()))
}

// checkRoutes sends one key to URL, then to AltURL: a key is scoped by
// route, so the second is a new operation of its own, answered by that
// route (whatever its status: a route may refuse AltURLBody on its own
// terms) and neither a replay nor an idempotency refusal, and the first
// route still replays its own answer.
func checkRoutes(ctx context.Context, r *runner, res *Result) {
	if r.altURL == "" {
		res.Status, res.Reason = Skip, "no AltURL (AltPath for a Handler): another route to send the same key to"
		return
	}
	var v verdict
	k := withKey(newKey("routes"))
	p1 := r.do(ctx, res, reqOpts{label: "first route", key: k, body: r.t.Body})
	p2 := r.do(ctx, res, reqOpts{label: "other route, same key", key: k, body: r.t.AltURLBody, url: r.altURL})
	p3 := r.do(ctx, res, reqOpts{label: "first route again", key: k, body: r.t.Body})
	if !p1.ok() {
		v.failf("first request got %s, want 2xx", p1.describe())
	}
	refused := p2.code == idem.CodeKeyReused || p2.code == idem.CodeKeyInProgress ||
		p2.code == "" && (p2.status == http.StatusConflict || p2.status == http.StatusUnprocessableEntity)
	switch {
	case p2.err != nil:
		v.failf("the other route: %s", p2.describe())
	case p2.replayed():
		v.failf("the same key on another route got a replay (%s): the key is not scoped by route", p2.describe())
	case refused:
		v.failf("the same key on another route got %s: the key is not scoped by route", p2.describe())
	case p1.ok() && p2.sameAs(p1):
		v.failf("the other route answered the first route's answer byte for byte: a replay without the marker")
	}
	if !p3.sameAs(p1) {
		v.failf("the first route again got %s, want its own answer replayed", p3.describe())
	}
	v.set(res, fmt.Sprintf("first route %d, other route %s, first route replays", p1.status, p2.describe()))
}

// race sends n requests with the same options at once and returns the
// answers in arrival order.
func (r *runner) race(ctx context.Context, n int, o reqOpts) []response {
	start := make(chan struct{})
	out := make(chan response, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			<-start
			out <- r.send(ctx, o)
		})
	}
	close(start)
	wg.Wait()
	close(out)
	var all []response
	for p := range out {
		all = append(all, p)
	}
	return all
}

// tally sums up answers as "1×201, 9×409 IDEMPOTENCY_KEY_IN_PROGRESS".
func tally(ps []response) string {
	counts := map[string]int{}
	for _, p := range ps {
		counts[p.describe()]++
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d×%s", counts[k], k))
	}
	return strings.Join(parts, ", ")
}

// settle repeats the request until the key is no longer in progress, and
// returns that answer.
func (r *runner) settle(ctx context.Context, res *Result, o reqOpts) response {
	deadline := time.Now().Add(r.t.SettleTimeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		p := r.send(ctx, o)
		if !p.inProgress() || time.Now().After(deadline) {
			res.Evidence = append(res.Evidence, exchange(o, p))
			return p
		}
		select {
		case <-ctx.Done():
			res.Evidence = append(res.Evidence, exchange(o, p))
			return p
		case <-tick.C:
		}
	}
}

func checkConcurrency(ctx context.Context, r *runner, res *Result) {
	var v verdict
	o := reqOpts{label: "racing", key: withKey(newKey("race")), body: r.t.Body}
	c := r.startCount(ctx)
	all := r.race(ctx, r.t.Concurrency, o)
	for _, p := range all {
		res.Evidence = append(res.Evidence, exchange(o, p))
	}
	// Counted before the request below, which a server that ignores keys
	// would execute once more. Every execution of the race is done by now:
	// each answered its racer.
	counted := v.executions(ctx, c, 1, fmt.Sprintf("%d concurrent requests with one key", len(all)))
	o.label = "after the race"
	final := r.settle(ctx, res, o)
	if !final.ok() {
		v.failf("after the race the key answers %s, want the 2xx result", final.describe())
	}
	var inProgress, same, other int
	for _, p := range all {
		switch {
		case p.inProgress():
			inProgress++
		case p.sameAs(final):
			same++
		default:
			other++
		}
	}
	if other > 0 {
		v.failf("%d of %d racing requests got an answer that is neither in-progress nor the final result (%s)", other, len(all), tally(all))
	}
	if same == 0 && final.ok() {
		// Every racer was turned away, yet the key holds a result: some
		// racer's execution answered nobody, or the settle request ran it.
		res.Notes = append(res.Notes, "no racing request got the result; it came from the request after the race")
	}
	how := "identical responses"
	if counted {
		how = "count"
	}
	res.Notes = append(res.Notes, fmt.Sprintf("%d in-progress answers, %d with the result", inProgress, same))
	v.set(res, fmt.Sprintf("%s; one execution (by %s)", tally(all), how))
}

func (r *runner) principalB() http.Header {
	h := http.Header{}
	for k, v := range r.t.PrincipalB {
		h[http.CanonicalHeaderKey(k)] = v
	}
	return h
}

func checkPrincipals(ctx context.Context, r *runner, res *Result) {
	if len(r.t.PrincipalB) == 0 {
		res.Status, res.Reason = Skip, "no second principal given (Target.PrincipalB, --principal-b-header)"
		return
	}
	var v verdict
	k := withKey(newKey("principals"))
	b := r.principalB()
	c := r.startCount(ctx)
	pa := r.do(ctx, res, reqOpts{label: "principal A", key: k, body: r.t.Body})
	pb := r.do(ctx, res, reqOpts{label: "principal B, same key", key: k, body: r.t.Body, header: b})
	pa2 := r.do(ctx, res, reqOpts{label: "principal A again", key: k, body: r.t.Body})
	pb2 := r.do(ctx, res, reqOpts{label: "principal B again", key: k, body: r.t.Body, header: b})
	if !pa.ok() {
		v.failf("principal A got %s, want 2xx", pa.describe())
	}
	switch {
	case !pb.ok():
		v.failf("principal B with A's key got %s, want 2xx (its own execution)", pb.describe())
	case pb.replayed():
		v.failf("principal B got a replay (%s) of principal A's key", idem.HeaderReplayed)
	}
	counted := v.executions(ctx, c, 2, "one key used by two principals")
	if counted && pb.ok() && pb.sameAs(pa) {
		res.Notes = append(res.Notes, "principal B's answer is byte-identical to principal A's")
	}
	if !counted && pb.ok() && pb.sameAs(pa) {
		v.failf("principal B got principal A's answer byte for byte: a replay across principals (give a count to tell apart a handler whose answers are constant)")
	}
	if !pa2.sameAs(pa) {
		v.failf("principal A again got %s, want A's own answer", pa2.describe())
	}
	if !pb2.sameAs(pb) {
		v.failf("principal B again got %s, want B's own answer", pb2.describe())
	}
	v.set(res, fmt.Sprintf("A %d, B %d (its own), each replays its own", pa.status, pb.status))
}

func checkQuotedKey(ctx context.Context, r *runner, res *Result) {
	var v verdict
	bare := newKey("quoted")
	quoted := `"` + bare + `"`
	c := r.startCount(ctx)
	p1 := r.do(ctx, res, reqOpts{label: "quoted", key: withKey(quoted), body: r.t.Body})
	p2 := r.do(ctx, res, reqOpts{label: "quoted again", key: withKey(quoted), body: r.t.Body})
	p3 := r.do(ctx, res, reqOpts{label: "bare form", key: withKey(bare), body: r.t.Body})
	if !p1.ok() {
		v.failf("quoted key got %s, want 2xx", p1.describe())
	}
	if !p2.sameAs(p1) {
		v.failf("quoted key again got %s, want the first answer", p2.describe())
	}
	if !p3.sameAs(p1) {
		v.failf(`bare form of the quoted key got %s, want the same key's answer`, p3.describe())
	}
	v.executions(ctx, c, 1, "one key in quoted and bare form")
	v.set(res, fmt.Sprintf("%d; quoted and bare forms replay it", p1.status))
}

func checkRetryAfter(ctx context.Context, r *runner, res *Result) {
	var seen []response
	if r.t.Hold != nil {
		seen = r.holdForInProgress(ctx, res)
		if len(seen) == 0 {
			res.Status, res.Reason = Skip, "no in-progress answer while the endpoint was held: the server makes later requests wait (or ignores keys)"
			return
		}
	} else {
		const rounds = 5
		for i := 0; i < rounds && len(seen) == 0; i++ {
			o := reqOpts{label: fmt.Sprintf("racing, round %d", i+1), key: withKey(newKey("inprogress")), body: r.t.Body, header: r.t.SlowHeader}
			for _, p := range r.race(ctx, r.t.Concurrency, o) {
				res.Evidence = append(res.Evidence, exchange(o, p))
				if p.inProgress() {
					seen = append(seen, p)
				}
			}
		}
		if len(seen) == 0 {
			res.Status, res.Reason = Skip, fmt.Sprintf("no in-progress answer in %d rounds of %d racing requests: the endpoint is too fast to observe (give Target.Hold, Target.SlowHeader or a slower endpoint)", rounds, r.t.Concurrency)
			return
		}
	}
	var v verdict
	for _, p := range seen {
		ra := p.header.Get("Retry-After")
		if !validRetryAfter(ra) {
			v.failf("in-progress answer %s has Retry-After %q, want delay-seconds or an HTTP date", p.describe(), ra)
			break
		}
	}
	v.set(res, fmt.Sprintf("%d in-progress answers, Retry-After=%s", len(seen), seen[0].header.Get("Retry-After")))
}

func validRetryAfter(s string) bool {
	if s == "" {
		return false
	}
	if n, err := strconv.Atoi(s); err == nil {
		return n >= 0
	}
	_, err := http.ParseTime(s)
	return err == nil
}

// holdForInProgress holds the endpoint, races requests on one key and
// releases it as soon as one answers in-progress (or after HoldTimeout).
//
// The order matters: with the endpoint held, whichever request claims the
// key first blocks inside the handler, so every other request must meet a
// claimed key. Releasing on the first in-progress answer keeps the check
// fast; the timeout covers servers that make later requests wait.
func (r *runner) holdForInProgress(ctx context.Context, res *Result) []response {
	release := r.t.Hold()
	var once sync.Once
	rel := func() { once.Do(release) }
	defer rel()
	o := reqOpts{label: "racing while held", key: withKey(newKey("held")), body: r.t.Body}
	out := make(chan response, r.t.Concurrency)
	for range r.t.Concurrency {
		go func() { out <- r.send(ctx, o) }()
	}
	timer := time.NewTimer(r.t.HoldTimeout)
	defer timer.Stop()
	var seen []response
	for got := 0; got < r.t.Concurrency; {
		select {
		case p := <-out:
			got++
			res.Evidence = append(res.Evidence, exchange(o, p))
			if p.inProgress() {
				seen = append(seen, p)
				rel()
			}
		case <-timer.C:
			res.Notes = append(res.Notes, fmt.Sprintf("released after %s without an in-progress answer", r.t.HoldTimeout))
			rel()
		}
	}
	return seen
}

func checkServerErrorReleased(ctx context.Context, r *runner, res *Result) {
	if len(r.t.FaultHeader) == 0 {
		res.Status, res.Reason = Skip, "no way to provoke a 5xx given (Target.FaultHeader, --fault-header)"
		return
	}
	var v verdict
	k := withKey(newKey("fault"))
	c := r.startCount(ctx)
	p1 := r.do(ctx, res, reqOpts{label: "with fault header", key: k, body: r.t.Body, header: r.t.FaultHeader})
	p2 := r.do(ctx, res, reqOpts{label: "retry without fault", key: k, body: r.t.Body})
	if p1.err != nil || p1.status < 500 {
		v.failf("the fault header got %s, want a 5xx", p1.describe())
	}
	switch {
	case p2.sameAs(p1) || p2.replayed():
		v.failf("the retry got %s: the 5xx was stored and replayed", p2.describe())
	case !p2.ok():
		v.failf("the retry got %s, want 2xx (a fresh execution)", p2.describe())
	}
	v.executions(ctx, c, 1, "a failed request and its retry")
	v.set(res, fmt.Sprintf("%d, then retry %d (executed)", p1.status, p2.status))
}

func checkExpiry(ctx context.Context, r *runner, res *Result) {
	if r.t.TTL == 0 {
		res.Status, res.Reason = Skip, "no TTL given (Target.TTL, --ttl)"
		return
	}
	var v verdict
	k := withKey(newKey("expiry"))
	p1 := r.do(ctx, res, reqOpts{label: "first", key: k, body: r.t.Body})
	used := time.Now()
	if !p1.ok() {
		v.failf("first request got %s, want 2xx", p1.describe())
		v.set(res, "")
		return
	}
	// The server's clock started at or before our "used"; waiting TTL from
	// here means its retention has ended by the time we look.
	wait := time.NewTimer(r.t.TTL)
	defer wait.Stop()
	select {
	case <-ctx.Done():
		v.failf("cancelled while waiting for the TTL: %v", ctx.Err())
		v.set(res, "")
		return
	case <-wait.C:
	}
	// Another body with the same key: refused as a mismatch while the key
	// is retained, a fresh execution once it expired.
	o := reqOpts{label: "other body after TTL", key: k, body: r.t.AltBody}
	deadline := time.Now().Add(r.t.SettleTimeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var p response
	for {
		p = r.send(ctx, o)
		if p.ok() || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
	res.Evidence = append(res.Evidence, exchange(o, p))
	after := time.Since(used).Round(time.Millisecond)
	switch {
	case !p.ok():
		v.failf("%s after the key was used it still answers %s, want the key usable again", after, p.describe())
	case p.replayed():
		v.failf("after the TTL the key replayed (%s)", idem.HeaderReplayed)
	}
	v.set(res, fmt.Sprintf("key usable again %s after first use (TTL %s)", after, r.t.TTL))
}
