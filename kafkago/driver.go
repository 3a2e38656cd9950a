package kafkago

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/idemkit/idem/consume"
)

// drainWindow is how long Fetch goes on taking messages the Reader already
// has, after the first: they are queued in memory, so a few milliseconds
// gather a batch without waiting for the broker.
const drainWindow = 2 * time.Millisecond

type driver struct {
	cfg ConsumerConfig
	log *slog.Logger
}

type partition struct {
	topic string
	part  int
}

// hold is a held partition: the offset of the message that holds it and
// the later messages kept back meanwhile, in offset order.
type hold struct {
	at      int64
	later   []*consume.Message
	dropped bool // some later messages were dropped: reconnect at release
}

// session is one run's Reader and dead-letter Writer. Fetch, Ack, Hold and
// Close run on the consumer's goroutine, so its state needs no lock;
// DeadLetter runs concurrently and touches only the Writer, which is safe
// for concurrent use.
type session struct {
	cfg *ConsumerConfig
	log *slog.Logger
	r   *kafka.Reader
	w   *kafka.Writer
	// gs is r's generation as the Reader's own log reports it: what Ack
	// may commit.
	gs *genState

	held map[partition]*hold
	// ready: messages of partitions whose hold ended, handed over by the
	// next Fetch before anything new.
	ready []*consume.Message
	// reopen: a released partition had dropped messages; the next Fetch
	// replaces the Reader, which resumes every partition at its committed
	// offset.
	reopen bool
}

// Open makes the session's Reader and Writer; both connect lazily.
func (d *driver) Open(context.Context) (consume.Session, error) {
	s := &session{cfg: &d.cfg, log: d.log, held: map[partition]*hold{}}
	s.r = s.newReader()
	s.w = d.newWriter()
	return s, nil
}

func (s *session) newReader() *kafka.Reader {
	gs := &genState{}
	s.gs = gs
	debug := s.log.Enabled(context.Background(), slog.LevelDebug)
	rc := kafka.ReaderConfig{
		Brokers:     s.cfg.Brokers,
		GroupID:     s.cfg.Group,
		GroupTopics: s.cfg.Topics,
		// Synchronous commits: CommitMessages returns once Kafka has the
		// offsets, after the database commit (Ack).
		CommitInterval: 0,
		StartOffset:    kafka.FirstOffset,
		IsolationLevel: kafka.ReadCommitted,
		MaxWait:        MaxWaitDefault,
		ErrorLogger: kafka.LoggerFunc(func(format string, a ...any) {
			s.log.Debug("kafka-go reader: " + fmt.Sprintf(format, a...))
		}),
	}
	if s.cfg.Reader != nil {
		s.cfg.Reader(&rc)
	}
	// The Reader's progress log is the only place it tells its
	// generations: gs follows them, whatever Logger ConsumerConfig.Reader
	// set (it still gets every line). Without one, the lines (joins,
	// assignments, commit loops, fetch timeouts) go to the logger at
	// Debug, only when asked for: they are chatty.
	user := rc.Logger
	rc.Logger = kafka.LoggerFunc(func(format string, a ...any) {
		gs.observe(format, a)
		switch {
		case user != nil:
			user.Printf(format, a...)
		case debug:
			s.log.Debug("kafka-go reader info: " + strings.TrimSpace(fmt.Sprintf(format, a...)))
		}
	})
	return kafka.NewReader(rc)
}

func stream(topic string, part int) string { return topic + "/" + strconv.Itoa(part) }

// Fetch hands over the messages of released holds first; otherwise it
// waits for the Reader's next message and takes what else the Reader has
// at hand, up to MaxPollRecords. Messages of held partitions are kept
// back.
func (s *session) Fetch(ctx context.Context) (consume.Fetch, error) {
	if s.reopen {
		s.reopen = false
		s.ready = nil
		if err := s.r.Close(); err != nil {
			s.log.Warn("close reader for reconnect", "err", err)
		}
		s.r = s.newReader()
	}
	if len(s.ready) > 0 {
		n := min(len(s.ready), s.cfg.MaxPollRecords)
		f := consume.Fetch{Messages: s.ready[:n:n]}
		s.ready = s.ready[n:]
		return f, nil
	}
	var f consume.Fetch
	km, err := s.r.FetchMessage(ctx)
	if err != nil {
		return f, err
	}
	s.take(&f, km)
	dctx, cancel := context.WithTimeout(ctx, drainWindow)
	defer cancel()
	for len(f.Messages) < s.cfg.MaxPollRecords {
		km, err := s.r.FetchMessage(dctx)
		if err != nil {
			break
		}
		s.take(&f, km)
	}
	return f, nil
}

