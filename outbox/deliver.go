package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrPublishTimeout is the error of the events of a Publish call that had
// not returned when its deadline passed. Their outcome is unknown: each
// counts a failed attempt and is published again later.
var ErrPublishTimeout = errors.New("outbox: publish did not return by its deadline")

// outcome is what became of a batch's events, as indices into the batch:
// delivered (ok), failed (an attempt counted, with errs[i] and a backoff),
// and held (not attempted, or attempted and not counted, because an
// earlier event of the same aggregate failed in this batch or the publish
// ran out of time first).
type outcome struct {
	ok, failed, held []int
	errs             []error // by event index; set for failed events
	calls            int
	publishing       time.Duration
}

func (o *outcome) ids(events []Event, idx []int) []int64 {
	ids := make([]int64, len(idx))
	for k, i := range idx {
		ids[k] = events[i].ID
	}
	return ids
}

// err summarises the failed events, nil if none.
func (o *outcome) err() error {
	if len(o.failed) == 0 {
		return nil
	}
	n := len(o.ok) + len(o.failed) + len(o.held)
	return fmt.Errorf("outbox: %d of %d events failed: %w", len(o.failed), n, o.errs[o.failed[0]])
}

// run is one aggregate's events in a sorted batch: events[next:end] are
// still to be handed over. A failure sets next = end: nothing more of the
// aggregate goes out in this batch.
type run struct{ next, end int }

// deliver hands a sorted batch to the publisher and reports what became of
// each event. This is the only place where the per-aggregate order is
// kept; publishers keep none of it (see Publisher).
//
// The order promise is about first deliveries: no event of an aggregate
// reaches the broker before every earlier event of it has been delivered.
// Within one call, a broker's ordered stream keeps it for events of one
// aggregate to one topic (the Publisher contract); across topics nothing
// on the broker does, so the batch goes out in waves:
//
//  1. each wave takes, of every aggregate still going, the run of its
//     next events that share one topic;
//  2. the wave is one Publish call, and the next wave waits for its
//     outcome;
//  3. an aggregate whose event failed (or was refused by the publisher's
//     Checker) is done for this batch: its later events are held, whatever
//     a later call would have said about them.
//
// An aggregate whose events in the batch all go to one topic — the common
// case — is in the first wave whole, so a batch without topic changes is
// one call. Waves begin only while the publish deadline lasts; events left
// when it passes are held, not counted.
func (r *Relay) deliver(ctx context.Context, events []Event) outcome {
	o := outcome{errs: make([]error, len(events))}
	var runs []run
	for i := 0; i < len(events); {
		j := i + 1
		for j < len(events) && events[j].aggregate() == events[i].aggregate() {
			j++
		}
		runs = append(runs, run{i, j})
		i = j
	}
	hold := func(from, to int) {
		for k := from; k < to; k++ {
			o.held = append(o.held, k)
		}
	}
	if r.check != nil {
		for ri := range runs {
			ru := &runs[ri]
			for i := ru.next; i < ru.end; i++ {
				if err := r.check.Check(events[i]); err != nil {
					o.errs[i] = err
					o.failed = append(o.failed, i)
					hold(i+1, ru.end)
					ru.end = i
					break
				}
			}
		}
	}

	pctx, cancel := r.publishContext(ctx)
	defer cancel()
	type part struct{ run, from, to int } // events[from:to] of runs[run] in this wave
	var parts []part
	idx := make([]int, 0, len(events))
	for {
		parts, idx = parts[:0], idx[:0]
		for ri := range runs {
			ru := &runs[ri]
			if ru.next >= ru.end {
				continue
			}
			to := ru.next + 1
			for to < ru.end && events[to].Topic == events[ru.next].Topic {
				to++
			}
			parts = append(parts, part{ri, ru.next, to})
			for k := ru.next; k < to; k++ {
				idx = append(idx, k)
			}
		}
		if len(parts) == 0 {
			break
		}
		if pctx.Err() != nil {
			// No time left for this wave: its events and the rest of
			// their aggregates were not attempted.
			for _, p := range parts {
				hold(p.from, runs[p.run].end)
				runs[p.run].next = runs[p.run].end
			}
			break
		}
		call := events // the common case: one wave of the whole batch, in order
		if len(idx) < len(events) {
			call = make([]Event, len(idx))
			for k, i := range idx {
				call[k] = events[i]
			}
		}
		t0 := time.Now()
		errs := r.call(pctx, call)
		o.publishing += time.Since(t0)
		o.calls++
		pos := 0
		for _, p := range parts {
			ru := &runs[p.run]
			failedAt := -1
			for k := p.from; k < p.to; k, pos = k+1, pos+1 {
				var err error
				if errs != nil {
					err = errs[pos]
				}
				switch {
				case failedAt >= 0:
					if err == nil {
						// The broker has this event while an earlier one
						// of its aggregate failed: the publisher broke
						// its contract, and the wire its order. Held, it
						// is published again after the failed one.
						r.log.WarnContext(ctx, "outbox: the publisher delivered an event after a failed earlier event of its aggregate in the same call (Publisher contract)",
							"event_id", events[k].EventID, "failed_event_id", events[failedAt].EventID)
					}
				case err != nil:
					failedAt = k
					o.errs[k] = err
					o.failed = append(o.failed, k)
				default:
					o.ok = append(o.ok, k)
				}
			}
			if failedAt >= 0 {
				hold(failedAt+1, ru.end)
				ru.next = ru.end
			} else {
				ru.next = p.to
			}
		}
	}
	o.unrefuse(events)
	r.emitOutcome(ctx, events, &o)
	return o
}

