package grpcconformance

import (
	"context"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
)

// checks are the HTTP suite's checks mapped to gRPC codes (idemtest's
// expiry check has no counterpart: it needs a short retention), plus
// stored-error.
var checks = []check{
	{idemtest.CheckBaseline, "a call with a fresh key succeeds and executes once", checkBaseline},
	{idemtest.CheckMissingKey, "a call without a key is InvalidArgument IDEMPOTENCY_KEY_REQUIRED and does not execute", checkMissingKey},
	{idemtest.CheckInvalidKey, "a key breaking the key rule (too long, two values, not visible ASCII, a bad quoted string) is InvalidArgument IDEMPOTENCY_KEY_INVALID", checkInvalidKey},
	{idemtest.CheckReplay, "a retry with the same key gets the same response bytes with idempotent-replayed: true, no second execution", checkReplay},
	{idemtest.CheckMismatch, "the key reused with another request (and with each field changed) is FailedPrecondition IDEMPOTENCY_KEY_REUSED", checkMismatch},
	{idemtest.CheckConcurrency, "concurrent calls with one key execute once; the others get Aborted IDEMPOTENCY_KEY_IN_PROGRESS or the replay", checkConcurrency},
	{idemtest.CheckPrincipals, "one key used by two principals is two operations", checkPrincipals},
	{idemtest.CheckQuotedKey, `a quoted key ("k") is the same key as k`, checkQuotedKey},
	{idemtest.CheckRetryAfter, "the in-progress answer carries a RetryInfo with a positive delay", checkRetryAfter},
	{idemtest.CheckServerErrorReleased, "a released error (Unavailable, Internal…) frees the key: the retry executes", checkServerErrorReleased},
	{idemtest.CheckRoutes, "one key on another method is another operation", checkRoutes},
	{CheckStoredError, "a definitive error is stored: the retry gets its code and message without executing", checkStoredError},
}

func checkBaseline(ctx context.Context, r *runner, res *idemtest.Result) {
	var v verdict
	c := r.startCount(ctx)
	p := r.do(ctx, res, opts{label: "first", keys: []string{newKey("base")}})
	if !p.ok() {
		v.failf("got %s, want OK", p.describe())
	}
	v.executions(ctx, c, 1, p)
	v.set(res, "OK, one execution")
}

func checkMissingKey(ctx context.Context, r *runner, res *idemtest.Result) {
	var v verdict
	c := r.startCount(ctx)
	p := r.do(ctx, res, opts{label: "no key"})
	if p.code != codes.InvalidArgument || p.reason != idem.CodeKeyRequired {
		v.failf("got %s, want InvalidArgument %s", p.describe(), idem.CodeKeyRequired)
	}
	v.executions(ctx, c, 0)
	v.set(res, "InvalidArgument IDEMPOTENCY_KEY_REQUIRED, not executed")
}

func checkInvalidKey(ctx context.Context, r *runner, res *idemtest.Result) {
	var v verdict
	c := r.startCount(ctx)
	for _, k := range []struct {
		label string
		keys  []string
	}{
		{"too long", []string{strings.Repeat("k", idem.MaxKeyLength+1)}},
		{"two values", []string{newKey("a"), newKey("b")}},
		{"space inside", []string{"two words"}},
		{"unterminated quote", []string{`"` + newKey("q")}},
	} {
		p := r.do(ctx, res, opts{label: k.label, keys: k.keys})
		if p.code != codes.InvalidArgument || p.reason != idem.CodeKeyInvalid {
			v.failf("%s: got %s, want InvalidArgument %s", k.label, p.describe(), idem.CodeKeyInvalid)
		}
	}
	v.executions(ctx, c, 0)
	v.set(res, "every bad key refused, not executed")
}

func checkReplay(ctx context.Context, r *runner, res *idemtest.Result) {
	var v verdict
	c := r.startCount(ctx)
	k := []string{newKey("replay")}
	first := r.do(ctx, res, opts{label: "first", keys: k})
	second := r.do(ctx, res, opts{label: "retry", keys: k})
	switch {
	case !first.ok():
		v.failf("first: %s", first.describe())
	case !second.sameAs(first):
		v.failf("the retry got %s (%d bytes), not the first answer (%d bytes)", second.describe(), len(second.body), len(first.body))
	case !second.replayed:
		v.failf("the retry has no %s: true header metadata", "idempotent-replayed")
	}
	v.executions(ctx, c, 1, first, second)
	v.set(res, "same bytes, replayed, one execution")
}