// take adds km to f, or keeps it back if its partition is held.
func (s *session) take(f *consume.Fetch, km kafka.Message) {
	m := s.message(km)
	if h := s.held[partition{km.Topic, km.Partition}]; h != nil {
		s.keep(h, m)
		return
	}
	f.Messages = append(f.Messages, m)
}

// keep adds m to h's later messages, in offset order and once: after a
// reconnect the Reader brings back messages the hold already has.
func (s *session) keep(h *hold, m *consume.Message) {
	if m.Offset == h.at {
		return // the holding message: the consumer has it
	}
	if n := len(h.later); n > 0 && m.Offset <= h.later[n-1].Offset {
		for _, x := range h.later {
			if x.Offset == m.Offset {
				return
			}
		}
	}
	if len(h.later) >= s.cfg.MaxHeldMessages {
		if !h.dropped {
			s.log.Warn("held partition: later messages dropped past MaxHeldMessages; the reader reconnects when the hold ends",
				"stream", m.Stream, "held_offset", h.at, "max", s.cfg.MaxHeldMessages)
		}
		h.dropped = true
		return
	}
	i := len(h.later)
	for i > 0 && h.later[i-1].Offset > m.Offset {
		i--
	}
	h.later = append(h.later, nil)
	copy(h.later[i+1:], h.later[i:])
	h.later[i] = m
}

func (s *session) message(km kafka.Message) *consume.Message {
	k := km
	m := &consume.Message{
		Stream: stream(k.Topic, k.Partition), Topic: k.Topic, Partition: int32(k.Partition), Offset: k.Offset,
		Key: k.Key, Value: k.Value, Time: k.Time, EventID: s.cfg.EventID(&k), Raw: &k,
	}
	if len(k.Headers) > 0 {
		m.Headers = make([]consume.Header, len(k.Headers))
		for i, h := range k.Headers {
			m.Headers[i] = consume.Header{Key: h.Key, Value: h.Value}
		}
	}
	return m
}

// Ack commits the offsets of msgs (synchronously: it returns once Kafka
// has them) and ends the holds whose holding message is among them.
//
// It commits only what this member may: the partitions of the Reader's
// current generation, from the offset that generation started at. A
// message of a partition lost in a rebalance (fetched before it, acked
// after) is not committed: its new owner started at the committed offset
// and delivers it again (the inbox finds it processed), and an offset
// committed now could go back below the new owner's, which it would never
// commit again once past the partition's end. kafka-go's Reader commits
// with its current generation whatever the partitions, and Kafka accepts
// an offset for any partition from a member of the current generation;
// hence the check here. For the same reason a commit still waiting for
// the Reader when its generation ends is given up: the next generation
// starts every partition at its committed offset again.
func (s *session) Ack(ctx context.Context, msgs []*consume.Message) error {
	kms := make([]kafka.Message, 0, len(msgs))
	for _, m := range msgs {
		km := m.Raw.(*kafka.Message)
		kms = append(kms, *km)
		p := partition{km.Topic, km.Partition}
		if h := s.held[p]; h != nil && km.Offset >= h.at {
			delete(s.held, p)
			if h.dropped {
				s.reopen = true
			} else {
				s.ready = append(s.ready, h.later...)
			}
		}
	}
	cctx, mine, skipped, done := s.gs.commitable(ctx, kms)
	defer done()
	debug := s.log.Enabled(ctx, slog.LevelDebug)
	if debug && len(skipped) > 0 {
		s.log.Debug("kafkago: commit skipped: partition not in this generation, or before its start", "offsets", commitOffsets(skipped))
	}
	if len(mine) == 0 {
		return nil
	}
	err := s.r.CommitMessages(cctx, mine...)
	if err != nil && ctx.Err() == nil && cctx.Err() != nil {
		// The generation ended with the commit still waiting: the next
		// one starts at the committed offsets and delivers these again.
		if debug {
			s.log.Debug("kafkago: commit given up: the generation ended", "offsets", commitOffsets(mine))
		}
		return nil
	}
	if debug {
		s.log.Debug("kafkago: commit", "offsets", commitOffsets(mine), "err", err)
	}
	return err
}

// genState is a Reader's current generation, as its progress log tells
// it: the offset each assigned partition started at, nil between two
// generations. Its methods are safe for concurrent use (the log is
// written by the Reader's goroutines).
type genState struct {
	mu sync.Mutex
	// known: the log has told a generation in a form this driver reads.
	// Until then (or after a line it could not read: another kafka-go
	// than the one this driver is tested with), every ack is committed,
	// as kafka-go alone would: a stale ack can then set an offset back
	// (redeliveries the inbox skips), never stop the commits.
	known    bool
	assigned map[partition]int64
	// waiting: the commits in progress, given up when the generation ends.
	waiting map[*int]context.CancelFunc
}

