package chaos

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/kafka"
)

// outboxRow is one row of billing's outbox_event table at the end of a run.
type outboxRow struct {
	EventID       string
	Topic         string
	AggregateType string
	AggregateID   string
	Seq           int64
	EventType     string
	Status        string
	Attempts      int
	LastError     string
	Payload       []byte
	// FromWAL: the event was decoded from the WAL (OutboxWAL); Seq is its
	// position among its aggregate's events in commit order, and its
	// records carry aggregate-seq 0.
	FromWAL bool
}

// wireRecord is one record read back from a topic.
type wireRecord struct {
	EventID       string
	AggregateType string
	AggregateID   string
	Seq           int64
	Topic         string
	Partition     int32
	Offset        int64
	Timestamp     time.Time
}

// delivery is the first copy of an event on the wire: the lowest offset in
// its partition, and the earliest producer timestamp of all its copies.
type delivery struct {
	topic     string
	partition int32
	offset    int64
	ts        time.Time
	copies    int
}

type kafkaAuditResult struct {
	events, aggregates, records, redelivered int
	// retried is the events whose publish failed at least once (a last
	// error in the outbox row): the produce failures the relays rode out.
	retried    int
	violations []Violation
}

// checkKafka compares the outbox table with what reached the topics.
//
//   - Every outbox event must be on its topic at least once (a record whose
//     event-id header is its id): one that is not is lost, whatever its
//     status (PUBLISHED without a record is a relay that marked an event it
//     did not deliver; PENDING or DEAD at the end is one never delivered).
//   - The first deliveries of one aggregate's events must be in
//     aggregate-sequence order: for two events in one partition, by offset;
//     across partitions and topics, by the producer's timestamp (what the
//     relay stamped when it produced; equal milliseconds are not a
//     reordering). A relay that published seq 2 before seq 1 was delivered
//     shows as seq 1's first copy being later than seq 2's.
//
// Records whose event id is not in the table (another run's, on a shared
// broker) are ignored.
func checkKafka(rows []outboxRow, recs []wireRecord) kafkaAuditResult {
	byID := make(map[string]*outboxRow, len(rows))
	for i := range rows {
		byID[rows[i].EventID] = &rows[i]
	}
	first := map[string]*delivery{}
	var res kafkaAuditResult
	misrouted := map[string]bool{}
	for _, r := range recs {
		row := byID[r.EventID]
		if row == nil {
			continue
		}
		res.records++
		// A copy must carry what the outbox row says: its topic, key and
		// sequence headers.
		if (r.Topic != row.Topic || r.AggregateID != row.AggregateID || r.AggregateType != row.AggregateType || (r.Seq != row.Seq && !row.FromWAL)) && !misrouted[r.EventID] {
			misrouted[r.EventID] = true
			res.violations = append(res.violations, Violation{Kind: "misrouted-event", Subject: "event " + r.EventID,
				Detail: fmt.Sprintf("record in %s[%d]@%d says %s %s seq %d; the outbox row says %s %s seq %d to %s",
					r.Topic, r.Partition, r.Offset, r.AggregateType, r.AggregateID, r.Seq, row.AggregateType, row.AggregateID, row.Seq, row.Topic)})
		}
		d := first[r.EventID]
		if d == nil {
			first[r.EventID] = &delivery{topic: r.Topic, partition: r.Partition, offset: r.Offset, ts: r.Timestamp, copies: 1}
			continue
		}
		d.copies++
		res.redelivered++
		if r.Topic == d.topic && r.Partition == d.partition && r.Offset < d.offset {
			d.offset = r.Offset
		}
		if r.Timestamp.Before(d.ts) {
			d.ts = r.Timestamp
		}
	}
	type aggKey struct{ typ, id string }
	aggs := map[aggKey][]*outboxRow{}
	for i := range rows {
		row := &rows[i]
		k := aggKey{row.AggregateType, row.AggregateID}
		aggs[k] = append(aggs[k], row)
	}
	res.events, res.aggregates = len(rows), len(aggs)
	for _, row := range rows {
		if row.LastError != "" {
			res.retried++
		}
		if first[row.EventID] != nil {
			continue
		}
		detail := fmt.Sprintf("%s %s seq %d (%s to %s) is on no topic; outbox status %s after %d attempts",
			row.AggregateType, row.AggregateID, row.Seq, row.EventType, row.Topic, row.Status, row.Attempts)
		if row.LastError != "" {
			detail += ", last error: " + row.LastError
		}
		res.violations = append(res.violations, Violation{Kind: "lost-event", Subject: "event " + row.EventID, Detail: detail})
	}
	keys := make([]aggKey, 0, len(aggs))
	for k := range aggs {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].typ != keys[j].typ {
			return keys[i].typ < keys[j].typ
		}
		return keys[i].id < keys[j].id
	})
	for _, k := range keys {
		evs := aggs[k]
		sort.Slice(evs, func(i, j int) bool { return evs[i].Seq < evs[j].Seq })
		// Every pair, earlier seq first: an aggregate has a handful of
		// events, and a reordering need not be between neighbours.
	pairs:
		for i := range evs {
			a := first[evs[i].EventID]
			if a == nil {
				continue
			}
			for j := i + 1; j < len(evs); j++ {
				b := first[evs[j].EventID]
				if b == nil {
					continue
				}
				var before bool
				var how string
				if a.topic == b.topic && a.partition == b.partition {
					before = b.offset < a.offset
					how = fmt.Sprintf("offset %d before %d in %s[%d]", b.offset, a.offset, a.topic, a.partition)
				} else {
					before = b.ts.UnixMilli() < a.ts.UnixMilli()
					how = fmt.Sprintf("produced at %s, seq %d at %s",
						b.ts.Format("15:04:05.000"), evs[i].Seq, a.ts.Format("15:04:05.000"))
				}
				if before {
					res.violations = append(res.violations, Violation{Kind: "reordered-event", Subject: "event " + evs[j].EventID,
						Detail: fmt.Sprintf("%s %s seq %d (%s) first delivered before seq %d (%s, event %s): %s",
							k.typ, k.id, evs[j].Seq, b.topic, evs[i].Seq, a.topic, evs[i].EventID, how)})
					break pairs // one per aggregate is enough to name it
				}
			}
		}
	}
	return res
}

