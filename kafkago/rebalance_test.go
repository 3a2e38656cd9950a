package kafkago_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/consume"
	"github.com/idemkit/idem/internal/testkafka"
	"github.com/idemkit/idem/kafkago"
)

// TestStaleAckAfterRebalanceDoesNotRewindTheNewOwner: a member that
// fetched a partition's messages, lost the partition in a rebalance and
// acks them afterwards (it was processing them meanwhile) must not move
// the group's offset back below what the partition's new owner
// committed. kafka-go's Reader commits with its current generation
// whatever partitions the messages are from, and the broker accepts an
// offset for any partition from a member of the current generation; the
// new owner, already past the end, never commits that partition again:
// the group stays behind for ever (the chaos matrix's not-idle stall,
// billing-charger N behind on billing.commands).
func TestStaleAckAfterRebalanceDoesNotRewindTheNewOwner(t *testing.T) {
	kc := testkafka.New(t)
	const topic, group, perPart = "stale-ack", "stale-ack-g", 10
	kc.CreateTopic(t, topic, 2)
	cl := kc.Client(t, kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	var recs []*kgo.Record
	for p := range int32(2) {
		for i := range perPart {
			recs = append(recs, &kgo.Record{Partition: p, Value: fmt.Appendf(nil, "p%d-%d", p, i)})
		}
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	// The members' own Logger (ConsumerConfig.Reader may set one) must
	// not blind the driver to the generations, and still gets the lines.
	var lines atomic.Int64
	open := func() consume.Session {
		d, err := kafkago.NewDriver(&kafkago.ConsumerConfig{
			Brokers: kc.Addrs, Group: group, Topics: []string{topic}, Logger: quiet(),
			SkipDeadLetterTopicCheck: true,
			EventID:                  func(m *kafka.Message) string { return fmt.Sprintf("%d-%d", m.Partition, m.Offset) },
			Reader: func(rc *kafka.ReaderConfig) {
				rc.SessionTimeout, rc.HeartbeatInterval, rc.RebalanceTimeout = 6*time.Second, 100*time.Millisecond, 5*time.Second
				rc.Logger = kafka.LoggerFunc(func(string, ...any) { lines.Add(1) })
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		s, err := d.Open(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = s.Close(ctx)
		})
		return s
	}
	fetchAll := func(s consume.Session, n int) []*consume.Message {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var out []*consume.Message
		for len(out) < n {
			f, err := s.Fetch(ctx)
			if err != nil {
				t.Fatalf("fetch: %d of %d messages: %v", len(out), n, err)
			}
			out = append(out, f.Messages...)
		}
		return out
	}

	// a, alone in the group, has both partitions and fetches every
	// message; it acks none yet (its handler is busy).
	a := open()
	stale := fetchAll(a, 2*perPart)

	// b joins: each member gets one partition; b fetches its partition
	// from the committed offset (none yet: the start) and acks it all.
	b := open()
	adm := kadm.NewClient(kc.Client(t))
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		dg, err := adm.DescribeGroups(ctx, group)
		cancel()
		if err == nil && dg[group].State == "Stable" && len(dg[group].Members) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the group did not settle with two members: %v %+v", err, dg)
		}
		time.Sleep(50 * time.Millisecond)
	}
	moved := fetchAll(b, perPart)
	lost := moved[0].Partition
	for _, m := range moved {
		if m.Partition != lost {
			t.Fatalf("b got messages of partitions %d and %d; want one partition", lost, m.Partition)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.Ack(ctx, moved); err != nil {
		t.Fatalf("b's ack: %v", err)
	}

	// a finishes the first half of the lost partition's messages and acks
	// them: the new owner is past them.
	var late []*consume.Message
	for _, m := range stale {
		if m.Partition == lost && m.Offset < perPart/2 {
			late = append(late, m)
		}
	}
	_ = a.Ack(ctx, late) // an error is fine; a rewind is not

	// a acks the partition it kept: that commit must go through.
	var kept []*consume.Message
	for _, m := range stale {
		if m.Partition != lost {
			kept = append(kept, m)
		}
	}
	if err := a.Ack(ctx, kept); err != nil {
		t.Fatalf("a's ack of the partition it kept: %v", err)
	}

	offs, err := adm.FetchOffsets(ctx, group)
	if err != nil {
		t.Fatal(err)
	}
	o, ok := offs.Lookup(topic, lost)
	if !ok || o.At != perPart {
		t.Fatalf("committed offset of %s/%d = %+v (found %v); want %d, where the new owner committed: the stale member rewound it", topic, lost, o.At, ok, perPart)
	}
	o, ok = offs.Lookup(topic, 1-lost)
	if !ok || o.At != perPart {
		t.Fatalf("committed offset of the kept partition %s/%d = %+v (found %v); want %d: a's commit was lost", topic, 1-lost, o.At, ok, perPart)
	}
	if lines.Load() == 0 {
		t.Fatal("the Reader's own Logger got no line")
	}
}
