package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemkit/idem/inbox"
)

// Consumer defaults.
const (
	// ConsumerMaxPollRecordsDefault bounds the records taken per poll.
	ConsumerMaxPollRecordsDefault = 500
	// ConsumerMaxAttemptsDefault is how many times a failing handler runs
	// for one record before the record goes to the dead-letter topic.
	ConsumerMaxAttemptsDefault = 5
	// ConsumerRetryBackoffDefault is the pause after the first failure;
	// it doubles per attempt, with jitter, up to ConsumerRetryBackoffMaxDefault.
	ConsumerRetryBackoffDefault = 100 * time.Millisecond
	// ConsumerRetryBackoffMaxDefault caps the pause between attempts.
	ConsumerRetryBackoffMaxDefault = 5 * time.Second
	// ConsumerCommitTimeoutDefault bounds one offset commit and the group leave.
	ConsumerCommitTimeoutDefault = 10 * time.Second
	// DeadLetterSuffixDefault is appended to a record's topic to name its
	// dead-letter topic when ConsumerConfig.DeadLetterTopic is empty.
	DeadLetterSuffixDefault = ".dlq"
)

// Headers the consumer adds to a dead-lettered record, besides the
// original headers (the event id among them, under HeaderEventID).
const (
	// HeaderDeadLetterError carries the last handler error.
	HeaderDeadLetterError = "dlq-error"
	// HeaderDeadLetterSource is the original "topic/partition/offset".
	HeaderDeadLetterSource = "dlq-source"
	// HeaderDeadLetterAttempts is how many times the handler failed.
	HeaderDeadLetterAttempts = "dlq-attempts"
	// HeaderDeadLetterConsumer is the ConsumerID that gave up.
	HeaderDeadLetterConsumer = "dlq-consumer"
)

var (
	// ErrConsumerConfig wraps every ConsumerConfig validation error.
	ErrConsumerConfig = errors.New("kafka: invalid consumer config")
	// ErrConsumerStopped is returned by Start after Stop.
	ErrConsumerStopped = errors.New("kafka: consumer stopped")
)

// Handler applies one record's effects inside tx. It must do all its work
// through tx: tx commits together with the record's processed_event row, so
// the effects happen exactly once, and rolls back as a whole when the
// handler returns an error. No external call (HTTP, produce) belongs here;
// enqueue an outbox row with a ready idempotency key instead (see the
// package example). A handler may run more than once for a record (retries,
// batch fallback, redelivery) but only one run ever commits.
//
// ctx is cancelled only on a hard stop. The record's event id is
// EventIDFromContext(ctx).
type Handler func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error

// Beginner starts a transaction: a *pgxpool.Pool in practice.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Outcome tells what became of a record whose transaction committed.
type Outcome int

const (
	// OutcomeHandled: first delivery; the handler's effects committed.
	OutcomeHandled Outcome = iota + 1
	// OutcomeDuplicate: already processed; the handler was not called.
	OutcomeDuplicate
	// OutcomeDeadLettered: the handler kept failing (or failed with a
	// Permanent error); the record went to the dead-letter topic.
	OutcomeDeadLettered
)

func (o Outcome) String() string {
	switch o {
	case OutcomeHandled:
		return "handled"
	case OutcomeDuplicate:
		return "duplicate"
	case OutcomeDeadLettered:
		return "dead-lettered"
	}
	return "outcome(" + strconv.Itoa(int(o)) + ")"
}

