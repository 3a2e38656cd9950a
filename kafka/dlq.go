package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem"
)

// HeaderDeadLetterRedriveID marks a record republished by DLQ.Redrive
// with the "topic/partition/offset" of the dead-letter record it copies.
const HeaderDeadLetterRedriveID = idem.HeaderDeadLetterRedriveID

// Errors of the dead-letter tools. Use errors.Is.
var (
	// ErrTopicNotFound: the topic does not exist on the cluster.
	ErrTopicNotFound = errors.New("kafka: topic not found")
	// ErrRecordNotFound: no record at that partition and offset (never
	// written, or deleted by retention).
	ErrRecordNotFound = errors.New("kafka: record not found")
	// ErrNoDestination: Redrive was given no To and a record carries no
	// dlq-source and the topic has no DeadLetterSuffixDefault suffix.
	ErrNoDestination = errors.New("kafka: no destination topic for the redrive")
	// ErrSourceGone: a reference copy's original (dead-lettered truncated,
	// because it was too large to copy whole) is no longer in its source
	// topic, deleted by retention: only the reference copy remains.
	ErrSourceGone = errors.New("kafka: the source record of a truncated dead-letter copy is gone")
)

// DeadLetterRecord is one record of a dead-letter topic with the headers
// the consumer added decoded.
type DeadLetterRecord struct {
	Topic     string             `json:"topic"`
	Partition int32              `json:"partition"`
	Offset    int64              `json:"offset"`
	Timestamp time.Time          `json:"timestamp"`
	Key       []byte             `json:"key"`
	Value     []byte             `json:"value"`
	Headers   []kgo.RecordHeader `json:"-"`
	// Error, Source, Attempts and Consumer are the dlq-* headers.
	Error    string `json:"error"`
	Source   string `json:"source"`
	Attempts int    `json:"attempts"`
	Consumer string `json:"consumer"`
	EventID  string `json:"event_id,omitempty"`
	// Truncated marks a reference copy (dlq-truncated: the original was
	// too large to dead-letter whole): Value is empty in the dead-letter
	// topic and Size is the original's size. Show reads the original from
	// Source (FromSource), or reports it gone (SourceGone).
	Truncated  bool `json:"truncated,omitempty"`
	Size       int  `json:"size,omitempty"`
	FromSource bool `json:"from_source,omitempty"`
	SourceGone bool `json:"source_gone,omitempty"`
	// SourceHeaders are the original's headers, when FromSource.
	SourceHeaders []kgo.RecordHeader `json:"-"`
}

// ID is the record's "topic/partition/offset": the redrive id of its copy.
func (r *DeadLetterRecord) ID() string {
	return fmt.Sprintf("%s/%d/%d", r.Topic, r.Partition, r.Offset)
}

// HeaderMap returns the headers as a map (the last value of a repeated
// key wins).
func (r *DeadLetterRecord) HeaderMap() map[string]string {
	m := make(map[string]string, len(r.Headers))
	for _, h := range r.Headers {
		m[h.Key] = string(h.Value)
	}
	return m
}

func deadLetterRecord(rec *kgo.Record) DeadLetterRecord {
	d := DeadLetterRecord{
		Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset, Timestamp: rec.Timestamp,
		Key: rec.Key, Value: rec.Value, Headers: rec.Headers,
	}
	for _, h := range rec.Headers {
		switch h.Key {
		case HeaderDeadLetterError:
			d.Error = string(h.Value)
		case HeaderDeadLetterSource:
			d.Source = string(h.Value)
		case HeaderDeadLetterAttempts:
			d.Attempts, _ = strconv.Atoi(string(h.Value))
		case HeaderDeadLetterConsumer:
			d.Consumer = string(h.Value)
		case HeaderEventID:
			d.EventID = string(h.Value)
		case HeaderDeadLetterTruncated:
			d.Truncated = string(h.Value) == "true"
		case HeaderDeadLetterSize:
			d.Size, _ = strconv.Atoi(string(h.Value))
		}
	}
	return d
}

