package kafka_test

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/consume"
	"github.com/idemkit/idem/kafka"
)

// TestDeadLetterTooLargeReferenceCopy: the dead-letter topic accepts at
// most 4 KiB (max.message.bytes), and a 20 KB record fails its handler
// for good. Its full copy is refused (MESSAGE_TOO_LARGE, on every
// attempt), so the consumer dead-letters a reference copy instead: no
// value, dlq-truncated, dlq-size, dlq-source, the error and the event id;
// the records behind it on the partition are processed and nothing is
// reported stuck. The dead-letter tools then read the original from its
// source: Show returns its value, Redrive republishes it whole; once
// retention has deleted the source record, Show says it is gone and
// Redrive refuses it with ErrSourceGone.
func TestDeadLetterTooLargeReferenceCopy(t *testing.T) {
	t.Parallel()
	b := consSetup(t, 1)
	ctx := context.Background()
	dlqTopic := "orders.small.dlq"
	adm := kadm.NewClient(b.kc.Client(t))
	maxBytes := "4096"
	if _, err := adm.CreateTopic(ctx, 1, 1, map[string]*string{"max.message.bytes": &maxBytes}, dlqTopic); err != nil {
		t.Fatal(err)
	}
	for _, topic := range []string{"orders.redriven", "orders.redriven-again"} {
		b.kc.CreateTopic(t, topic, 1)
	}
	// Random bytes: the producer compresses, and the limit is on the
	// compressed batch.
	big := make([]byte, 20_000)
	_, _ = rand.NewChaCha8([32]byte{1}).Read(big)
	var (
		mu    sync.Mutex
		kinds []consume.Kind
	)
	hook := func(ctx context.Context, e kafka.ConsumerEvent) context.Context {
		mu.Lock()
		kinds = append(kinds, e.Kind)
		mu.Unlock()
		return ctx
	}
	handler := func(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
		if len(rec.Value) > 10_000 {
			return kafka.Permanent(errors.New("payload too large to charge"))
		}
		return consEffectHandler("a")(ctx, tx, rec)
	}
	c := b.consStart(t, handler, func(cfg *kafka.ConsumerConfig) {
		cfg.DeadLetterTopic, cfg.Hook, cfg.DeadLetterAttempts = dlqTopic, hook, 2
	})
	for i, v := range [][]byte{[]byte("0"), big, []byte("2")} {
		rec := &kgo.Record{Key: []byte("order-1"), Value: v, Headers: []kgo.RecordHeader{
			{Key: kafka.HeaderEventID, Value: []byte("ev-" + strconv.Itoa(i))},
			{Key: "trace", Value: []byte("t-" + strconv.Itoa(i))},
		}}
		if err := b.prod.ProduceSync(ctx, rec).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	b.consWaitEffects(t, 2, 60*time.Second)
	dl := b.kc.ReadAll(t, dlqTopic, 1, 30*time.Second)[0]
	h := map[string]string{}
	for _, x := range dl.Headers {
		h[x.Key] = string(x.Value)
	}
	if len(dl.Value) != 0 || h[kafka.HeaderDeadLetterTruncated] != "true" || h[kafka.HeaderDeadLetterSource] != "orders/0/1" ||
		h[kafka.HeaderEventID] != "ev-1" || !strings.Contains(h[kafka.HeaderDeadLetterError], "payload too large to charge") ||
		string(dl.Key) != "order-1" || h["trace"] != "" {
		t.Fatalf("reference copy: value %d bytes, key %q, headers %v", len(dl.Value), dl.Key, h)
	}
	if size, _ := strconv.Atoi(h[kafka.HeaderDeadLetterSize]); size < len(big) {
		t.Errorf("dlq-size %q, want at least %d", h[kafka.HeaderDeadLetterSize], len(big))
	}
	ctxStop, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := c.Stop(ctxStop); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	for _, k := range kinds {
		if k == consume.KindStuck {
			t.Error("the too-large record was reported stuck")
		}
	}
	mu.Unlock()
	var committed int64
	if err := func() error {
		offs, err := adm.FetchOffsets(ctx, b.group)
		if err != nil {
			return err
		}
		o, _ := offs.Lookup(b.topic, 0)
		committed = o.At
		return o.Err
	}(); err != nil || committed != 3 {
		t.Errorf("committed offset %d (%v), want 3: the partition did not move past the record", committed, err)
	}

	// The tools read the original from its source.
	d := kafka.NewDLQ(kgo.SeedBrokers(b.kc.Addrs...))
	got, err := d.Show(ctx, dlqTopic, 0, 0)
	if err != nil || !got.Truncated || !got.FromSource || !bytes.Equal(got.Value, big) {
		t.Fatalf("show: truncated %v, from source %v, value %d bytes, %v", got.Truncated, got.FromSource, len(got.Value), err)
	}
	rep, err := d.Redrive(ctx, kafka.RedriveOptions{From: dlqTopic, To: "orders.redriven"})
	if err != nil || len(rep.Moved) != 1 || len(rep.Refused) != 0 {
		t.Fatalf("redrive: %+v, %v", rep, err)
	}
	re := b.kc.ReadAll(t, "orders.redriven", 1, 30*time.Second)[0]
	rh := map[string]string{}
	for _, x := range re.Headers {
		rh[x.Key] = string(x.Value)
	}
	if !bytes.Equal(re.Value, big) || rh[kafka.HeaderEventID] != "ev-1" || rh["trace"] != "t-1" || rh[kafka.HeaderDeadLetterRedriveID] != dlqTopic+"/0/0" || rh[kafka.HeaderDeadLetterTruncated] != "" {
		t.Errorf("redriven record: value %d bytes, headers %v", len(re.Value), rh)
	}

	// Retention deletes the source record: only the reference is left.
	del, err := adm.DeleteRecords(ctx, kadm.Offsets{b.topic: {0: {Topic: b.topic, Partition: 0, At: 3}}})
	if err != nil || del.Error() != nil {
		t.Fatalf("delete records: %v %v", err, del.Error())
	}
	got, err = d.Show(ctx, dlqTopic, 0, 0)
	if err != nil || !got.SourceGone || got.FromSource || len(got.Value) != 0 {
		t.Fatalf("show after retention: source gone %v, from source %v, %v", got.SourceGone, got.FromSource, err)
	}
	rep, err = d.Redrive(ctx, kafka.RedriveOptions{From: dlqTopic, To: "orders.redriven-again"})
	if !errors.Is(err, kafka.ErrSourceGone) || rep == nil || len(rep.Moved) != 0 || len(rep.Refused) != 1 ||
		!strings.Contains(rep.Refused[0].Reason, "source record is gone") {
		t.Fatalf("redrive after retention: %+v, %v; want the record refused with ErrSourceGone", rep, err)
	}
}