// loadOutbox reads every row of the outbox table at dbURL.
func loadOutbox(ctx context.Context, dbURL string) ([]outboxRow, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, fmt.Errorf("chaos: outbox audit: %w", err)
	}
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT event_id, topic, aggregate_type, aggregate_id, aggregate_seq, event_type,
		status, attempts, coalesce(last_error, ''), payload FROM outbox_event ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("chaos: outbox audit: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (outboxRow, error) {
		var o outboxRow
		err := r.Scan(&o.EventID, &o.Topic, &o.AggregateType, &o.AggregateID, &o.Seq, &o.EventType, &o.Status, &o.Attempts, &o.LastError, &o.Payload)
		return o, err
	})
	if err != nil {
		return nil, fmt.Errorf("chaos: outbox audit: %w", err)
	}
	return out, nil
}

// inFlight counts the outbox events the relays still owe (PENDING or
// PUBLISHING) and the idempotency claims whose lease is live (a request
// still running, or whose instance died before its lease ran out).
func inFlight(ctx context.Context, dbURL string) (outbox, leases int, err error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close(context.Background())
	err = conn.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM outbox_event WHERE status IN ('PENDING', 'PUBLISHING')),
		(SELECT count(*) FROM idempotency_key WHERE state = 'claimed' AND locked_until > now())`).Scan(&outbox, &leases)
	return outbox, leases, err
}

// readTopics reads every record of topics from the start to the end
// offsets listed when it begins. A record without an event-id header is
// skipped (not one of the relay's).
func readTopics(ctx context.Context, brokers []string, topics []string) ([]wireRecord, error) {
	if len(topics) == 0 {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return nil, fmt.Errorf("chaos: kafka audit: %w", err)
	}
	defer cl.Close()
	ends, err := kadm.NewClient(cl).ListEndOffsets(ctx, topics...)
	if err != nil {
		return nil, fmt.Errorf("chaos: kafka audit: end offsets: %w", err)
	}
	if err := ends.Error(); err != nil {
		return nil, fmt.Errorf("chaos: kafka audit: end offsets: %w", err)
	}
	type tp struct {
		t string
		p int32
	}
	left := map[tp]int64{}
	ends.Each(func(o kadm.ListedOffset) {
		if o.Offset > 0 {
			left[tp{o.Topic, o.Partition}] = o.Offset
		}
	})
	var out []wireRecord
	for len(left) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("chaos: kafka audit: %d partitions not read to their end: %w", len(left), err)
		}
		var ferr error
		fs.EachError(func(t string, p int32, err error) {
			if !errors.Is(err, context.Canceled) {
				ferr = fmt.Errorf("chaos: kafka audit: fetch %s[%d]: %w", t, p, err)
			}
		})
		if ferr != nil {
			return nil, ferr
		}
		fs.EachRecord(func(r *kgo.Record) {
			k := tp{r.Topic, r.Partition}
			if end, ok := left[k]; ok && r.Offset+1 >= end {
				delete(left, k)
			}
			id := kafka.RecordEventID(r)
			if id == "" {
				return
			}
			w := wireRecord{EventID: id, Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Timestamp: r.Timestamp,
				AggregateID: string(r.Key)}
			for _, h := range r.Headers {
				switch h.Key {
				case kafka.HeaderAggregateType:
					w.AggregateType = string(h.Value)
				case kafka.HeaderAggregateSeq:
					w.Seq, _ = strconv.ParseInt(string(h.Value), 10, 64)
				}
			}
			out = append(out, w)
		})
	}
	return out, nil
}
