package outbox

import (
	"context"
	"fmt"
)

// Publisher delivers events to a broker. A relay calls Publish once per
// batch in the common case; a batch in which an aggregate changes topic
// takes one call per change (see "waves" in the package doc).
//
// What the relay guarantees about a call:
//
//   - events is not empty and holds each event once, at most BatchSize.
//   - The events of one aggregate (AggregateType, AggregateID) in a call
//     have consecutive sequence numbers, all go to one Topic, and come in
//     sequence order in the slice; other aggregates' events may sit
//     between them.
//   - Every earlier event of each of those aggregates has been delivered:
//     it was PUBLISHED before the batch, or an earlier call of this batch
//     reported it delivered. No event of an aggregate is in a call after
//     one of its earlier events failed in the batch.
//   - ctx carries the call's deadline: BatchTimeout from the start of the
//     batch, less the quarter the relay keeps for recording the outcome.
//     The relay's soft stop does not cancel it; its hard stop does.
//   - A relay makes one call at a time, but several relays (or several
//     batches, after a call outlived its deadline) may call one Publisher
//     concurrently: Publish must be safe for concurrent use.
//
// What Publish must report:
//
//   - nil when every event was delivered (the broker acknowledged it as
//     durable).
//   - a *BatchError when only some were, with Errs[i] the result of
//     events[i]: by input index, whatever order the broker answered in.
//   - any other error when none may be taken as delivered; each event of
//     the call then counts a failed attempt.
//
// Publish must return by ctx's deadline, reporting an event whose outcome
// is still unknown as failed (with ctx's error): the relay publishes it
// again later, which is a duplicate at worst. The relay stops waiting at
// the deadline in any case and counts a failed attempt for every event of
// a call that has not returned.
//
// What the publisher must keep, and all it must keep, of the order: the
// events of one aggregate reach the broker in slice order, and once one of
// them fails, no later event of that aggregate in the same call is
// delivered (report those failed too). A broker's ordered stream per key
// gives this without code: franz-go's idempotent producer fails every
// later record of a partition after a failed one, and an aggregate's
// records share a partition. A refusal before sending (a record over the
// size limit) does not: franz-go fails such a record alone and sends the
// ones behind it, and that is what Checker is for. The rest — holding an
// aggregate back after a failure, across calls and topics — is the
// relay's work, not the publisher's.
//
// Package publishertest is the suite a Publisher must pass.
type Publisher interface {
	Publish(ctx context.Context, events []Event) error
}

// Checker is implemented by a Publisher that can tell, without sending,
// that an event cannot be published: a record over the client's size
// limit, a message with no destination. Before a batch's first call the
// relay checks every event it is about to hand over; a refusal counts as a
// failed attempt of that event (retried with backoff, DEAD after
// MaxAttempts), the later events of its aggregate wait behind it, and the
// rest of the batch goes out. When an earlier event of the same aggregate
// then fails in the call, the refused one is held behind that failure
// instead, not counted. Check must be fast and must not block: it
// runs once per event of every batch.
type Checker interface {
	Check(e Event) error
}

// BatchError is a partial failure: Errs[i] is the error of events[i], nil
// for a delivered event. len(Errs) must equal the call's length; a
// BatchError of another length counts as a failure of the whole call.
type BatchError struct {
	Errs []error
}

func (e *BatchError) Error() string {
	n := 0
	var first error
	for _, err := range e.Errs {
		if err != nil {
			if first == nil {
				first = err
			}
			n++
		}
	}
	return fmt.Sprintf("outbox: %d of %d events failed: %v", n, len(e.Errs), first)
}