// ConsumerConfig configures a Consumer. Brokers, Group and Topics are
// required; every other field has a default.
type ConsumerConfig struct {
	// Brokers are the seed brokers. Required.
	Brokers []string
	// Group is the Kafka consumer group. Required.
	Group string
	// Topics are consumed by the group. Required.
	Topics []string
	// ConsumerID is the processed_event.consumer_id of this consumer.
	// Defaults to Group.
	ConsumerID string
	// EventID derives a record's dedup key. Defaults to RecordEventID: the
	// event-id header, else topic/partition/offset.
	EventID func(*kgo.Record) string
	// Batch processes the records of one partition fetched together in one
	// transaction (each still deduplicated). If a handler fails, the batch
	// transaction rolls back and that batch is processed record by record.
	// Defaults to false (one transaction per record).
	Batch bool
	// MaxPollRecords bounds the records taken per poll, hence per batch.
	// Defaults to ConsumerMaxPollRecordsDefault (500).
	MaxPollRecords int
	// MaxAttempts is how many times the handler runs for one record before
	// it is dead-lettered. Defaults to ConsumerMaxAttemptsDefault (5).
	MaxAttempts int
	// RetryBackoff is the pause after the first failed attempt; it doubles
	// each attempt with ±25% jitter. Defaults to ConsumerRetryBackoffDefault (100ms).
	RetryBackoff time.Duration
	// RetryBackoffMax caps the pause. Defaults to ConsumerRetryBackoffMaxDefault (5s).
	RetryBackoffMax time.Duration
	// DeadLetterTopic receives records the handler gave up on. Defaults to
	// the record's topic + DeadLetterSuffixDefault (".dlq").
	DeadLetterTopic string
	// InboxForm is the SQL form of the dedup insert. Defaults to
	// inbox.FormDefault.
	InboxForm inbox.Form
	// CommitTimeout bounds each offset commit and the final group leave.
	// Defaults to ConsumerCommitTimeoutDefault (10s).
	CommitTimeout time.Duration
	// Prepare, when set, runs for each record before its transaction, with
	// no transaction open: the place for an external call (a payment
	// provider) whose outcome the handler then records, since no such call
	// belongs inside a transaction. Its result reaches the handler through
	// PreparedFromContext. Per record, step by step:
	//
	//  1. a read-only check of processed_event in a short transaction of
	//     its own (ended before step 2): a record already processed skips
	//     Prepare and is a duplicate (the handler is not called either);
	//  2. Prepare, outside any transaction;
	//  3. the transaction of Handler: processed_event + the handler's
	//     effects, then the offset as usual.
	//
	// A crash after 2 repeats Prepare on redelivery, and a concurrent
	// consumer may pass 1 too (its transaction then finds the duplicate):
	// Prepare is at-least-once, so its effect must be idempotent (a call
	// with a key fixed in the record). A Prepare error counts as a handler
	// failure: retried with backoff, dead-lettered after MaxAttempts, at
	// once if Permanent; a successful Prepare is not repeated when only the
	// transaction is retried. ctx is cancelled only on a hard stop. Not
	// allowed with Batch. Defaults to nil.
	Prepare func(ctx context.Context, rec *kgo.Record) (any, error)
	// OnProcessed is called after a record's transaction committed and
	// before its offset is committed (for metrics). It must be fast.
	// Defaults to nil.
	OnProcessed func(ctx context.Context, rec *kgo.Record, o Outcome)
	// Logger receives errors that the consumer retries or works around.
	// Defaults to slog.Default().
	Logger *slog.Logger
	// ClientOpts are extra franz-go options (TLS, SASL, reset offset…),
	// applied after the consumer's own. Options that change committing or
	// rebalancing (autocommit, OnPartitions*) break the guarantee; a static
	// kgo.InstanceID makes Stop keep the partitions reserved until the
	// session times out instead of handing them over. Defaults to none.
	ClientOpts []kgo.Opt
}

func (c *ConsumerConfig) validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrConsumerConfig}, a...)...)
	}
	switch {
	case len(c.Brokers) == 0:
		return bad("Brokers is empty")
	case c.Group == "":
		return bad("Group is empty")
	case len(c.Topics) == 0:
		return bad("Topics is empty")
	case c.MaxPollRecords < 0:
		return bad("MaxPollRecords %d is negative", c.MaxPollRecords)
	case c.MaxAttempts < 0:
		return bad("MaxAttempts %d is negative", c.MaxAttempts)
	case c.RetryBackoff < 0:
		return bad("RetryBackoff %v is negative", c.RetryBackoff)
	case c.RetryBackoffMax < 0:
		return bad("RetryBackoffMax %v is negative", c.RetryBackoffMax)
	case c.CommitTimeout < 0:
		return bad("CommitTimeout %v is negative", c.CommitTimeout)
	case c.Prepare != nil && c.Batch:
		return bad("Prepare and Batch are exclusive")
	}
	for _, t := range c.Topics {
		if t == "" {
			return bad("Topics has an empty name")
		}
	}
	return nil
}