func checkMismatch(ctx context.Context, r *runner, res *idemtest.Result) {
	var v verdict
	c := r.startCount(ctx)
	k := []string{newKey("mismatch")}
	first := r.do(ctx, res, opts{label: "first", keys: k})
	if !first.ok() {
		v.failf("first: %s", first.describe())
		v.set(res, "")
		return
	}
	others := variants(r.t.Request)
	if r.t.MismatchRequest != nil {
		others = append([]variant{{"MismatchRequest", r.t.MismatchRequest}}, others...)
	}
	if len(others) == 0 {
		res.Status, res.Reason = idemtest.Skip, "no MismatchRequest and the request has no field to change"
		return
	}
	for _, o := range others {
		p := r.do(ctx, res, opts{label: "changed " + o.path, keys: k, req: o.req})
		if p.code != codes.FailedPrecondition || p.reason != idem.CodeKeyReused {
			v.failf("%s: got %s, want FailedPrecondition %s", o.path, p.describe(), idem.CodeKeyReused)
		}
	}
	v.executions(ctx, c, 1, first)
	v.set(res, "every changed request refused")
}

func checkConcurrency(ctx context.Context, r *runner, res *idemtest.Result) {
	var v verdict
	c := r.startCount(ctx)
	k := []string{newKey("race")}
	ps := make([]reply, r.t.Concurrency)
	var wg sync.WaitGroup
	for i := range ps {
		wg.Go(func() { ps[i] = r.send(ctx, opts{keys: k}) })
	}
	wg.Wait()
	var ok, busy int
	var body []byte
	for _, p := range ps {
		switch {
		case p.ok():
			if body != nil && string(body) != string(p.body) {
				v.failf("two different OK answers: two executions")
			}
			body = p.body
			ok++
		case p.inProgress():
			busy++
		default:
			v.failf("a racing call got %s", p.describe())
		}
	}
	res.Evidence = append(res.Evidence, idemtest.Exchange{Label: "race", Key: k[0], Code: tally(ok, busy, len(ps))})
	final := r.settle(ctx, res, k)
	if !final.ok() {
		v.failf("after the race: %s", final.describe())
	} else if body != nil && string(final.body) != string(body) {
		v.failf("after the race: a different answer")
	}
	v.executions(ctx, c, 1, append(ps, final)...)
	v.set(res, tally(ok, busy, len(ps)))
}

