package kafka

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemkit/idem/consume"
)

// driver is the franz-go consume.Driver: one kgo group client per session.
type driver struct {
	cfg *ConsumerConfig
	log *slog.Logger
}

func newDriver(cfg *ConsumerConfig) *driver {
	return &driver{cfg: cfg, log: cfg.Logger.With("consumer", cfg.ConsumerID)}
}

type topicPartition struct {
	topic     string
	partition int32
}

type doneOffset struct {
	at        kgo.EpochOffset
	committed bool
}

// session is one run's group membership. Its state is guarded by mu,
// because the rebalance callbacks run on franz-go's goroutine.
type session struct {
	cfg *ConsumerConfig
	log *slog.Logger
	cl  *kgo.Client
	// abandon cancels the client's own context (kgo.WithContext): the
	// group join in flight fails at once instead of when the broker
	// answers it (see Close).
	abandon context.CancelFunc

	mu sync.Mutex
	// owned is the current assignment: offsets are committed and holds
	// kept only for partitions in it.
	owned map[topicPartition]bool
	// done: per partition, the offset after the last acked record, and
	// whether Kafka has it yet (a failed commit is retried with the next
	// Ack, or on revoke).
	done map[topicPartition]doneOffset
	// held: per held partition, the offset of the record that holds it.
	held map[topicPartition]int64
	// revoked: partitions lost since the last Fetch, as streams.
	revoked []string
}

// Open creates the session's client; it connects lazily, in Fetch.
func (d *driver) Open(context.Context) (consume.Session, error) {
	s := &session{
		cfg: d.cfg, log: d.log,
		owned: map[topicPartition]bool{}, done: map[topicPartition]doneOffset{}, held: map[topicPartition]int64{},
	}
	base, abandon := context.WithCancel(context.Background())
	s.abandon = abandon
	opts := []kgo.Opt{
		kgo.WithContext(base),
		kgo.SeedBrokers(d.cfg.Brokers...),
		kgo.ConsumerGroup(d.cfg.Group),
		kgo.ConsumeTopics(d.cfg.Topics...),
		// Offsets are committed by hand, after the database commit.
		kgo.DisableAutoCommit(),
		// No revoke can run while a polled batch is being processed, so
		// an offset is never committed for a partition this member lost
		// mid-batch, and the revoke callback sees every acked record.
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsAssigned(s.onAssigned),
		kgo.OnPartitionsRevoked(s.onRevoked),
		kgo.OnPartitionsLost(s.onLost),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
	}
	cl, err := kgo.NewClient(append(opts, d.cfg.ClientOpts...)...)
	if err != nil {
		abandon()
		return nil, err
	}
	s.cl = cl
	return s, nil
}

func stream(topic string, partition int32) string {
	return topic + "/" + strconv.Itoa(int(partition))
}

// Fetch lets a waiting rebalance through (the records of the previous poll
// are processed and acked), then polls.
func (s *session) Fetch(ctx context.Context) (consume.Fetch, error) {
	s.cl.AllowRebalance()
	fs := s.cl.PollRecords(ctx, s.cfg.MaxPollRecords)
	var f consume.Fetch
	s.mu.Lock()
	f.Revoked, s.revoked = s.revoked, nil
	s.mu.Unlock()
	if fs.IsClientClosed() {
		return f, kgo.ErrClientClosed
	}
	fs.EachError(func(topic string, p int32, err error) {
		if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			s.log.Warn("fetch", "topic", topic, "partition", p, "err", err)
		}
	})
	fs.EachPartition(func(p kgo.FetchTopicPartition) {
		if len(p.Records) == 0 {
			return
		}
		st := stream(p.Topic, p.Partition)
		for _, rec := range p.Records {
			f.Messages = append(f.Messages, s.message(st, rec))
		}
	})
	return f, nil
}

func (s *session) message(st string, rec *kgo.Record) *consume.Message {
	m := &consume.Message{
		Stream: st, Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset,
		Key: rec.Key, Value: rec.Value, Time: rec.Timestamp,
		EventID: s.cfg.EventID(rec), Raw: rec,
	}
	if len(rec.Headers) > 0 {
		m.Headers = make([]consume.Header, len(rec.Headers))
		for i, h := range rec.Headers {
			m.Headers[i] = consume.Header{Key: h.Key, Value: h.Value}
		}
	}
	return m
}

// Ack commits, per partition, the offset after the last acked record, and
// resumes a held partition whose holding record is acked.
func (s *session) Ack(ctx context.Context, msgs []*consume.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	resume := map[string][]int32{}
	rewind := map[string]map[int32]kgo.EpochOffset{}
	for _, m := range msgs {
		rec := m.Raw.(*kgo.Record)
		tp := topicPartition{rec.Topic, rec.Partition}
		if !s.owned[tp] {
			continue // revoked meanwhile: the next owner re-reads it, harmlessly
		}
		at := kgo.EpochOffset{Epoch: rec.LeaderEpoch, Offset: rec.Offset + 1}
		s.done[tp] = doneOffset{at: at}
		if h, ok := s.held[tp]; ok && rec.Offset >= h {
			// The record that held the partition is done: fetch on from
			// the record after it (Hold rewound the position to it).
			delete(s.held, tp)
			resume[tp.topic] = append(resume[tp.topic], tp.partition)
			if rewind[tp.topic] == nil {
				rewind[tp.topic] = map[int32]kgo.EpochOffset{}
			}
			rewind[tp.topic][tp.partition] = at
		}
	}
	err := s.commitLocked(ctx, nil)
	if len(resume) > 0 {
		s.cl.SetOffsets(rewind)
		s.cl.ResumeFetchPartitions(resume)
	}
	return err
}