// RecordEventID is the default ConsumerConfig.EventID: the event-id header
// if present and non-empty, else "topic/partition/offset", which is stable
// across redeliveries of the same record but not across re-publishes.
func RecordEventID(rec *kgo.Record) string {
	for _, h := range rec.Headers {
		if h.Key == HeaderEventID && len(h.Value) > 0 {
			return string(h.Value)
		}
	}
	return rec.Topic + "/" + strconv.Itoa(int(rec.Partition)) + "/" + strconv.FormatInt(rec.Offset, 10)
}

type eventIDKey struct{}

// EventIDFromContext returns the event id of the record a Handler is
// processing, as ConsumerConfig.EventID computed it ("" outside a handler).
// Build idempotency keys of downstream effects from it.
func EventIDFromContext(ctx context.Context) string {
	s, _ := ctx.Value(eventIDKey{}).(string)
	return s
}

type preparedKey struct{}

// PreparedFromContext returns the result of ConsumerConfig.Prepare for the
// record a Handler is processing (nil without Prepare).
func PreparedFromContext(ctx context.Context) any {
	return ctx.Value(preparedKey{})
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks a handler error as not worth retrying (a malformed
// payload): the record goes to the dead-letter topic at once.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

// IsPermanent reports whether err was marked by Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// Consumer runs a Handler for every record of a consumer group, in a
// database transaction that also records the event in processed_event
// (package inbox), and commits the record's offset only after that
// transaction committed.
//
// Guarantee: each event's handler effects commit exactly once per
// ConsumerID, through crashes at any point (SIGKILL included), rebalances,
// redeliveries and duplicate publishes with the same event id. The crash
// windows, step by step:
//   - before the DB commit: the transaction rolls back, the offset was not
//     committed, the record comes back and is handled then;
//   - after the DB commit, before the offset commit: the record comes back,
//     MarkProcessedTx reports a repeat, the handler is not called;
//   - after the offset commit: the record does not come back.
//
// Order: records of one partition are processed in order, one at a time (or
// one batch at a time); partitions are processed in turn on one goroutine.
// A record the handler keeps failing on goes to the dead-letter topic after
// MaxAttempts, so it cannot block its partition.
//
// Not guaranteed: effects outside the handler's transaction (they may
// repeat: use an outbox row instead, or ConsumerConfig.Prepare for a call
// that carries its own idempotency key: Prepare is at-least-once); dead-letter records are at-least-once
// (a crash after the dead-letter produce and before the offset commit sends
// the record again); duplicates older than the processed_event retention
// are handled again; a deterministic failure of the transaction itself (not
// the handler, e.g. a deferred constraint at COMMIT) is retried for ever.
type Consumer struct {
	db      Beginner
	handler Handler
	inbox   *inbox.Inbox
	cfg     ConsumerConfig
	log     *slog.Logger

	mu      sync.Mutex
	started bool
	stopped bool
	cl      *kgo.Client
	hardCtx context.Context
	hard    context.CancelFunc
	soft    context.CancelFunc // cancels the poll and backoff waits
	softCtx context.Context
	done    chan struct{}

	// offsets: per partition, the offset after the last record whose
	// transaction committed, and whether Kafka has it yet. Guarded by omu
	// because the revoke callback runs on franz-go's goroutine.
	omu     sync.Mutex
	offsets map[string]map[int32]doneOffset
}

type doneOffset struct {
	at        kgo.EpochOffset
	committed bool
}

// NewConsumer validates cfg and returns a Consumer; nothing connects until
// Start. db runs the transactions, handler applies each record.
func NewConsumer(db Beginner, handler Handler, cfg *ConsumerConfig) (*Consumer, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: db is nil", ErrConsumerConfig)
	}
	if handler == nil {
		return nil, fmt.Errorf("%w: handler is nil", ErrConsumerConfig)
	}
	c := ConsumerConfig{}
	if cfg != nil {
		c = *cfg
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	if c.ConsumerID == "" {
		c.ConsumerID = c.Group
	}
	if c.EventID == nil {
		c.EventID = RecordEventID
	}
	if c.MaxPollRecords == 0 {
		c.MaxPollRecords = ConsumerMaxPollRecordsDefault
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = ConsumerMaxAttemptsDefault
	}
	if c.RetryBackoff == 0 {
		c.RetryBackoff = ConsumerRetryBackoffDefault
	}
	if c.RetryBackoffMax == 0 {
		c.RetryBackoffMax = ConsumerRetryBackoffMaxDefault
	}
	if c.CommitTimeout == 0 {
		c.CommitTimeout = ConsumerCommitTimeoutDefault
	}
	log := c.Logger
	if log == nil {
		log = slog.Default()
	}
	ib, err := inbox.New(&inbox.Config{Form: c.InboxForm})
	if err != nil {
		return nil, fmt.Errorf("%w: InboxForm: %w", ErrConsumerConfig, err)
	}
	return &Consumer{db: db, handler: handler, inbox: ib, cfg: c, log: log.With("consumer", c.ConsumerID)}, nil
}

// Start joins the group and processes records on a goroutine until Stop.
// ctx bounds the whole run: cancelling it is a hard stop (see Stop). A
// second Start does nothing; Start after Stop returns ErrConsumerStopped.
func (c *Consumer) Start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return ErrConsumerStopped
	}
	if c.started {
		return nil
	}
	opts := []kgo.Opt{
		kgo.SeedBrokers(c.cfg.Brokers...),
		kgo.ConsumerGroup(c.cfg.Group),
		kgo.ConsumeTopics(c.cfg.Topics...),
		// Offsets are committed by hand, after the database commit.
		kgo.DisableAutoCommit(),
		// No revoke can run while a polled batch is being processed, so
		// an offset is never committed for a partition this member lost
		// mid-batch, and the revoke callback sees every finished record.
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsRevoked(c.onRevoked),
		kgo.OnPartitionsLost(c.onLost),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
	}
	cl, err := kgo.NewClient(append(opts, c.cfg.ClientOpts...)...)
	if err != nil {
		return fmt.Errorf("kafka: consumer client: %w", err)
	}
	c.cl = cl
	c.offsets = map[string]map[int32]doneOffset{}
	c.hardCtx, c.hard = context.WithCancel(ctx)
	c.softCtx, c.soft = context.WithCancel(c.hardCtx)
	c.done = make(chan struct{})
	c.started = true
	go c.run()
	return nil
}

