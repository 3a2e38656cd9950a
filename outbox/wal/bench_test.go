package wal_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/wal"
)

type countPub struct {
	n    atomic.Int64
	want int64
	done chan struct{}
}

func (c *countPub) Publish(_ context.Context, events []outbox.Event) error {
	if c.n.Add(int64(len(events))) >= c.want {
		close(c.done)
	}
	return nil
}

// BenchmarkRelayFloor drains b.N events written beforehand through a
// publisher that only counts: the decode-and-confirm ceiling.
func BenchmarkRelayFloor(b *testing.B) {
	bd := setup(b)
	r, err := wal.NewRelay(bd.db.URL, &nopPub{}, bd.config(&wal.Config{BatchSize: 1000, LagInterval: -1}))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := r.Start(ctx); err != nil {
		b.Fatal(err)
	}
	if err := r.Stop(ctx); err != nil {
		b.Fatal(err)
	}
	for i := 0; i < b.N; i += 1000 {
		var msgs []outbox.Message
		for j := i; j < min(i+1000, b.N); j++ {
			msgs = append(msgs, outbox.Message{Topic: "t", AggregateType: "a", AggregateID: strconv.Itoa(j % 100), EventID: strconv.Itoa(j), EventType: "E", Payload: make([]byte, 100)})
		}
		if err := pgx.BeginFunc(ctx, bd.db.Pool, func(tx pgx.Tx) error { _, err := bd.enq.EnqueueTx(ctx, tx, msgs...); return err }); err != nil {
			b.Fatal(err)
		}
	}
	c := &countPub{want: int64(b.N), done: make(chan struct{})}
	r2, err := wal.NewRelay(bd.db.URL, c, bd.config(&wal.Config{BatchSize: 1000, LagInterval: -1}))
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	if err := r2.Start(ctx); err != nil {
		b.Fatal(err)
	}
	<-c.done
	b.StopTimer()
	if err := r2.Stop(ctx); err != nil {
		b.Fatal(err)
	}
}

type nopPub struct{}

func (nopPub) Publish(context.Context, []outbox.Event) error { return nil }
