package consume

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/failpoint"
)

// item is a message the Consumer has begun (KindBegin): its ctx carries
// the hook's values and the event id, for every later call and event.
type item struct {
	m     *Message
	ctx   context.Context
	begun time.Time
	batch int // size of the batch it was begun in (1 without Batch)
}

type outcome int

const (
	outDone      outcome = iota + 1 // committed or dead-lettered: ack it
	outAbandoned                    // a stop interrupted it: leave it unacked
	outHeld                         // stuck: it holds its stream
)

func (r *run) begin(m *Message, batch int) *item {
	ctx := context.WithValue(r.work, eventIDKey{}, m.EventID)
	e := newEvent(KindBegin, r.cfg.ConsumerID, m)
	e.Records = batch
	return &item{m: m, ctx: r.emit(ctx, e), begun: time.Now(), batch: batch}
}

func (r *run) event(k Kind, it *item) Event {
	e := newEvent(k, r.cfg.ConsumerID, it.m)
	e.Records = it.batch
	return e
}

func (r *run) abandon(it *item, stuck bool) {
	e := r.event(KindAbandoned, it)
	e.Stuck = stuck
	r.emit(it.ctx, e)
}

// process processes the fetched messages stream by stream, in the order
// of each stream's first message; each stream's messages in order.
func (r *run) process(msgs []*Message) {
	if len(msgs) == 0 {
		return
	}
	var order []string
	byStream := map[string][]*Message{}
	for _, m := range msgs {
		if _, ok := byStream[m.Stream]; !ok {
			order = append(order, m.Stream)
		}
		byStream[m.Stream] = append(byStream[m.Stream], m)
	}
	for _, s := range order {
		ms := byStream[s]
		switch {
		case r.ctx.Err() != nil:
			return
		case r.held[s] != nil:
			// A driver that could not stop delivering a held stream: hand
			// the messages back, they come again after the hold.
			r.holdRest(ms)
		case r.cfg.Batch && len(ms) > 1:
			r.processBatch(ms)
		default:
			r.processEach(ms, nil)
		}
	}
}

// processEach processes msgs (one stream, in order) one transaction each.
// begun, if set, holds the items already begun (a failed batch). It stops
// at the first message that is not done, so that an ack never skips one.
func (r *run) processEach(msgs []*Message, begun []*item) {
	rest := func(from int) {
		for _, it := range begun[min(from, len(begun)):] {
			r.abandon(it, false)
		}
	}
	for i, m := range msgs {
		if r.ctx.Err() != nil {
			rest(i)
			return
		}
		var it *item
		if begun != nil {
			it = begun[i]
		} else {
			it = r.begin(m, 1)
		}
		switch r.processOne(it) {
		case outDone:
			continue
		case outAbandoned:
			rest(i + 1)
			return
		case outHeld:
			r.holdRest(msgs[i+1:])
			rest(i + 1)
			return
		}
	}
}

// holdRest hands back messages that come after a stuck one on its stream.
func (r *run) holdRest(msgs []*Message) {
	for _, m := range msgs {
		r.hold(m)
	}
}

func (r *run) hold(m *Message) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.work), r.cfg.AckTimeout)
	defer cancel()
	if err := r.sess.Hold(ctx, m); err != nil {
		r.c.log.Error("hold", "stream", m.Stream, "offset", m.Offset, "err", err)
	}
}

