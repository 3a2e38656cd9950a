package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// keepLease returns the handler's context for a two-step claim of fence
// that was sent at sent, and stop, which the caller calls once the handler
// has returned. Step by step:
//
//  1. sent is when the claim left this process. The store started the lease
//     at its own now, which cannot be earlier, so sent+Lease is never later
//     than the lease's real end, whatever the round trip or a pause after it
//     took. (Reckoning from when Claim returned, as this package once did,
//     let a handler that honoured its context outlive its lease by the
//     round trip.)
//  2. The handler's context ends at sent+HandlerTimeout.
//  3. A heartbeat renews the lease every Lease/3 while the handler runs.
//     Each renewal again counts from when it was sent, and is fenced by the
//     token: it fails if a retry took the key over.
//  4. If no renewal gets through (the store is unreachable, slow or the
//     lease was taken), the heartbeat ends the handler's context, cause
//     ErrLeaseLost, Lease/5 before the last lease it knows of would end:
//     before any retry could take the key over. A renewal in flight is
//     bounded by the same instant.
//  5. The heartbeat stops when the handler's context ends, for whatever
//     reason: a handler that goes on past its context is no longer
//     protected, and its completion is fenced out if a retry takes over.
func (m *Middleware) keepLease(rq *request, fence int64, sent time.Time) (context.Context, func()) {
	tctx, tcancel := context.WithDeadline(rq.ctx, sent.Add(m.cfg.HandlerTimeout))
	hctx, cancel := context.WithCancelCause(tctx)
	hb := &heartbeat{m: m, rq: rq, fence: fence, cancel: cancel, stop: make(chan struct{}), done: make(chan struct{})}
	go hb.run(hctx, sent.Add(m.cfg.Lease))
	return hctx, func() {
		close(hb.stop)
		<-hb.done
		cancel(context.Canceled)
		tcancel()
	}
}

type heartbeat struct {
	m      *Middleware
	rq     *request
	fence  int64
	cancel context.CancelCauseFunc
	stop   chan struct{}
	done   chan struct{}
}

type renewal struct {
	sent time.Time
	err  error
}

// run is the heartbeat; expiry is the lease's end as far as this process
// can be sure.
func (hb *heartbeat) run(hctx context.Context, expiry time.Time) {
	defer close(hb.done)
	lease := hb.m.cfg.Lease
	every, margin := lease/3, lease/5
	cutoff := time.NewTimer(time.Until(expiry.Add(-margin)))
	defer cutoff.Stop()
	tick := time.NewTimer(every)
	defer tick.Stop()
	var renew <-chan time.Time
	if every > 0 {
		renew = tick.C
	}
	var (
		result  chan renewal // the renewal in flight, nil if none
		rcancel context.CancelFunc
	)
	defer func() {
		if result != nil {
			rcancel()
			<-result
		}
	}()
	for {
		select {
		case <-hb.stop:
			return
		case <-hctx.Done():
			return
		case <-cutoff.C:
			hb.lost(fmt.Errorf("%w: no renewal got through in time", ErrLeaseLost))
			return
		case <-renew:
			renew = nil
			rctx, c := context.WithDeadline(context.WithoutCancel(hb.rq.ctx), expiry.Add(-margin))
			result, rcancel = make(chan renewal, 1), c
			go func(sent time.Time) {
				result <- renewal{sent, hb.m.store.Renew(rctx, hb.rq.claim.Key, hb.fence, lease)}
			}(time.Now())
		case r := <-result:
			rcancel()
			result = nil
			switch {
			case r.err == nil:
				expiry = r.sent.Add(lease)
				cutoff.Reset(time.Until(expiry.Add(-margin)))
				tick.Reset(time.Until(r.sent.Add(every)))
			case errors.Is(r.err, ErrFenced):
				hb.lost(fmt.Errorf("%w: %w", ErrLeaseLost, r.err))
				return
			default:
				// Unreachable, or too slow: try again soon, until the cutoff.
				tick.Reset(every / 4)
			}
			renew = tick.C
		}
	}
}

// lost ends the handler's context and reports it.
func (hb *heartbeat) lost(err error) {
	hb.cancel(err)
	e := hb.rq.ev
	e.Kind, e.Fence, e.Err = EventLeaseLost, hb.fence, err
	hb.m.hook(hb.rq, e)
}