// The kafka-go v0.4 Reader's log lines that frame a generation: the
// assignment (a map[topicPartition]int64 of start offsets) once the
// Reader has started reading it, and the end of the generation's commit
// loop. Were they to change (another kafka-go), every ack would be
// committed again, as before this check (see genState.known), and
// TestStaleAckAfterRebalanceDoesNotRewindTheNewOwner fails.
const (
	logSubscribed    = "subscribed to topics and partitions: %+v"
	logStoppedCommit = "stopped commit for group %s\n"
)

func (g *genState) observe(format string, a []any) {
	switch format {
	case logSubscribed:
		assigned, ok := readAssignment(a)
		g.mu.Lock()
		g.known, g.assigned = ok, assigned
		g.mu.Unlock()
	case logStoppedCommit:
		g.mu.Lock()
		g.assigned = nil
		for _, cancel := range g.waiting {
			cancel()
		}
		g.mu.Unlock()
	}
}

// readAssignment reads the argument of a logSubscribed line: a map from
// kafka-go's topicPartition{topic string; partition int} to the start
// offset. ok false if it is not that.
func readAssignment(a []any) (map[partition]int64, bool) {
	if len(a) != 1 {
		return nil, false
	}
	v := reflect.ValueOf(a[0])
	if v.Kind() != reflect.Map {
		return nil, false
	}
	assigned := map[partition]int64{}
	for it := v.MapRange(); it.Next(); {
		k := it.Key()
		if k.Kind() != reflect.Struct || !it.Value().CanInt() {
			return nil, false
		}
		t, p := k.FieldByName("topic"), k.FieldByName("partition")
		if t.Kind() != reflect.String || !p.CanInt() {
			return nil, false
		}
		assigned[partition{t.String(), int(p.Int())}] = it.Value().Int()
	}
	return assigned, true
}

// commitable splits kms into the messages this generation may commit and
// the others, and gives the commit's ctx: cancelled when the generation
// ends. done releases it.
func (g *genState) commitable(ctx context.Context, kms []kafka.Message) (cctx context.Context, mine, skipped []kafka.Message, done func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, km := range kms {
		start, ok := g.assigned[partition{km.Topic, km.Partition}]
		if !g.known || ok && (start < 0 || km.Offset >= start) {
			mine = append(mine, km)
		} else {
			skipped = append(skipped, km)
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	if g.waiting == nil {
		g.waiting = map[*int]context.CancelFunc{}
	}
	key := new(int)
	g.waiting[key] = cancel
	return cctx, mine, skipped, func() {
		g.mu.Lock()
		delete(g.waiting, key)
		g.mu.Unlock()
		cancel()
	}
}

// commitOffsets describes the offsets a commit of kms asks for: per
// partition, the highest offset plus one, as Kafka stores it.
func commitOffsets(kms []kafka.Message) string {
	next := map[partition]int64{}
	var order []partition
	for _, km := range kms {
		p := partition{km.Topic, km.Partition}
		if o, ok := next[p]; !ok {
			order = append(order, p)
		} else if o > km.Offset {
			continue
		}
		next[p] = km.Offset + 1
	}
	var b strings.Builder
	for i, p := range order {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%d", stream(p.topic, p.part), next[p])
	}
	return b.String()
}

// Hold keeps m's partition back in the driver: the Reader cannot pause
// one partition. The first held message holds it; the later ones handed
// back (and those the Reader brings meanwhile) wait in memory until the
// holding message is acked.
func (s *session) Hold(_ context.Context, m *consume.Message) error {
	km := m.Raw.(*kafka.Message)
	p := partition{km.Topic, km.Partition}
	h := s.held[p]
	if h == nil {
		s.held[p] = &hold{at: km.Offset}
		return nil
	}
	s.keep(h, m)
	return nil
}

// Close closes the Reader (it leaves the group, so that another member
// takes the partitions over at once) and the Writer, bounded by ctx.
func (s *session) Close(ctx context.Context) error {
	done := make(chan error, 1)
	go func() {
		err := s.r.Close()
		err = errors.Join(err, s.w.Close())
		if t, ok := s.w.Transport.(*kafka.Transport); ok {
			t.CloseIdleConnections()
		}
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("kafkago: close: %w", ctx.Err())
	}
}