// processOne runs it to an outcome: committed (or found a duplicate),
// dead-lettered, stuck, or abandoned by a stop.
func (r *run) processOne(it *item) outcome {
	m := it.m
	// Without a storable event id there is nothing to prepare: tryOne
	// dead-letters.
	prepared := r.cfg.Prepare == nil || inbox.ValidateEventID(m.EventID) != nil
	failures := 0
	for attempt := 1; ; attempt++ {
		if r.work.Err() != nil {
			r.abandon(it, false)
			return outAbandoned
		}
		var (
			kind      Kind
			herr, err error
		)
		if !prepared {
			// Steps 1 and 2 of Config.Prepare: no transaction is open.
			var seen bool
			if seen, err = r.c.db.seen(it.ctx, r.cfg.ConsumerID, m.EventID); err == nil {
				if seen {
					prepared = true // the transaction finds the duplicate
				} else if v, perr := r.cfg.Prepare(it.ctx, m); perr != nil {
					herr = perr
				} else {
					it.ctx = context.WithValue(it.ctx, preparedKey{}, v)
					prepared = true
				}
			}
		}
		if prepared && err == nil && herr == nil {
			kind, herr, err = r.tryOne(it)
		}
		if err != nil && messageFault(err) && r.work.Err() == nil {
			// PostgreSQL refused what this message makes it do, and would
			// on every attempt: the message's fault, as a Permanent error.
			herr, err = Permanent(err), nil
		}
		if err == nil && herr == nil {
			e := r.event(kind, it)
			e.Attempt, e.Duration = attempt, time.Since(it.begun)
			r.emit(it.ctx, e)
			r.done = append(r.done, m)
			return outDone
		}
		if r.work.Err() != nil {
			// A hard stop cancelled the attempt: not the message's fault.
			r.abandon(it, false)
			return outAbandoned
		}
		if herr != nil {
			failures++
			if failures >= r.cfg.MaxAttempts || IsPermanent(herr) {
				return r.deadLetter(it, herr, failures)
			}
		}
		// A database failure is not the message's fault: it is retried
		// until it passes or the consumer stops, without counting towards
		// MaxAttempts.
		wait := r.c.backoff.Delay(attempt)
		e := r.event(KindRetried, it)
		e.Attempt, e.Handler, e.Wait = attempt, herr != nil, wait
		if herr != nil {
			e.Err = herr
			r.c.log.Warn("handler failed", "event_id", m.EventID, "stream", m.Stream, "offset", m.Offset, "attempt", failures, "err", herr)
		} else {
			e.Err = err
			r.c.log.Warn("transaction failed", "event_id", m.EventID, "stream", m.Stream, "offset", m.Offset, "err", err)
		}
		r.emit(it.ctx, e)
		if !r.sleep(wait) {
			r.abandon(it, false)
			return outAbandoned
		}
	}
}

// tryOne is one attempt: begin, mark, handle, commit. herr is the
// handler's error (the transaction rolled back); err any other failure.
func (r *run) tryOne(it *item) (k Kind, herr, err error) {
	if err := inbox.ValidateEventID(it.m.EventID); err != nil {
		// Checked before the database: PostgreSQL would refuse the mark
		// on every attempt.
		return "", Permanent(err), nil
	}
	ctx := it.ctx
	tx, err := r.c.db.begin(ctx)
	if err != nil {
		return "", nil, fmt.Errorf("consume: begin: %w", err)
	}
	defer tx.rollback(context.WithoutCancel(ctx))
	first, err := tx.mark(ctx, r.c.inbox, r.cfg.ConsumerID, it.m.EventID)
	if err != nil {
		return "", nil, err
	}
	k = KindDuplicate
	if first {
		if herr := tx.handle(ctx, it.m); herr != nil {
			return "", herr, nil
		}
		k = KindProcessed
	}
	if err := tx.commit(ctx); err != nil {
		return "", nil, fmt.Errorf("consume: commit: %w", err)
	}
	r.dbCommitted()
	return k, nil, nil
}

// dbCommitted marks the crash window between a transaction's commit and
// the ack of its messages: a kill here redelivers messages whose
// processed_event rows exist, and MarkProcessedTx skips them.
func (r *run) dbCommitted() {
	if err := failpoint.Inject(failpoint.ConsumerDBCommitted); err != nil {
		// The transaction is committed: an injected error has nothing to
		// undo. Kills and pauses are what this window is for.
		r.c.log.Warn("failpoint", "err", err)
	}
}