// DLQ reads dead-letter topics and republishes their records. It creates
// a short-lived client per call from Opts (seed brokers, TLS, SASL: the
// connection options only; DLQ sets what it consumes itself).
type DLQ struct {
	opts []kgo.Opt
}

// NewDLQ returns a DLQ over the cluster that opts connect to.
func NewDLQ(opts ...kgo.Opt) *DLQ { return &DLQ{opts: opts} }

// readRange calls fn for every record of topic in [start, end) per
// partition, in per-partition order, and returns when each partition has
// reached its end or ctx ends. A partition is done when the record at
// end-1 has been read, so a topic written by a transactional producer
// (whose last offset may be a commit marker, never returned) is read until
// ctx ends: the callers bound ctx. Dead-letter topics are written by the
// consumer's plain producer.
func (d *DLQ) readRange(ctx context.Context, topic string, start, end map[int32]int64, fn func(*kgo.Record) error) error {
	offsets := map[int32]kgo.Offset{}
	for p, s := range start {
		if s < end[p] {
			offsets[p] = kgo.NewOffset().At(s)
		}
	}
	if len(offsets) == 0 {
		return nil
	}
	opts := append(append([]kgo.Opt(nil), d.opts...), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: offsets}))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("kafka: client: %w", err)
	}
	defer cl.Close()
	left := len(offsets)
	done := map[int32]bool{}
	for left > 0 {
		fetches := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return err
		}
		var ferr error
		fetches.EachError(func(_ string, _ int32, err error) { ferr = err })
		if ferr != nil {
			return fmt.Errorf("kafka: read %s: %w", topic, ferr)
		}
		var cbErr error
		fetches.EachRecord(func(rec *kgo.Record) {
			if cbErr != nil || done[rec.Partition] || rec.Offset >= end[rec.Partition] {
				return
			}
			if err := fn(rec); err != nil {
				cbErr = err
				return
			}
			if rec.Offset+1 >= end[rec.Partition] {
				done[rec.Partition] = true
				left--
			}
		})
		if cbErr != nil {
			return cbErr
		}
	}
	return nil
}

// bounds returns the start and end offsets of topic's partitions.
func (d *DLQ) bounds(ctx context.Context, adm *kadm.Client, topic string, since time.Time) (start, end map[int32]int64, err error) {
	var s kadm.ListedOffsets
	if since.IsZero() {
		s, err = adm.ListStartOffsets(ctx, topic)
	} else {
		s, err = adm.ListOffsetsAfterMilli(ctx, since.UnixMilli(), topic)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("kafka: list offsets of %s: %w", topic, err)
	}
	e, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return nil, nil, fmt.Errorf("kafka: list offsets of %s: %w", topic, err)
	}
	if len(e[topic]) == 0 {
		return nil, nil, fmt.Errorf("%w: %s", ErrTopicNotFound, topic)
	}
	start, end = map[int32]int64{}, map[int32]int64{}
	for p, o := range e[topic] {
		if o.Err != nil {
			if p == -1 {
				return nil, nil, fmt.Errorf("%w: %s", ErrTopicNotFound, topic)
			}
			return nil, nil, fmt.Errorf("kafka: %s/%d: %w", topic, p, o.Err)
		}
		end[p] = o.Offset
		start[p] = o.Offset
		if so, ok := s.Lookup(topic, p); ok && so.Err == nil && so.Offset >= 0 {
			start[p] = so.Offset
		}
	}
	return start, end, nil
}

func (d *DLQ) admin() (*kadm.Client, func(), error) {
	cl, err := kgo.NewClient(d.opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("kafka: client: %w", err)
	}
	return kadm.NewClient(cl), cl.Close, nil
}

// List returns the newest limit records of the dead-letter topic
// (newest by timestamp across partitions; printed oldest first per
// partition, partitions in order); limit <= 0 means all. It reads at most
// limit records of each partition, from its end: never the whole topic.
func (d *DLQ) List(ctx context.Context, topic string, limit int) ([]DeadLetterRecord, error) {
	return d.ListFrom(ctx, topic, ListOptions{Limit: limit, Offset: -1})
}