func tally(ok, busy, n int) string {
	return strings.Join([]string{itoa(ok) + " OK", itoa(busy) + " in progress", itoa(n-ok-busy) + " other"}, ", ")
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

// settle retries k until it is no longer in progress.
func (r *runner) settle(ctx context.Context, res *idemtest.Result, k []string) reply {
	deadline := time.Now().Add(r.t.SettleTimeout)
	for {
		p := r.do(ctx, res, opts{label: "settle", keys: k})
		if !p.inProgress() || time.Now().After(deadline) || ctx.Err() != nil {
			return p
		}
		time.Sleep(50 * time.Millisecond) // poll the first call's end
	}
}

func checkPrincipals(ctx context.Context, r *runner, res *idemtest.Result) {
	if r.t.PrincipalB == nil {
		res.Status, res.Reason = idemtest.Skip, "no PrincipalB"
		return
	}
	var v verdict
	c := r.startCount(ctx)
	k := []string{newKey("principals")}
	a := r.do(ctx, res, opts{label: "principal A", keys: k})
	b := r.do(ctx, res, opts{label: "principal B", keys: k, md: r.t.PrincipalB})
	switch {
	case !a.ok() || !b.ok():
		v.failf("A: %s, B: %s; want OK twice", a.describe(), b.describe())
	case b.replayed || (r.t.Count == nil && b.sameAs(a)):
		v.failf("B got A's answer replayed")
	}
	v.executions(ctx, c, 2, a, b)
	v.set(res, "two executions")
}

func checkQuotedKey(ctx context.Context, r *runner, res *idemtest.Result) {
	var v verdict
	c := r.startCount(ctx)
	k := newKey("quoted")
	bare := r.do(ctx, res, opts{label: "bare", keys: []string{k}})
	quoted := r.do(ctx, res, opts{label: "quoted", keys: []string{`"` + k + `"`}})
	if !bare.ok() || !quoted.sameAs(bare) {
		v.failf("bare: %s, quoted: %s; want the same answer", bare.describe(), quoted.describe())
	}
	v.executions(ctx, c, 1, bare, quoted)
	v.set(res, "one operation")
}

func checkRetryAfter(ctx context.Context, r *runner, res *idemtest.Result) {
	var v verdict
	k := []string{newKey("busy")}
	var seen *reply
	if r.t.Hold != nil {
		// The first call to claim the key waits at the gate; any other
		// call, the first sent or a later one, must be told it is in
		// progress. Each call runs on its own goroutine, since the one
		// that claims the key blocks until release.
		release := r.t.Hold()
		results := make(chan reply, 64)
		var wg sync.WaitGroup
		sent := 0
		launch := func() {
			sent++
			wg.Go(func() { results <- r.send(ctx, opts{keys: k}) })
		}
		launch()
		tick := time.NewTicker(20 * time.Millisecond)
		deadline := time.After(r.t.HoldTimeout)
	wait:
		for seen == nil {
			select {
			case p := <-results:
				if p.inProgress() {
					seen = &p
				}
			case <-tick.C:
				if sent < cap(results) {
					launch()
				}
			case <-deadline:
				break wait
			}
		}
		tick.Stop()
		release()
		wg.Wait()
		close(results)
		if seen != nil {
			res.Evidence = append(res.Evidence, exchange("in progress", k, *seen))
		}
	} else {
		ps := make([]reply, r.t.Concurrency)
		var wg sync.WaitGroup
		for i := range ps {
			wg.Go(func() { ps[i] = r.send(ctx, opts{keys: k}) })
		}
		wg.Wait()
		for i := range ps {
			if ps[i].inProgress() {
				seen = &ps[i]
				break
			}
		}
		if seen == nil {
			res.Status, res.Reason = idemtest.Skip, "no racing call saw the key in progress (set Hold)"
			return
		}
	}
	switch {
	case seen == nil:
		v.failf("no Aborted %s within %s", idem.CodeKeyInProgress, r.t.HoldTimeout)
	case seen.delay <= 0:
		v.failf("the in-progress answer has no RetryInfo with a positive delay")
	}
	v.set(res, "Aborted with RetryInfo")
}

func checkServerErrorReleased(ctx context.Context, r *runner, res *idemtest.Result) {
	if r.t.FaultMetadata == nil {
		res.Status, res.Reason = idemtest.Skip, "no FaultMetadata"
		return
	}
	var v verdict
	c := r.startCount(ctx)
	k := []string{newKey("fault")}
	f := r.do(ctx, res, opts{label: "fault", keys: k, md: r.t.FaultMetadata})
	if f.ok() {
		v.failf("the fault call succeeded")
	}
	again := r.do(ctx, res, opts{label: "retry", keys: k})
	if !again.ok() || again.replayed {
		v.failf("the retry got %s, want a fresh OK", again.describe())
	}
	v.executions(ctx, c, 1, again)
	v.set(res, "released, the retry executed")
}

func checkRoutes(ctx context.Context, r *runner, res *idemtest.Result) {
	if r.t.AltMethod == "" {
		res.Status, res.Reason = idemtest.Skip, "no AltMethod"
		return
	}
	var v verdict
	c := r.startCount(ctx)
	k := []string{newKey("routes")}
	a := r.do(ctx, res, opts{label: r.t.Method, keys: k})
	b := r.do(ctx, res, opts{label: r.t.AltMethod, keys: k, method: r.t.AltMethod, req: r.t.AltRequest})
	switch {
	case !a.ok() || !b.ok():
		v.failf("%s: %s, %s: %s; want OK twice", r.t.Method, a.describe(), r.t.AltMethod, b.describe())
	case b.replayed:
		v.failf("%s replayed %s's answer", r.t.AltMethod, r.t.Method)
	}
	v.executions(ctx, c, 2, a, b)
	v.set(res, "two operations")
}

func checkStoredError(ctx context.Context, r *runner, res *idemtest.Result) {
	if r.t.ErrorRequest == nil {
		res.Status, res.Reason = idemtest.Skip, "no ErrorRequest"
		return
	}
	var v verdict
	k := []string{newKey("error")}
	first := r.do(ctx, res, opts{label: "first", keys: k, req: r.t.ErrorRequest})
	c := r.startCount(ctx)
	again := r.do(ctx, res, opts{label: "retry", keys: k, req: r.t.ErrorRequest})
	switch {
	case first.ok():
		v.failf("ErrorRequest succeeded")
	case !again.sameAs(first):
		v.failf("the retry got %s, want %s", again.describe(), first.describe())
	case r.t.Count == nil && !again.replayed:
		// Without a count, the marker is the only sign that the retry
		// did not execute.
		v.failf("the retry is not marked replayed (and no Count tells whether it executed)")
	case !again.replayed:
		res.Notes = append(res.Notes, "the replayed error has no idempotent-replayed header metadata")
	}
	v.executions(ctx, c, 0)
	v.set(res, first.code.String()+" stored and replayed")
}