// processBatch processes msgs (one stream, in order) in one transaction.
// If the handler fails for any message, the transaction rolls back and the
// messages are processed one by one, so that only the bad one is retried
// and dead-lettered and the others keep their order.
func (r *run) processBatch(msgs []*Message) {
	items := make([]*item, len(msgs))
	for i, m := range msgs {
		items[i] = r.begin(m, len(msgs))
	}
	for _, it := range items {
		if inbox.ValidateEventID(it.m.EventID) != nil {
			r.processEach(msgs, items)
			return
		}
	}
	for attempt := 1; ; attempt++ {
		var kinds []Kind
		var herr, err error
		if r.work.Err() == nil {
			kinds, herr, err = r.tryBatch(items)
		}
		if r.work.Err() != nil {
			for _, it := range items {
				r.abandon(it, false)
			}
			return
		}
		if herr != nil || messageFault(err) {
			// A handler failure, or a refusal that will come back on every
			// attempt (one of the messages made PostgreSQL fail
			// definitively): message by message, only the bad one is
			// retried and dead-lettered.
			r.c.log.Info("batch failed; processing the batch message by message", "messages", len(items), "err", errors.Join(herr, err))
			r.processEach(msgs, items)
			return
		}
		if err == nil {
			for i, it := range items {
				e := r.event(kinds[i], it)
				e.Attempt, e.Duration = attempt, time.Since(it.begun)
				r.emit(it.ctx, e)
			}
			r.done = append(r.done, msgs...)
			return
		}
		// One event for the batch, on its first message's ctx.
		wait := r.c.backoff.Delay(attempt)
		e := r.event(KindRetried, items[0])
		e.Attempt, e.Wait, e.Err = attempt, wait, err
		r.emit(items[0].ctx, e)
		r.c.log.Warn("batch transaction failed", "messages", len(items), "err", err)
		if !r.sleep(wait) {
			for _, it := range items {
				r.abandon(it, false)
			}
			return
		}
	}
}

func (r *run) tryBatch(items []*item) (kinds []Kind, herr, err error) {
	ctx := r.work
	tx, err := r.c.db.begin(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("consume: begin: %w", err)
	}
	defer tx.rollback(context.WithoutCancel(ctx))
	ids := make([]string, len(items))
	for i, it := range items {
		ids[i] = it.m.EventID
	}
	first, err := tx.markBatch(ctx, r.c.inbox, r.cfg.ConsumerID, ids)
	if err != nil {
		return nil, nil, err
	}
	kinds = make([]Kind, len(items))
	for i, it := range items {
		kinds[i] = KindDuplicate
		if !first[i] {
			continue
		}
		if herr := tx.handle(it.ctx, it.m); herr != nil {
			return nil, herr, nil
		}
		kinds[i] = KindProcessed
	}
	if err := tx.commit(ctx); err != nil {
		return nil, nil, fmt.Errorf("consume: commit: %w", err)
	}
	r.dbCommitted()
	return kinds, nil, nil
}

// messageFault reports whether err, from a message's transaction (the
// mark, the handler's statements as seen by the commit, the commit), is a
// refusal PostgreSQL would repeat on every attempt because of the data
// the message brings, so that retrying it would hold its stream for ever:
//
//   - class 22, data exception (22021 invalid byte sequence, 22001 string
//     too long, 22P02 invalid text representation, 22023 …);
//   - class 54, program limit exceeded (54000: an index row over the
//     btree limit, 54001 statement too complex).
//
// Everything else stays a database failure, retried without counting:
// connection loss (08), serialization failures and deadlocks (40), lock
// timeouts and cancellations (55, 57), resource exhaustion (53), and
// class 23 (a constraint, which another transaction or an operator may
// resolve: see the package doc's Not guaranteed).
func messageFault(err error) bool {
	var pg *pgconn.PgError
	if !errors.As(err, &pg) || len(pg.Code) != 5 {
		return false
	}
	switch pg.Code[:2] {
	case "22", "54":
		return true
	}
	return false
}