// ListOptions select what ListFrom reads.
type ListOptions struct {
	// Limit is the most records returned; <= 0 means all. Defaults to 0.
	Limit int
	// Offset, when >= 0, reads each partition from this offset (or its
	// first record, when retention deleted the offset) forward: the first
	// Limit records by partition and offset. When negative, the newest
	// Limit records are read from the partitions' ends. Defaults to 0
	// (from the start); List passes -1.
	Offset int64
	// Partitions, when not empty, are the only partitions read. Defaults
	// to nil: every partition.
	Partitions []int32
}

// ListFrom returns the records of the dead-letter topic that o selects,
// sorted by partition and offset. It reads at most o.Limit records of each
// partition it reads (plus what the broker returns in the same batch).
func (d *DLQ) ListFrom(ctx context.Context, topic string, o ListOptions) ([]DeadLetterRecord, error) {
	adm, closeFn, err := d.admin()
	if err != nil {
		return nil, err
	}
	defer closeFn()
	start, end, err := d.bounds(ctx, adm, topic, time.Time{})
	if err != nil {
		return nil, err
	}
	for p := range end {
		if len(o.Partitions) > 0 && !slices.Contains(o.Partitions, p) {
			delete(start, p)
			delete(end, p)
			continue
		}
		switch {
		case o.Offset >= 0:
			start[p] = max(start[p], o.Offset)
			if o.Limit > 0 && start[p]+int64(o.Limit) < end[p] {
				end[p] = start[p] + int64(o.Limit)
			}
		case o.Limit > 0:
			start[p] = max(start[p], end[p]-int64(o.Limit))
		}
	}
	var out []DeadLetterRecord
	err = d.readRange(ctx, topic, start, end, func(rec *kgo.Record) error {
		out = append(out, deadLetterRecord(rec))
		return nil
	})
	if err != nil {
		return nil, err
	}
	byPosition := func(i, j int) bool {
		if out[i].Partition != out[j].Partition {
			return out[i].Partition < out[j].Partition
		}
		return out[i].Offset < out[j].Offset
	}
	if o.Limit > 0 && len(out) > o.Limit {
		if o.Offset < 0 { // the newest across partitions
			sort.SliceStable(out, func(i, j int) bool {
				if !out[i].Timestamp.Equal(out[j].Timestamp) {
					return out[i].Timestamp.After(out[j].Timestamp)
				}
				return byPosition(j, i)
			})
		} else {
			sort.SliceStable(out, byPosition)
		}
		out = out[:o.Limit]
	}
	sort.SliceStable(out, byPosition)
	if out == nil {
		out = []DeadLetterRecord{}
	}
	return out, nil
}

// Show returns the record at partition and offset of topic, or
// ErrRecordNotFound / ErrTopicNotFound. For a reference copy (Truncated)
// it reads the original from its source: Key, Value and SourceHeaders are
// the original's (FromSource), or SourceGone is set when the source no
// longer has it (retention).
func (d *DLQ) Show(ctx context.Context, topic string, partition int32, offset int64) (*DeadLetterRecord, error) {
	adm, closeFn, err := d.admin()
	if err != nil {
		return nil, err
	}
	defer closeFn()
	start, end, err := d.bounds(ctx, adm, topic, time.Time{})
	if err != nil {
		return nil, err
	}
	e, ok := end[partition]
	if !ok || offset < start[partition] || offset >= e {
		return nil, fmt.Errorf("%w: %s/%d/%d", ErrRecordNotFound, topic, partition, offset)
	}
	var found *DeadLetterRecord
	err = d.readRange(ctx, topic, map[int32]int64{partition: offset}, map[int32]int64{partition: offset + 1}, func(rec *kgo.Record) error {
		r := deadLetterRecord(rec)
		found = &r
		return nil
	})
	if err != nil {
		return nil, err
	}
	if found == nil || found.Offset != offset { // a compacted or transactional gap
		return nil, fmt.Errorf("%w: %s/%d/%d", ErrRecordNotFound, topic, partition, offset)
	}
	if found.Truncated {
		if err := d.fillFromSource(ctx, adm, found); err != nil && !errors.Is(err, ErrSourceGone) {
			return nil, err
		}
	}
	return found, nil
}

