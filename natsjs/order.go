package natsjs

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/consume"
)

// Order across members and crashes, step by step.
//
// JetStream delivers a durable's messages in stream order, but a message
// delivered and not acknowledged stays with the member that took it until
// that member acks it or AckWait passes. A member SIGKILLed with e1..e3 of
// one subject in hand leaves them pending; the restarted member (or any
// other) is then delivered e4, e5 of the same subject at once, and e1..e3
// only after AckWait: processed as they came, the subject's order would
// be e4 e5 e1 e2 e3. So before handing a first-time message m (stream
// sequence S) to the Consumer, the session checks that every earlier
// message of m's subject is acknowledged or was delivered to this session:
//
//  1. fast path: every sequence above the durable's ack floor (as read
//     when the session bound the durable) and below S was delivered to
//     this session (contig >= S-1): nothing of the subject can be pending
//     elsewhere. One member running alone takes this path for every
//     message after the first redeliveries;
//  2. otherwise the ack floor is read again (the durable's info, once
//     per Fetch) and, above it, the subject's earlier messages are looked
//     up in the stream one by one (a stream message get with
//     next_by_subj);
//  3. the first one that this session was not delivered blocks m: m is
//     kept back (in hand, renewed by the heartbeat, never acked) together
//     with every later message of its subject, and re-checked after each
//     Fetch. It is released once the blocking message is delivered here
//     (its holder died and AckWait passed) or the ack floor passes it
//     (its holder, alive, acked it), in sequence order, or at the latest
//     after orderWaitMax (the blocker is then taken to be in a live
//     member's hand, renewed for as long as it works on it, or acked out
//     of order).
//
// The earliest unacknowledged message of the stream is never kept back
// (nothing below it is unacked), so the durable always moves. A message
// above the floor that was acked out of order (another subject's, or this
// subject's by a member that then died) cannot be told from a pending one:
// its subject's later messages wait until the floor passes it (the
// pending messages below it redelivered after AckWait and acked), or
// orderWaitMax.
type seqOrder struct {
	floor   uint64          // the durable's ack floor, as last read
	contig  uint64          // every sequence <= contig is <= floor or was delivered here
	got     map[uint64]bool // delivered here, above contig
	waiting map[string][]*waitingMsg
	checked time.Time // when floor was last read
}

type waitingMsg struct {
	m     *consume.Message
	since time.Time
}

// orderWaitMax bounds how long a message is kept back: long enough for
// a dead member's pending messages to come back (AckWait, counted from
// before the message was kept back, plus a pull or two to fetch them),
// after which the blocker is taken to be in a live member's hand (it
// renews it) or acked out of order, and the message is delivered. Order
// across live members sharing a durable is not kept (see the package doc).
func (s *session) orderWaitMax() time.Duration {
	return s.cfg.AckWait + s.cfg.AckWait/2 + 2*s.cfg.FetchMaxWait
}

// received notes that seq was delivered to this session.
func (o *seqOrder) received(seq uint64) {
	if seq > o.contig {
		o.got[seq] = true
	}
	o.advance()
}

func (o *seqOrder) advance() {
	if o.floor > o.contig {
		for q := range o.got {
			if q <= o.floor {
				delete(o.got, q)
			}
		}
		o.contig = o.floor
	}
	for o.got[o.contig+1] {
		delete(o.got, o.contig+1)
		o.contig++
	}
}

// behind reports (and keeps back) m when earlier messages of its subject
// are kept back already: it goes after them.
func (o *seqOrder) behind(m *consume.Message) bool {
	w := o.waiting[m.Stream]
	if len(w) == 0 {
		return false
	}
	o.wait(m)
	return true
}

// wait keeps m back, in sequence order within its subject, once.
func (o *seqOrder) wait(m *consume.Message) {
	w := o.waiting[m.Stream]
	for _, x := range w {
		if x.m.Offset == m.Offset {
			return
		}
	}
	i := len(w)
	for i > 0 && w[i-1].m.Offset > m.Offset {
		i--
	}
	w = append(w, nil)
	copy(w[i+1:], w[i:])
	w[i] = &waitingMsg{m: m, since: time.Now()}
	o.waiting[m.Stream] = w
}

// inOrder reports whether every earlier message of m's subject is acked
// or was delivered to this session (steps 1 and 2 above).
func (s *session) inOrder(ctx context.Context, i int, m *consume.Message) bool {
	o := s.order[i]
	seq := uint64(m.Offset)
	if o.contig+1 >= seq {
		return true
	}
	if o.checked.IsZero() || time.Since(o.checked) > s.cfg.FetchMaxWait/2 {
		info, err := s.consumers[i].Info(ctx)
		if err != nil {
			return s.lookupFailed(m, err)
		}
		o.floor, o.checked = max(o.floor, info.AckFloor.Stream), time.Now()
		o.advance()
		if o.contig+1 >= seq {
			return true
		}
	}
	for next := o.floor + 1; next < seq; {
		if next <= o.contig || o.got[next] {
			next++
			if next <= o.contig {
				next = o.contig + 1
			}
			continue
		}
		prev, err := s.streams[i].GetMsg(ctx, next, jetstream.WithGetMsgSubject(m.Stream))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return true
		}
		if err != nil {
			return s.lookupFailed(m, err)
		}
		switch {
		case prev.Sequence >= seq:
			return true
		case prev.Sequence <= o.contig || o.got[prev.Sequence]:
			next = prev.Sequence + 1
		default:
			return false // prev is pending elsewhere, or acked out of order
		}
	}
	return true
}

// lookupFailed: the check could not run (the stream cannot be read: a
// permission missing, the server unreachable); the message waits, and a
// later Fetch checks again, up to orderWaitMax.
func (s *session) lookupFailed(m *consume.Message, err error) bool {
	s.log.Debug("order check", "subject", m.Stream, "seq", m.Offset, "err", err)
	return false
}

// release returns topic i's kept-back messages whose turn has come, per
// subject in sequence order (step 3 above).
func (s *session) release(ctx context.Context, i int) []*consume.Message {
	o := s.order[i]
	var out []*consume.Message
	for subj, w := range o.waiting {
		n := 0
		for n < len(w) && s.held[subj] == nil && (time.Since(w[n].since) > s.orderWaitMax() || s.inOrder(ctx, i, w[n].m)) {
			out = append(out, w[n].m)
			n++
		}
		if n == len(w) {
			delete(o.waiting, subj)
		} else {
			o.waiting[subj] = w[n:]
		}
	}
	// Streams in the order of their first message: the lowest sequence.
	slicesSortByOffset(out)
	return out
}

func slicesSortByOffset(ms []*consume.Message) {
	slices.SortStableFunc(ms, func(a, b *consume.Message) int { return cmp.Compare(a.Offset, b.Offset) })
}