// Hold pauses m's partition and rewinds its fetch position to m, so that m
// and what follows it are fetched again once the hold ends (Ack of m). The
// records after m that were already polled are dropped by the consumer;
// the rewind brings them back.
func (s *session) Hold(_ context.Context, m *consume.Message) error {
	rec := m.Raw.(*kgo.Record)
	tp := topicPartition{rec.Topic, rec.Partition}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.owned[tp] {
		return nil // revoked: its next owner starts from the committed offset
	}
	if h, ok := s.held[tp]; ok && h <= rec.Offset {
		return nil // already held at or before m
	}
	s.held[tp] = rec.Offset
	s.cl.PauseFetchPartitions(map[string][]int32{tp.topic: {tp.partition}})
	s.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{tp.topic: {tp.partition: {Epoch: rec.LeaderEpoch, Offset: rec.Offset}}})
	return nil
}

// Close commits what is left, lets the final revoke through and leaves the
// group, so that another member takes the partitions over at once; all
// within ctx.
//
// During a rebalance franz-go holds commits and the leave until this
// member's JoinGroup is answered, and the broker answers it only once every
// member it knows has rejoined: one that was SIGKILLed is waited for until
// its session times out. So, step by step:
//
//  1. the commit gets half of ctx's time; one still held then is given up
//     (the records are in processed_event: the next owner re-reads and
//     skips them);
//  2. the leave gets the rest;
//  3. a leave still held when ctx ends is abandoned: the client's own
//     context is cancelled, which fails the join in flight, so that
//     closing the client returns at once. No LeaveGroup reaches the
//     broker, which drops this member at its session timeout.
func (s *session) Close(ctx context.Context) error {
	defer s.abandon()
	cctx, cancel := ctx, context.CancelFunc(func() {})
	if dl, ok := ctx.Deadline(); ok {
		cctx, cancel = context.WithDeadline(ctx, time.Now().Add(time.Until(dl)/2))
	}
	s.mu.Lock()
	if err := s.commitLocked(cctx, nil); err != nil {
		s.log.Warn("final offset commit given up; the next owner re-reads those records and skips them", "err", err)
	}
	s.mu.Unlock()
	cancel()
	// With BlockRebalanceOnPoll, leaving waits for the final revoke, which
	// waits for AllowRebalance: forgetting it is the classic Close hang.
	s.cl.AllowRebalance()
	err := s.cl.LeaveGroupContext(ctx)
	if err != nil {
		s.log.Warn("group leave abandoned (a rebalance holds it); the broker drops this member at its session timeout", "err", err)
		s.abandon()
	}
	s.cl.Close()
	return err
}

// commitLocked commits the uncommitted done offsets of the given
// partitions (all if nil).
func (s *session) commitLocked(ctx context.Context, only map[string][]int32) error {
	todo := map[string]map[int32]kgo.EpochOffset{}
	add := func(tp topicPartition, d doneOffset) {
		if d.committed {
			return
		}
		if todo[tp.topic] == nil {
			todo[tp.topic] = map[int32]kgo.EpochOffset{}
		}
		todo[tp.topic][tp.partition] = d.at
	}
	if only == nil {
		for tp, d := range s.done {
			add(tp, d)
		}
	}
	for topic, ps := range only {
		for _, p := range ps {
			tp := topicPartition{topic, p}
			if d, ok := s.done[tp]; ok {
				add(tp, d)
			}
		}
	}
	if len(todo) == 0 {
		return nil
	}
	var first error
	s.cl.CommitOffsetsSync(ctx, todo, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			first = err
			return
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				tp := topicPartition{t.Topic, p.Partition}
				if p.ErrorCode != 0 {
					if first == nil {
						first = errors.New("kafka: offset commit " + stream(t.Topic, p.Partition) + ": error code " + strconv.Itoa(int(p.ErrorCode)))
					}
					continue
				}
				if d, ok := s.done[tp]; ok && d.at == todo[t.Topic][p.Partition] {
					d.committed = true
					s.done[tp] = d
				}
			}
		}
	})
	return first
}

func (s *session) onAssigned(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for topic, ps := range assigned {
		for _, p := range ps {
			s.owned[topicPartition{topic, p}] = true
		}
	}
}

// onRevoked runs on franz-go's goroutine when partitions leave this member
// (rebalance or leave). Because of BlockRebalanceOnPoll it never overlaps
// the processing of a poll, so every acked record's offset is in done:
// commit those of the revoked partitions, so the next owner starts right
// after, then forget the partitions.
func (s *session) onRevoked(ctx context.Context, _ *kgo.Client, revoked map[string][]int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.commitLocked(ctx, revoked); err != nil {
		s.log.Warn("offset commit on revoke", "err", err)
	}
	s.forgetLocked(revoked)
}

// onLost: the partitions are gone without a clean revoke (session
// expired); a commit would be rejected, so only forget them.
func (s *session) onLost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.forgetLocked(lost)
}

func (s *session) forgetLocked(parts map[string][]int32) {
	resume := map[string][]int32{}
	for topic, ps := range parts {
		for _, p := range ps {
			tp := topicPartition{topic, p}
			delete(s.owned, tp)
			delete(s.done, tp)
			if _, ok := s.held[tp]; ok {
				// Paused partitions stay paused across rebalances: resume
				// it, or a later re-assignment would never be fetched.
				delete(s.held, tp)
				resume[topic] = append(resume[topic], p)
			}
			s.revoked = append(s.revoked, stream(topic, p))
		}
	}
	if len(resume) > 0 {
		s.cl.ResumeFetchPartitions(resume)
	}
}