// RedriveOptions select what Redrive republishes.
type RedriveOptions struct {
	// From is the dead-letter topic. Required.
	From string
	// To is the destination topic. Defaults to each record's source topic
	// (its dlq-source header), else From without DeadLetterSuffixDefault.
	To string
	// FilterError keeps only records whose dlq-error contains it.
	// Defaults to "" (every record).
	FilterError string
	// DryRun reports what would move and produces nothing.
	DryRun bool
	// Lookback is how far before the oldest selected dead-letter record's
	// timestamp the destination is searched for copies of an earlier,
	// interrupted redrive (it covers clock skew between producers).
	// Defaults to RedriveLookbackDefault.
	Lookback time.Duration
	// DB, when set, is the redrive ledger (package migrate's
	// idem_admin_audit and idem_dlq_redrive tables): Redrive holds an
	// advisory lock on From for its whole run, so a second redrive of the
	// same topic waits for it and then skips what it moved; it skips every
	// record the ledger holds as redriven to the same destination (unless
	// Force), and records one audit row (Actor, Reason, the records moved)
	// plus a ledger row per record before it returns. A dry run only reads
	// the ledger. Defaults to nil: no ledger, no lock, no audit row (two
	// redrives run at once may then both publish a record).
	DB RedriveDB
	// Actor and Reason are recorded in the audit row. Both are required
	// with a DB (ErrAuditRequired). Default to "".
	Actor, Reason string
	// Force republishes the selected records even when the ledger or the
	// destination shows them already redriven; the audit row says forced.
	// Defaults to false.
	Force bool
}

// RedriveLookbackDefault is RedriveOptions.Lookback's default.
const RedriveLookbackDefault = time.Hour

// RedriveReport says what a redrive moved.
type RedriveReport struct {
	// Moved are the dead-letter records republished (or, in a dry run,
	// that would be), by ID, with their destination.
	Moved []RedriveMove `json:"moved"`
	// AlreadyRedriven are selected records whose copy is on the
	// destination already (an earlier redrive): not produced again.
	AlreadyRedriven []RedriveMove `json:"already_redriven"`
	// Filtered counts records that FilterError left out.
	Filtered int  `json:"filtered"`
	DryRun   bool `json:"dry_run"`
	Forced   bool `json:"forced,omitempty"`
	// AuditID is the idem_admin_audit row of this redrive (with a DB).
	AuditID int64 `json:"audit_id,omitempty"`
	// Refused are reference copies (Truncated) whose original is no longer
	// in its source topic: there is nothing to republish. Redrive moves
	// the other records and returns an error wrapping ErrSourceGone.
	Refused []RedriveRefusal `json:"refused,omitempty"`
}

// RedriveRefusal is a record Redrive refused to move.
type RedriveRefusal struct {
	RedriveMove
	Source string `json:"source"`
	Reason string `json:"reason"`
}

// RedriveMove is one record of a redrive.
type RedriveMove struct {
	ID      string `json:"id"`
	To      string `json:"to"`
	EventID string `json:"event_id,omitempty"`
	Error   string `json:"error"`
	// For an already redriven record that the ledger holds: who redrove it
	// last, when, and that redrive's audit row.
	RedrivenBy string     `json:"redriven_by,omitempty"`
	RedrivenAt *time.Time `json:"redriven_at,omitempty"`
	AuditID    int64      `json:"audit_id,omitempty"`
}

