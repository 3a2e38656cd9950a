package wal

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/idemkit/idem/internal/failpoint"
	"github.com/idemkit/idem/internal/startstop"
	"github.com/idemkit/idem/outbox"
)

// publishLoop takes what the reader queued, up to BatchSize at a time,
// and delivers it until ctx ends. ctx ends with the run (a soft stop) or
// when the reader gives up; runCtx is the run's own, to tell the two
// apart: after a soft stop, a transaction of which some events are
// delivered is finished (finishTx).
func (r *Relay) publishLoop(ctx, runCtx context.Context, p *progress) {
	defer func() {
		if runCtx.Err() != nil {
			r.finishTx(runCtx, p)
		}
	}()
	for {
		r.mu.Lock()
		n := min(len(p.queue), r.cfg.BatchSize)
		if n > 0 {
			p.inflight = append(p.inflight[:0], p.queue[:n]...)
			p.delivered = make([]bool, n)
			p.queue = append(p.queue[:0], p.queue[n:]...)
		}
		r.mu.Unlock()
		if n == 0 {
			select {
			case <-ctx.Done():
				return
			case <-p.kick:
				continue
			}
		}
		signal(p.space)
		r.deliver(ctx, p, true)
		if ctx.Err() != nil {
			return
		}
	}
}

// finishTx runs after a soft stop. The slot's position can be confirmed
// only at a transaction's end, so when the delivered events stop inside
// a transaction (one larger than BatchSize, or a batch cut across two),
// stopping there would make the next reader publish its delivered part
// again. finishTx delivers the rest of that transaction (all of it is
// queued: the reader queues a transaction whole, at its commit) and no
// further, on the work context: retried with backoff until it is done,
// or abandoned by the hard stop (which is what bounds a Stop: the caller
// hard-stops at its deadline). Step by step, with p.open the end of the
// transaction the delivered prefix stops inside:
//
//  1. the batch in hand keeps its delivered prefix and the undelivered
//     events of p.open's transaction; later events are dropped from it
//     (not confirmed, so the next reader gets them);
//  2. once the batch in hand is delivered, the queued events of that
//     transaction, BatchSize at a time, become the batch in hand;
//  3. each delivery advances p.open and p.acked; when the transaction's
//     last event is delivered, p.open is 0 and acked is its end, which
//     the stream confirms before it closes.
func (r *Relay) finishTx(ctx context.Context, p *progress) {
	wctx, cancel := startstop.WorkContext(ctx)
	defer cancel()
	for wctx.Err() == nil {
		r.mu.Lock()
		open := p.open
		if open == 0 || p.broken {
			r.mu.Unlock()
			return
		}
		k := 0
		for k < len(p.inflight) && p.delivered[k] {
			k++
		}
		j := k
		for j < len(p.inflight) && p.inflight[j].end == open {
			j++
		}
		p.inflight, p.delivered = p.inflight[:j], p.delivered[:j]
		if k == j { // the batch in hand is delivered: take the rest from the queue
			n := 0
			for n < len(p.queue) && n < r.cfg.BatchSize && p.queue[n].end == open {
				n++
			}
			if n == 0 { // cannot happen (a transaction is queued whole); do not spin
				r.mu.Unlock()
				return
			}
			p.inflight = append(p.inflight[:0], p.queue[:n]...)
			p.delivered = make([]bool, n)
			p.queue = append(p.queue[:0], p.queue[n:]...)
		}
		r.mu.Unlock()
		r.log.DebugContext(wctx, "outbox/wal relay stopping: finishing the transaction in hand", "slot", r.slotName(), "owner", r.cfg.Owner)
		r.deliver(wctx, p, false)
	}
}

