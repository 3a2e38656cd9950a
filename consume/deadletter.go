package consume

import (
	"context"
	"time"
	"unicode/utf8"
)

// stuck is a message whose handler gave up and whose dead-letter failed:
// it holds its stream while its dead-letter is retried in the background.
type stuck struct {
	it       *item
	dl       DeadLetter
	cause    error
	attempts int       // dead-letter attempts so far
	next     time.Time // when the next attempt is due
	inflight bool      // an attempt is running
	reported bool      // KindStuck was emitted
}

type dlResult struct {
	st  *stuck
	err error
}

// deadLetter dead-letters it after the handler gave up (failures failures,
// the last cause). The first attempt runs here, in the processing loop,
// bounded by DeadLetterTimeout: it is the common case and succeeds in
// milliseconds. If it fails, the message becomes stuck, step by step:
//
//  1. the driver is told to hold its stream (Session.Hold): nothing after
//     it on that stream is processed or acked, so its ack can never be
//     skipped over and it is never lost;
//  2. the loop goes on with the other streams, and with rebalances;
//  3. further attempts run in the background, with backoff, until one
//     succeeds (the message is acked, its stream resumes) or the stream is
//     revoked or the consumer stops (it stays unacked and comes back).
//     After DeadLetterAttempts failures it is reported: KindStuck.
func (r *run) deadLetter(it *item, cause error, failures int) outcome {
	st := &stuck{it: it, cause: cause, dl: DeadLetter{
		Error: truncateError(cause.Error()), Attempts: failures, ConsumerID: r.cfg.ConsumerID,
	}}
	err := r.deadLetterOnce(st)
	st.attempts = 1
	if err == nil {
		r.deadLettered(st)
		return outDone
	}
	if r.work.Err() != nil {
		r.abandon(it, false)
		return outAbandoned
	}
	r.hold(it.m)
	r.held[it.m.Stream] = st
	r.dlFailed(st, err)
	return outHeld
}

func (r *run) deadLetterOnce(st *stuck) error {
	ctx, cancel := context.WithTimeout(st.it.ctx, r.cfg.DeadLetterTimeout)
	defer cancel()
	return r.sess.DeadLetter(ctx, st.it.m, st.dl)
}

func (r *run) deadLettered(st *stuck) {
	m := st.it.m
	e := r.event(KindDeadLettered, st.it)
	e.Attempt, e.Err, e.Stuck = st.dl.Attempts, st.cause, st.reported
	r.emit(st.it.ctx, e)
	r.c.log.Error("message dead-lettered", "event_id", m.EventID, "stream", m.Stream, "offset", m.Offset, "attempts", st.dl.Attempts, "err", st.cause)
	r.done = append(r.done, m)
}

// dlFailed records a failed dead-letter attempt and schedules the next.
func (r *run) dlFailed(st *stuck, err error) {
	m := st.it.m
	wait := r.c.backoff.Delay(st.attempts)
	if st.attempts >= r.cfg.DeadLetterAttempts {
		wait = r.cfg.BackoffMax
	}
	st.next = time.Now().Add(wait)
	e := r.event(KindDeadLetterFailed, st.it)
	e.Attempt, e.Err, e.Wait, e.Stuck = st.attempts, err, wait, st.reported
	r.emit(st.it.ctx, e)
	if st.reported || st.attempts < r.cfg.DeadLetterAttempts {
		r.c.log.Warn("dead-letter failed", "event_id", m.EventID, "stream", m.Stream, "offset", m.Offset, "attempt", st.attempts, "err", err)
		return
	}
	st.reported = true
	e = r.event(KindStuck, st.it)
	e.Attempt, e.Err = st.attempts, err
	r.emit(st.it.ctx, e)
	r.c.log.Error("message stuck: it can be neither processed nor dead-lettered; its stream is held until the dead-letter succeeds (see package consume's doc for what to do)",
		"event_id", m.EventID, "stream", m.Stream, "offset", m.Offset, "handler_err", st.cause, "dead_letter_err", err, "retry_every", r.cfg.BackoffMax)
}

// nextDue is when the earliest stuck message's next attempt is due (zero
// if none waits).
func (r *run) nextDue() time.Time {
	var due time.Time
	for _, st := range r.held {
		if !st.inflight && (due.IsZero() || st.next.Before(due)) {
			due = st.next
		}
	}
	return due
}

// startDue launches the due background attempts, one per stuck message at
// a time. They run on the message's ctx (the hard stop cancels them), and
// report through results, waking the Fetch in progress.
func (r *run) startDue() {
	now := time.Now()
	for _, st := range r.held {
		if st.inflight || now.Before(st.next) {
			continue
		}
		st.inflight = true
		r.inflight.Add(1)
		go func() {
			defer r.inflight.Done()
			err := r.deadLetterOnce(st)
			r.mu.Lock()
			r.results = append(r.results, dlResult{st: st, err: err})
			wake := r.wake
			r.mu.Unlock()
			if wake != nil {
				wake()
			}
		}()
	}
}

// collect applies the results of finished background attempts.
func (r *run) collect() {
	r.mu.Lock()
	res := r.results
	r.results = nil
	r.mu.Unlock()
	for _, x := range res {
		st := x.st
		st.inflight = false
		st.attempts++
		if r.held[st.it.m.Stream] != st {
			continue // revoked or abandoned meanwhile: its next owner has it
		}
		if x.err == nil {
			delete(r.held, st.it.m.Stream)
			r.deadLettered(st) // the ack that follows ends the hold
			continue
		}
		r.dlFailed(st, x.err)
	}
}

// truncateError cuts s to DeadLetterErrorMaxBytes at a rune boundary.
func truncateError(s string) string {
	if len(s) <= DeadLetterErrorMaxBytes {
		return s
	}
	const ellipsis = "…"
	cut := DeadLetterErrorMaxBytes - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}