// Redrive republishes the records of a dead-letter topic to their source
// topic with their original key, value and headers (the dlq-* headers
// removed) and a dlq-redrive-id header naming the dead-letter record. A
// reference copy (Truncated) is republished from its original, read again
// from its source; one whose original is gone is refused (Refused, and an
// error wrapping ErrSourceGone once the others are moved).
// Each dead-letter record is republished at most once across redrives:
// before producing, Redrive reads the destination (from Lookback before
// the oldest selected record) for dlq-redrive-id headers and skips the
// records already there, so a redrive interrupted after some produces and
// run again produces only the rest. With o.DB, redrives of one topic are
// serialized by the ledger, which also records each record moved and the
// audit row: two redrives of one record at the same time publish it once,
// and a later one reports it already redriven (o.Force redrives again).
// Without a DB, two redrives run at the same time are not protected from
// each other.
//
// A republished record is processed again by the consumer; the inbox
// makes that harmless for an event that was in fact processed.
func (d *DLQ) Redrive(ctx context.Context, o RedriveOptions) (*RedriveReport, error) {
	if o.From == "" {
		return nil, fmt.Errorf("%w: From is empty", ErrTopicNotFound)
	}
	if o.Lookback <= 0 {
		o.Lookback = RedriveLookbackDefault
	}
	if o.DB != nil && !o.DryRun && (strings.TrimSpace(o.Actor) == "" || strings.TrimSpace(o.Reason) == "") {
		return nil, ErrAuditRequired
	}
	var led *ledger
	if o.DB != nil {
		// The lock comes before the dead-letter topic is read: a redrive
		// that waited reads what the one before it left.
		var err error
		if led, err = beginLedger(ctx, o); err != nil {
			return nil, err
		}
		defer led.rollback(ctx) // a no-op after commit
	}
	recs, err := d.List(ctx, o.From, 0)
	if err != nil {
		return nil, err
	}
	rep := &RedriveReport{Moved: []RedriveMove{}, AlreadyRedriven: []RedriveMove{}, DryRun: o.DryRun, Forced: o.Force}
	type planned struct {
		rec  DeadLetterRecord
		move RedriveMove
	}
	var plan []planned
	oldest := map[string]time.Time{}
	for _, r := range recs {
		if o.FilterError != "" && !strings.Contains(r.Error, o.FilterError) {
			rep.Filtered++
			continue
		}
		to := o.To
		if to == "" {
			to = sourceTopic(r.Source)
		}
		if to == "" {
			to = strings.TrimSuffix(o.From, DeadLetterSuffixDefault)
			if to == o.From {
				return nil, fmt.Errorf("%w: %s has no dlq-source", ErrNoDestination, r.ID())
			}
		}
		plan = append(plan, planned{rec: r, move: RedriveMove{ID: r.ID(), To: to, EventID: r.EventID, Error: r.Error}})
		if t, ok := oldest[to]; !ok || r.Timestamp.Before(t) {
			oldest[to] = r.Timestamp
		}
	}
	if len(plan) == 0 {
		return rep, led.commit(ctx, o, rep, nil, nil)
	}
	// Copies already on each destination, from an earlier run (also one
	// whose ledger transaction did not commit: a crash after producing).
	seen := map[string]bool{}
	adm, closeFn, err := d.admin()
	if err != nil {
		return nil, err
	}
	defer closeFn()
	for to, t := range oldest {
		if o.Force {
			break
		}
		start, end, err := d.bounds(ctx, adm, to, t.Add(-o.Lookback))
		if err != nil {
			return nil, err
		}
		err = d.readRange(ctx, to, start, end, func(rec *kgo.Record) error {
			for _, h := range rec.Headers {
				if h.Key == HeaderDeadLetterRedriveID {
					seen[to+"\x00"+string(h.Value)] = true
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	var out []*kgo.Record
	var outRecs []*DeadLetterRecord
	var gone []string
	for _, p := range plan {
		if prev, ok := led.earlier(&p.rec, p.move.To); ok && !o.Force {
			m := p.move
			m.RedrivenBy, m.AuditID = prev.Actor, prev.AuditID
			if prev.LastAt.Valid {
				m.RedrivenAt = &prev.LastAt.Time
			}
			rep.AlreadyRedriven = append(rep.AlreadyRedriven, m)
			continue
		}
		if seen[p.move.To+"\x00"+p.move.ID] {
			rep.AlreadyRedriven = append(rep.AlreadyRedriven, p.move)
			continue
		}
		if p.rec.Truncated {
			// A reference copy has no value: republish the original,
			// read again from its source, or refuse if it is gone.
			if err := d.fillFromSource(ctx, adm, &p.rec); err != nil {
				if !errors.Is(err, ErrSourceGone) {
					return nil, err
				}
				rep.Refused = append(rep.Refused, RedriveRefusal{RedriveMove: p.move, Source: p.rec.Source,
					Reason: "truncated dead-letter copy whose source record is gone (retention): nothing left to redrive"})
				gone = append(gone, p.move.ID)
				continue
			}
			p.rec.Headers = p.rec.SourceHeaders
		}
		rep.Moved = append(rep.Moved, p.move)
		headers := make([]kgo.RecordHeader, 0, len(p.rec.Headers)+1)
		for _, h := range p.rec.Headers {
			if !strings.HasPrefix(h.Key, "dlq-") {
				headers = append(headers, h)
			}
		}
		headers = append(headers, kgo.RecordHeader{Key: HeaderDeadLetterRedriveID, Value: []byte(p.move.ID)})
		out = append(out, &kgo.Record{Topic: p.move.To, Key: p.rec.Key, Value: p.rec.Value, Headers: headers})
		outRecs = append(outRecs, &p.rec)
	}
	var goneErr error
	if len(gone) > 0 {
		goneErr = fmt.Errorf("%w: refused %s", ErrSourceGone, strings.Join(gone, ", "))
	}
	if o.DryRun || len(out) == 0 {
		return rep, errors.Join(goneErr, led.commit(ctx, o, rep, nil, goneErr))
	}
	cl, err := kgo.NewClient(append(append([]kgo.Opt(nil), d.opts...), ProducerOpts()...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka: client: %w", err)
	}
	defer cl.Close()
	// One record at a time, in order: an interruption leaves a prefix
	// produced, which the next run skips. Each produced record gets its
	// ledger row in the transaction that holds the lock; the commit makes
	// them visible together with the audit row. A crash before the commit
	// loses the rows, not the records: the next redrive finds their
	// dlq-redrive-id on the destination.
	var moved []auditedRecord
	for i, rec := range out {
		var runErr error
		if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
			rep.Moved = rep.Moved[:i]
			runErr = fmt.Errorf("kafka: redrive %s to %s: %w", outRecs[i].ID(), rec.Topic, err)
		} else {
			moved = append(moved, auditedRecord{Topic: outRecs[i].Topic, Partition: outRecs[i].Partition, Offset: outRecs[i].Offset,
				To: rec.Topic, EventID: outRecs[i].EventID})
			if err := led.record(ctx, outRecs[i], rec.Topic); err != nil {
				rep.Moved = rep.Moved[:i+1]
				runErr = fmt.Errorf("kafka: redrive %s to %s: produced, not recorded: %w", outRecs[i].ID(), rec.Topic, err)
			}
		}
		if runErr != nil {
			runErr = errors.Join(runErr, goneErr)
			return rep, errors.Join(runErr, led.commit(ctx, o, rep, moved, runErr))
		}
	}
	return rep, errors.Join(goneErr, led.commit(ctx, o, rep, moved, goneErr))
}

// sourceTopic is the topic of a dlq-source "topic/partition/offset".
func sourceTopic(src string) string {
	i := strings.LastIndexByte(src, '/')
	if i <= 0 {
		return ""
	}
	j := strings.LastIndexByte(src[:i], '/')
	if j <= 0 {
		return ""
	}
	return src[:j]
}