// Stop is the graceful stop: it stops fetching, lets the record (or batch)
// in hand finish, commits the offsets of everything finished, leaves the
// group (so another member takes the partitions over at once, instead of
// after the session timeout), and closes the client. A record waiting for a
// retry is abandoned: it is redelivered later, which is harmless.
//
// If ctx ends first, Stop makes it a hard stop: the handler's context is
// cancelled, its transaction rolls back, and Stop returns ctx.Err() without
// waiting further; the goroutine still commits what is done and leaves the
// group, each bounded by CommitTimeout. Safe before Start and twice.
func (c *Consumer) Stop(ctx context.Context) error {
	c.mu.Lock()
	c.stopped = true
	started := c.started
	c.mu.Unlock()
	if !started {
		return nil
	}
	c.soft()
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		c.hard()
		return ctx.Err()
	}
}

func (c *Consumer) stopping() bool { return c.softCtx.Err() != nil }

func (c *Consumer) run() {
	defer close(c.done)
	defer c.hard() // release the contexts
	for !c.stopping() {
		fs := c.cl.PollRecords(c.softCtx, c.cfg.MaxPollRecords)
		if fs.IsClientClosed() {
			break
		}
		fs.EachError(func(topic string, p int32, err error) {
			if !errors.Is(err, context.Canceled) {
				c.log.Warn("fetch", "topic", topic, "partition", p, "err", err)
			}
		})
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) == 0 || c.stopping() {
				return
			}
			if c.cfg.Batch {
				c.processBatch(p.Records)
			} else {
				c.processEach(p.Records)
			}
		})
		// One offset commit per poll, not per record: a record whose
		// transaction committed but whose offset did not is redelivered
		// after a crash and skipped as a duplicate, so the commit cadence
		// costs only re-reads, never a second effect.
		c.commit(c.hardCtx, nil)
		c.cl.AllowRebalance()
	}
	// Graceful exit, step by step:
	//  1. Nothing polled is in hand any more (records after the one in hand
	//     were abandoned; their offsets were never marked done).
	//  2. Commit what is done, bounded, even on a hard stop: it is cheap and
	//     saves the next owner re-reading.
	//  3. AllowRebalance: with BlockRebalanceOnPoll, leaving the group waits
	//     for the final revoke, which waits for AllowRebalance. Forgetting
	//     it is the classic Close hang.
	//  4. Leave with a deadline, then Close (immediate once left).
	c.commit(context.WithoutCancel(c.hardCtx), nil)
	c.cl.AllowRebalance()
	lctx, cancel := context.WithTimeout(context.WithoutCancel(c.hardCtx), c.cfg.CommitTimeout)
	if err := c.cl.LeaveGroupContext(lctx); err != nil {
		c.log.Warn("leave group", "err", err)
	}
	cancel()
	c.cl.Close()
}