// deliver publishes the batch in hand until every event of it is
// delivered, or ctx ends (then after the attempt in hand). The slot's
// position moves past an event only once it and all before it are
// delivered; what is left undelivered at a stop is sent again by the
// slot to the next reader. absorb says whether a retry may take queued
// events into the batch (not while finishing a transaction at a stop).
func (r *Relay) deliver(ctx context.Context, p *progress, absorb bool) {
	for attempt := 1; ; attempt++ {
		r.attempt(ctx, p)
		r.mu.Lock()
		done := true
		for _, d := range p.delivered {
			done = done && d
		}
		if done {
			p.inflight, p.delivered = p.inflight[:0], nil
		}
		r.mu.Unlock()
		if done || ctx.Err() != nil {
			return
		}
		if absorb {
			r.absorb(p)
		}
		t := time.NewTimer(r.backoff.Delay(attempt))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// absorb moves queued events into the batch in hand before a retry, up
// to 4 × BatchSize in all, so that the aggregates that did not fail go on
// while a failed event is retried; the slot's position still waits for
// the failed one. r.mu is not held.
func (r *Relay) absorb(p *progress) {
	r.mu.Lock()
	n := min(len(p.queue), 4*r.cfg.BatchSize-len(p.inflight))
	if n > 0 {
		p.inflight = append(p.inflight, p.queue[:n]...)
		p.delivered = append(p.delivered, make([]bool, n)...)
		p.queue = append(p.queue[:0], p.queue[n:]...)
	}
	r.mu.Unlock()
	if n > 0 {
		signal(p.space)
	}
}

type aggKey struct{ typ, id string }

// attempt makes one publish attempt of the batch's undelivered events, in
// waves: a call holds at most one topic per aggregate (a publisher keeps
// an aggregate's order only within a call and a partition), and once an
// event of an aggregate fails, its later events are held for the next
// attempt.
func (r *Relay) attempt(ctx context.Context, p *progress) {
	wctx, cancel := startstop.WorkContext(ctx)
	defer cancel()
	bctx, cancelBatch := context.WithTimeout(wctx, r.cfg.BatchTimeout)
	defer cancelBatch()
	start := time.Now()

	r.mu.Lock()
	var todo []int
	for i, d := range p.delivered {
		if !d {
			todo = append(todo, i)
		}
	}
	events := make([]outbox.Event, len(p.inflight))
	for i := range p.inflight {
		events[i] = p.inflight[i].ev
	}
	var xids []uint32
	for _, i := range todo {
		if x := p.inflight[i].xid; !slices.Contains(xids, x) {
			xids = append(xids, x)
		}
	}
	r.mu.Unlock()

	bctx = r.emit(bctx, outbox.RelayEvent{Kind: outbox.RelayBatchBegin})
	r.emit(bctx, outbox.RelayEvent{Kind: outbox.RelayBatchClaimed, Count: len(todo), Events: infos(events, todo, nil)})

	// Nothing is published before its transaction is visible to a new
	// snapshot: the slot can hand over a commit before the server shows
	// it (see visibility). The wait is bounded by the attempt's timeout;
	// past it, or when the server cannot be asked, the attempt fails
	// whole and is retried like a failed publish.
	err := p.vis.await(bctx, xids, func(n int) {
		r.log.DebugContext(bctx, "outbox/wal relay waits for decoded transactions to become visible", "transactions", n, "slot", r.slotName(), "owner", r.cfg.Owner)
	})
	if err == nil {
		// Crash window: the batch is decoded and in hand, nothing is
		// published, the slot's position is before it. A crash loses the
		// batch in hand only: the next reader decodes it again from the
		// confirmed position.
		err = failpoint.Inject(failpoint.RelayMidClaim)
	}
	if err != nil {
		errs := make([]error, len(todo))
		for j := range errs {
			errs[j] = err
		}
		r.emit(bctx, outbox.RelayEvent{Kind: outbox.RelayFailed, Count: len(todo), Err: err, Events: infos(events, todo, errs)})
		r.emit(bctx, outbox.RelayEvent{Kind: outbox.RelayBatchDone, Count: len(todo), Failed: len(todo), Duration: time.Since(start), Err: err})
		return
	}

	held := map[aggKey]bool{}
	var published, failed, heldN, calls int
	var firstErr error
	var pubDur time.Duration
	for len(todo) > 0 {
		// One wave: events in order, cut where an aggregate would change
		// topic; events of held aggregates wait.
		topic := map[aggKey]string{}
		var call, rest []int
		cut := false
		for _, i := range todo {
			e := &events[i]
			k := aggKey{e.AggregateType, e.AggregateID}
			if held[k] {
				heldN++
				continue
			}
			if cut {
				rest = append(rest, i)
				continue
			}
			if t, ok := topic[k]; ok && t != e.Topic {
				cut = true
				rest = append(rest, i)
				continue
			}
			if r.check != nil {
				if err := r.check.Check(*e); err != nil {
					held[k] = true
					failed++
					firstErr = cmpErr(firstErr, err)
					r.emit(bctx, outbox.RelayEvent{Kind: outbox.RelayFailed, Count: 1, Err: err, Events: infos(events, []int{i}, []error{err})})
					continue
				}
			}
			topic[k] = e.Topic
			call = append(call, i)
		}
		todo = rest
		if len(call) == 0 {
			continue
		}
		batch := make([]outbox.Event, len(call))
		for j, i := range call {
			batch[j] = events[i]
		}
		pctx, cancelPub := context.WithTimeout(bctx, r.cfg.BatchTimeout*3/4)
		t0 := time.Now()
		err := r.pub.Publish(pctx, batch)
		if pctx.Err() != nil && err == nil {
			err = pctx.Err() // a publisher that returned late: not taken as delivered
		}
		cancelPub()
		pubDur += time.Since(t0)
		calls++
		errs := perEvent(err, len(batch))
		if slices.Contains(errs, nil) {
			// Crash window: the broker has these events, the slot's
			// position does not pass them. A crash makes the next reader
			// publish them again: a duplicate, never a loss. (The
			// failpoint's error form takes them as not delivered: the
			// same duplicate, without the crash.)
			if ferr := failpoint.Inject(failpoint.RelayPublished); ferr != nil {
				errs = perEvent(ferr, len(batch))
			}
		}
		var ok, bad []int
		var badErrs []error
		r.mu.Lock()
		for j, i := range call {
			if errs[j] == nil {
				p.delivered[i] = true
				ok = append(ok, i)
			} else {
				bad, badErrs = append(bad, i), append(badErrs, errs[j])
				held[aggKey{events[i].AggregateType, events[i].AggregateID}] = true
			}
		}
		r.advance(p)
		r.mu.Unlock()
		published += len(ok)
		failed += len(bad)
		if len(ok) > 0 {
			r.emit(bctx, outbox.RelayEvent{Kind: outbox.RelayPublished, Count: len(ok), Calls: 1, Duration: time.Since(t0), Events: infos(events, ok, nil)})
		}
		if len(bad) > 0 {
			firstErr = cmpErr(firstErr, badErrs[0])
			r.emit(bctx, outbox.RelayEvent{Kind: outbox.RelayFailed, Count: len(bad), Err: badErrs[0], Events: infos(events, bad, badErrs)})
		}
	}
	_ = pubDur
	r.emit(bctx, outbox.RelayEvent{Kind: outbox.RelayBatchDone, Count: published + failed + heldN,
		Published: published, Failed: failed, Held: heldN, Calls: calls, Duration: time.Since(start), Err: firstErr})
}

// advance moves p.acked to the end of the last transaction of the batch
// in hand whose events, and all before them, are delivered, and sets
// p.open to the end of the transaction that the delivered events stop
// inside (0 at a transaction's end). A batch with nothing delivered at
// its head leaves both as the previous batch left them. r.mu is held.
func (r *Relay) advance(p *progress) {
	for i := range p.inflight {
		if !p.delivered[i] {
			return
		}
		if !p.inflight[i].last {
			p.open = p.inflight[i].end
			continue
		}
		p.open = 0
		if p.inflight[i].end > p.acked {
			p.acked = p.inflight[i].end
		}
	}
}

func cmpErr(first, err error) error {
	if first == nil {
		return err
	}
	return first
}

// perEvent spreads a Publish result over n events.
func perEvent(err error, n int) []error {
	errs := make([]error, n)
	if err == nil {
		return errs
	}
	var be *outbox.BatchError
	if errors.As(err, &be) && len(be.Errs) == n {
		copy(errs, be.Errs)
		return errs
	}
	if errors.As(err, &be) {
		err = fmt.Errorf("outbox/wal: publisher reported %d results for %d events: %w", len(be.Errs), n, err)
	}
	for i := range errs {
		errs[i] = err
	}
	return errs
}

func infos(events []outbox.Event, idx []int, errs []error) []outbox.EventInfo {
	out := make([]outbox.EventInfo, len(idx))
	for j, i := range idx {
		e := &events[i]
		out[j] = outbox.EventInfo{ID: e.ID, EventID: e.EventID, EventType: e.EventType, Topic: e.Topic,
			AggregateType: e.AggregateType, AggregateID: e.AggregateID, Headers: e.Headers, CreatedAt: e.CreatedAt}
		if errs != nil {
			out[j].Err = errs[j]
		}
	}
	return out
}
