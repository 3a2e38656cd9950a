package outbox

import "time"

// RelayEventKind says what a RelayEvent reports.
type RelayEventKind string

// The kinds of RelayEvent, in the order a batch emits them.
const (
	// RelayBatchBegin: a batch starts (also one that will claim nothing:
	// an idle poll). The ctx the hook returns becomes the batch's context,
	// for the database and the publisher: a tracer starts the batch's span
	// here. It must be derived from the ctx the hook was given, which
	// carries the batch deadline.
	RelayBatchBegin RelayEventKind = "batch_begin"
	// RelayBatchClaimed: the batch claimed Count events (Events), taking
	// Duration. Not emitted for an empty claim.
	RelayBatchClaimed RelayEventKind = "batch_claimed"
	// RelayPublished: Count events (Events) were delivered and their mark
	// is about to be written; Duration is the time spent in Publish
	// calls, Calls how many there were.
	RelayPublished RelayEventKind = "published"
	// RelayFailed: Count events (Events, each with its Err) had a failed
	// attempt: the publisher (or its Checker) reported an error, or the
	// call outlived its deadline. Err is the first error.
	RelayFailed RelayEventKind = "failed"
	// RelayDead: Count events (Events) used up MaxAttempts and are DEAD,
	// by a batch's mark or by the reaper; each holds back its aggregate
	// until Requeue.
	RelayDead RelayEventKind = "dead"
	// RelayLeaseLost: a two-phase batch's mark matched only part of its
	// rows because the reaper had returned the lease: Count rows were left
	// to their new owner. Err wraps ErrLeaseLost.
	RelayLeaseLost RelayEventKind = "lease_lost"
	// RelayBatchDone: a batch ended, after Duration. Count is how many
	// events it claimed; Published, Failed and Held tally their outcome
	// (Held: not attempted, or not counted, behind a failure of their
	// aggregate in this batch); Calls is the number of Publish calls. Err
	// is what RunBatch returns. Every RelayBatchBegin has one.
	RelayBatchDone RelayEventKind = "batch_done"
	// RelayReaped: the reaper returned Count expired leases to PENDING (or
	// DEAD); emitted when Count > 0 or Err is set.
	RelayReaped RelayEventKind = "reaped"
	// RelayPurged: a purge run deleted Count PUBLISHED rows older than
	// Retention, taking Duration; emitted when Count > 0 or Err is set.
	RelayPurged RelayEventKind = "purged"
	// RelayListenFailed: the LISTEN connection failed with Err; the relay
	// reconnects with backoff and polls meanwhile.
	RelayListenFailed RelayEventKind = "listen_failed"

	// The kinds below are emitted only by the WAL relay (package
	// outbox/wal, Mode WAL), whose batches report the kinds above too.

	// RelaySlotAcquired: the relay became the slot's reader (Slot) and
	// streams from it.
	RelaySlotAcquired RelayEventKind = "slot_acquired"
	// RelaySlotBusy: another relay reads the slot; this one is a standby
	// and retries. Emitted once per failed acquisition streak.
	RelaySlotBusy RelayEventKind = "slot_busy"
	// RelaySlotLag: a periodic measure of the slot: LagBytes (WAL the slot
	// retains past its confirmed position) and LagAge (the age of the
	// oldest committed event not yet confirmed, 0 when none, or when this
	// relay is not the slot's reader). Err is set when the measure failed.
	RelaySlotLag RelayEventKind = "slot_lag"
	// RelayStreamFailed: the replication connection failed or ended with
	// Err; the relay reconnects with backoff, resuming from the slot's
	// confirmed position.
	RelayStreamFailed RelayEventKind = "stream_failed"
)

// RelayEvent is what a Relay reports to RelayConfig.Hook. It carries what
// a metric, a log line or a span needs and never an event's payload.
type RelayEvent struct {
	Kind RelayEventKind
	// Mode and Owner identify the relay.
	Mode  Mode
	Owner string
	// Count is how many events (or rows) the kind concerns; see each kind.
	Count int
	// Published, Failed and Held are RelayBatchDone's tally.
	Published, Failed, Held int
	// Calls is how many Publish calls the batch made (RelayPublished,
	// RelayBatchDone).
	Calls int
	// Duration: see each kind.
	Duration time.Duration
	// Events are the events concerned, for RelayBatchClaimed,
	// RelayPublished, RelayFailed and RelayDead (a span's links, a log
	// line); nil for the other kinds. The hook must not keep the slice.
	Events []EventInfo
	// Err is the error, when the kind has one.
	Err error
	// Slot, LagBytes and LagAge are the WAL relay's (RelaySlotAcquired,
	// RelaySlotBusy, RelaySlotLag); empty and zero for the table relay.
	Slot     string
	LagBytes int64
	LagAge   time.Duration
}

// EventInfo identifies one event in a RelayEvent.
type EventInfo struct {
	// ID is the outbox row id.
	ID            int64
	EventID       string
	EventType     string
	Topic         string
	AggregateType string
	AggregateID   string
	Seq           int64
	// Attempts is how many attempts the event had before this batch.
	Attempts int
	// Headers are the message's own headers (a trace context, say).
	Headers map[string]string
	// CreatedAt is when the event was enqueued (the enqueuing
	// transaction's start, by the database's clock): RelayPublished's
	// events minus it is the publish latency.
	CreatedAt time.Time
	// Err is the event's error in RelayFailed.
	Err error
}

func infoOf(e *Event) EventInfo {
	return EventInfo{
		ID: e.ID, EventID: e.EventID, EventType: e.EventType, Topic: e.Topic,
		AggregateType: e.AggregateType, AggregateID: e.AggregateID, Seq: e.Seq,
		Attempts: e.Attempts, Headers: e.Headers, CreatedAt: e.CreatedAt,
	}
}