// processEach processes recs (one partition, in order) one transaction each,
// stopping early on a stop request. Records after the first unfinished one
// are left alone so that the done offset never skips a record.
func (c *Consumer) processEach(recs []*kgo.Record) {
	for _, rec := range recs {
		if c.stopping() || !c.processOne(rec) {
			return
		}
	}
}

// processOne runs rec to a committed outcome. It returns false when a stop
// interrupted it; the record is then not done.
func (c *Consumer) processOne(rec *kgo.Record) bool {
	id := c.cfg.EventID(rec)
	ctx := context.WithValue(c.hardCtx, eventIDKey{}, id)
	// Without an event id there is nothing to prepare: tryOne dead-letters.
	prepared := c.cfg.Prepare == nil || id == ""
	for attempt, failures := 1, 0; ; attempt++ {
		if c.hardCtx.Err() != nil {
			return false
		}
		var (
			outcome   Outcome
			herr, err error
		)
		if !prepared {
			// Steps 1 and 2 of ConsumerConfig.Prepare; the transaction of
			// step 1 is over before Prepare runs.
			var done bool
			if done, err = c.processed(ctx, id); err == nil {
				if done {
					prepared = true // tryOne finds the duplicate
				} else if v, perr := c.cfg.Prepare(ctx, rec); perr != nil {
					herr = perr
				} else {
					ctx = context.WithValue(ctx, preparedKey{}, v)
					prepared = true
				}
			}
		}
		if prepared {
			outcome, herr, err = c.tryOne(ctx, rec, id)
		}
		if err == nil && herr == nil {
			c.finish(ctx, outcome, rec)
			return true
		}
		if c.hardCtx.Err() != nil {
			// A hard stop cancelled the attempt: not the record's fault.
			return false
		}
		if herr != nil {
			failures++
			c.log.Warn("handler failed", "event_id", id, "topic", rec.Topic, "partition", rec.Partition, "offset", rec.Offset, "attempt", failures, "err", herr)
			if failures >= c.cfg.MaxAttempts || IsPermanent(herr) {
				if !c.deadLetter(ctx, rec, id, herr, failures) {
					return false
				}
				c.finish(ctx, OutcomeDeadLettered, rec)
				return true
			}
		} else {
			// Database trouble, not the record's fault: retry until it
			// passes or we stop, without counting against the record.
			c.log.Warn("transaction failed", "event_id", id, "err", err)
		}
		if !c.backoff(max(failures, attempt)) {
			return false
		}
	}
}