// unrefuse turns a Checker's refusal into a held event when an earlier
// event of its aggregate failed in the batch's calls: the refusal was
// found first, but the event comes after the failure, which ends its
// aggregate for the batch (not attempted, not counted). Counted, it could
// go DEAD beside the earlier failure, and a DEAD event must be its
// aggregate's first unpublished one (an operator's Discard of it says
// nothing of the events before it).
func (o *outcome) unrefuse(events []Event) {
	first := map[aggregateKey]int64{} // the lowest failed sequence
	for _, i := range o.failed {
		k := events[i].aggregate()
		if s, ok := first[k]; !ok || events[i].Seq < s {
			first[k] = events[i].Seq
		}
	}
	kept := o.failed[:0]
	for _, i := range o.failed {
		if events[i].Seq > first[events[i].aggregate()] {
			o.errs[i] = nil
			o.held = append(o.held, i)
			continue
		}
		kept = append(kept, i)
	}
	o.failed = kept
}

// publishContext is the batch context less a quarter of BatchTimeout. A
// publish that cannot finish (a broker down, say) then still leaves the
// batch the time to record the failure:
//  1. the events get their attempt counted, last_error and a backoff, and
//     go back to PENDING (two-phase) or stay PENDING (at-least-once);
//  2. without the reserve, the mark would fail on the same expired
//     context: at-least-once would roll back and count nothing, two-phase
//     would leave the rows PUBLISHING until the reaper took them after
//     LeaseTTL, a minute of silence for the aggregates involved.
func (r *Relay) publishContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if dl, ok := ctx.Deadline(); ok {
		return context.WithDeadline(ctx, dl.Add(-r.cfg.BatchTimeout/4))
	}
	return context.WithCancel(ctx)
}

// call runs one Publish and returns its per-event errors, nil when all
// were delivered. It waits for the publisher until ctx's deadline and then
// a grace of BatchTimeout/8 (half the reserve kept for the mark), so that
// a publisher that honours ctx is heard; a call still running after that
// (or at once, when the hard stop cancelled ctx) is abandoned and all its
// events fail with ErrPublishTimeout. The
// abandoned call may still deliver some of them later: they are published
// again, a duplicate at worst, and in order, since every later event of
// their aggregates waits for that republish.
func (r *Relay) call(ctx context.Context, events []Event) []error {
	done := make(chan error, 1)
	go func() { done <- r.pub.Publish(ctx, events) }()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		wait := r.cfg.BatchTimeout / 8
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			wait = 0 // the hard stop: abandon at once
		}
		grace := time.NewTimer(wait)
		select {
		case err = <-done:
		case <-grace.C:
			err = fmt.Errorf("%w (%d events): %w", ErrPublishTimeout, len(events), ctx.Err())
		}
		grace.Stop()
	}
	if err == nil {
		return nil
	}
	errs := make([]error, len(events))
	var be *BatchError
	if errors.As(err, &be) {
		if len(be.Errs) == len(events) {
			copy(errs, be.Errs)
			return errs
		}
		err = fmt.Errorf("outbox: publisher returned a BatchError of %d errors for %d events: %w", len(be.Errs), len(events), err)
	}
	for i := range errs {
		errs[i] = err
	}
	return errs
}

func (r *Relay) emitOutcome(ctx context.Context, events []Event, o *outcome) {
	if r.cfg.Hook == nil {
		return
	}
	if len(o.ok) > 0 {
		infos := make([]EventInfo, len(o.ok))
		for k, i := range o.ok {
			infos[k] = infoOf(&events[i])
		}
		r.emit(ctx, RelayEvent{Kind: RelayPublished, Count: len(infos), Calls: o.calls, Duration: o.publishing, Events: infos})
	}
	if len(o.failed) > 0 {
		infos := make([]EventInfo, len(o.failed))
		for k, i := range o.failed {
			infos[k] = infoOf(&events[i])
			infos[k].Err = o.errs[i]
		}
		r.emit(ctx, RelayEvent{Kind: RelayFailed, Count: len(infos), Calls: o.calls, Duration: o.publishing,
			Events: infos, Err: infos[0].Err})
	}
}