// processed reports whether id is in processed_event for this consumer,
// read in a transaction of its own that is over when it returns. The read
// is only an optimisation (skip Prepare for a known repeat): tryOne's
// MarkProcessedTx stays the decision.
func (c *Consumer) processed(ctx context.Context, id string) (bool, error) {
	tx, err := c.db.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("kafka: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var done bool
	// Raw SQL: the table belongs to package inbox, which has no read-only
	// query; this is the one statement the adapter needs.
	err = tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM processed_event WHERE consumer_id = $1 AND event_id = $2)`,
		c.cfg.ConsumerID, id).Scan(&done)
	if err != nil {
		return false, fmt.Errorf("kafka: read processed_event: %w", err)
	}
	return done, nil
}

// tryOne is one attempt: begin, mark, handle, commit. herr is the handler's
// error (the tx rolled back); err any other failure.
func (c *Consumer) tryOne(ctx context.Context, rec *kgo.Record, id string) (o Outcome, herr, err error) {
	if id == "" {
		return 0, Permanent(inbox.ErrEmptyEventID), nil
	}
	tx, err := c.db.Begin(ctx)
	if err != nil {
		return 0, nil, fmt.Errorf("kafka: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	first, err := c.inbox.MarkProcessedTx(ctx, tx, c.cfg.ConsumerID, id)
	if err != nil {
		return 0, nil, err
	}
	o = OutcomeDuplicate
	if first {
		if herr := c.handler(ctx, tx, rec); herr != nil {
			return 0, herr, nil
		}
		o = OutcomeHandled
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, nil, fmt.Errorf("kafka: commit: %w", err)
	}
	return o, nil, nil
}

// processBatch processes recs (one partition, in order) in one transaction.
// If the handler fails for any record, the transaction rolls back and the
// records are processed one by one, so that only the bad record is retried
// and dead-lettered and the others keep their order.
func (c *Consumer) processBatch(recs []*kgo.Record) {
	ids := make([]string, len(recs))
	for i, rec := range recs {
		if ids[i] = c.cfg.EventID(rec); ids[i] == "" {
			c.processEach(recs)
			return
		}
	}
	for attempt := 1; ; attempt++ {
		if c.hardCtx.Err() != nil {
			return
		}
		outcomes, herr, err := c.tryBatch(recs, ids)
		if c.hardCtx.Err() != nil {
			return
		}
		if herr != nil {
			c.log.Info("batch handler failed; processing the batch record by record", "records", len(recs), "err", herr)
			c.processEach(recs)
			return
		}
		if err == nil {
			for i, rec := range recs {
				c.finish(context.WithValue(c.hardCtx, eventIDKey{}, ids[i]), outcomes[i], rec)
			}
			return
		}
		c.log.Warn("batch transaction failed", "records", len(recs), "err", err)
		if !c.backoff(attempt) {
			return
		}
	}
}

func (c *Consumer) tryBatch(recs []*kgo.Record, ids []string) (outcomes []Outcome, herr, err error) {
	tx, err := c.db.Begin(c.hardCtx)
	if err != nil {
		return nil, nil, fmt.Errorf("kafka: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(c.hardCtx)) }()
	first, err := c.inbox.MarkProcessedBatchTx(c.hardCtx, tx, c.cfg.ConsumerID, ids)
	if err != nil {
		return nil, nil, err
	}
	outcomes = make([]Outcome, len(recs))
	for i, rec := range recs {
		outcomes[i] = OutcomeDuplicate
		if !first[i] {
			continue
		}
		if herr := c.handler(context.WithValue(c.hardCtx, eventIDKey{}, ids[i]), tx, rec); herr != nil {
			return nil, herr, nil
		}
		outcomes[i] = OutcomeHandled
	}
	if err := tx.Commit(c.hardCtx); err != nil {
		return nil, nil, fmt.Errorf("kafka: commit: %w", err)
	}
	return outcomes, nil, nil
}

// finish records that rec's transaction committed: its offset may now be
// committed (at the end of the poll, on revoke or on stop).
func (c *Consumer) finish(ctx context.Context, o Outcome, rec *kgo.Record) {
	if c.cfg.OnProcessed != nil {
		c.cfg.OnProcessed(ctx, rec, o)
	}
	c.omu.Lock()
	defer c.omu.Unlock()
	parts := c.offsets[rec.Topic]
	if parts == nil {
		parts = map[int32]doneOffset{}
		c.offsets[rec.Topic] = parts
	}
	parts[rec.Partition] = doneOffset{at: kgo.EpochOffset{Epoch: rec.LeaderEpoch, Offset: rec.Offset + 1}}
}

// deadLetter produces rec to the dead-letter topic, retrying until it is
// acknowledged or a stop interrupts (then false: the record is not done and
// will be redelivered). The dead-letter topic is at-least-once: a crash
// after the produce and before the offset commit dead-letters the record
// again on redelivery (its event-id header lets a reader dedup).
func (c *Consumer) deadLetter(ctx context.Context, rec *kgo.Record, id string, cause error, attempts int) bool {
	topic := c.cfg.DeadLetterTopic
	if topic == "" {
		topic = rec.Topic + DeadLetterSuffixDefault
	}
	headers := append([]kgo.RecordHeader(nil), rec.Headers...)
	headers = append(headers,
		kgo.RecordHeader{Key: HeaderDeadLetterError, Value: []byte(cause.Error())},
		kgo.RecordHeader{Key: HeaderDeadLetterSource, Value: []byte(rec.Topic + "/" + strconv.Itoa(int(rec.Partition)) + "/" + strconv.FormatInt(rec.Offset, 10))},
		kgo.RecordHeader{Key: HeaderDeadLetterAttempts, Value: []byte(strconv.Itoa(attempts))},
		kgo.RecordHeader{Key: HeaderDeadLetterConsumer, Value: []byte(c.cfg.ConsumerID)},
	)
	if !hasHeader(rec, HeaderEventID) {
		headers = append(headers, kgo.RecordHeader{Key: HeaderEventID, Value: []byte(id)})
	}
	dl := &kgo.Record{Topic: topic, Key: rec.Key, Value: rec.Value, Headers: headers}
	for attempt := 1; ; attempt++ {
		err := c.cl.ProduceSync(ctx, dl).FirstErr()
		if err == nil {
			c.log.Error("record dead-lettered", "event_id", id, "dead_letter_topic", topic, "err", cause)
			return true
		}
		c.log.Warn("dead-letter produce failed", "event_id", id, "topic", topic, "err", err)
		if !c.backoff(attempt) {
			return false
		}
	}
}

func hasHeader(rec *kgo.Record, key string) bool {
	for _, h := range rec.Headers {
		if h.Key == key {
			return true
		}
	}
	return false
}

// backoff waits before attempt+1; false if a stop came first.
func (c *Consumer) backoff(attempt int) bool {
	d := c.cfg.RetryBackoff
	for i := 1; i < attempt && d < c.cfg.RetryBackoffMax; i++ {
		d *= 2
	}
	d = min(d, c.cfg.RetryBackoffMax)
	d = time.Duration(float64(d) * (0.75 + 0.5*rand.Float64()))
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-c.softCtx.Done():
		return false
	}
}

// commit commits the done offsets of the given partitions (all if nil) and
// forgets them if forget is set. Errors are logged: an uncommitted offset
// only means re-reading records that dedup will skip.
func (c *Consumer) commit(ctx context.Context, only map[string][]int32) {
	c.omu.Lock()
	defer c.omu.Unlock()
	c.commitLocked(ctx, only)
}

func (c *Consumer) commitLocked(ctx context.Context, only map[string][]int32) {
	todo := map[string]map[int32]kgo.EpochOffset{}
	add := func(topic string, p int32, d doneOffset) {
		if d.committed {
			return
		}
		if todo[topic] == nil {
			todo[topic] = map[int32]kgo.EpochOffset{}
		}
		todo[topic][p] = d.at
	}
	for topic, parts := range c.offsets {
		if only == nil {
			for p, d := range parts {
				add(topic, p, d)
			}
			continue
		}
		for _, p := range only[topic] {
			if d, ok := parts[p]; ok {
				add(topic, p, d)
			}
		}
	}
	if len(todo) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.CommitTimeout)
	defer cancel()
	c.cl.CommitOffsetsSync(ctx, todo, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			c.log.Warn("offset commit", "err", err)
			return
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if p.ErrorCode != 0 {
					c.log.Warn("offset commit", "topic", t.Topic, "partition", p.Partition, "code", p.ErrorCode)
					continue
				}
				if d, ok := c.offsets[t.Topic][p.Partition]; ok && d.at == todo[t.Topic][p.Partition] {
					d.committed = true
					c.offsets[t.Topic][p.Partition] = d
				}
			}
		}
	})
}

// onRevoked runs on franz-go's goroutine when partitions leave this member
// (rebalance or leave). Because of BlockRebalanceOnPoll it never overlaps
// processing, so every finished record's offset is in c.offsets: commit
// them for the revoked partitions, so the next owner starts right after, then
// forget those partitions (a later re-assignment starts from Kafka's offset).
func (c *Consumer) onRevoked(ctx context.Context, _ *kgo.Client, revoked map[string][]int32) {
	c.omu.Lock()
	defer c.omu.Unlock()
	c.commitLocked(ctx, revoked)
	c.forgetLocked(revoked)
}

// onLost: the partitions are gone without a clean revoke (session expired);
// a commit would be rejected, so only forget them.
func (c *Consumer) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	c.omu.Lock()
	defer c.omu.Unlock()
	c.forgetLocked(lost)
}

func (c *Consumer) forgetLocked(parts map[string][]int32) {
	for topic, ps := range parts {
		for _, p := range ps {
			delete(c.offsets[topic], p)
		}
	}
}
