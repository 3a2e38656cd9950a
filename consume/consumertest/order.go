package consumertest

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/consume"
)

func quiet() *slog.Logger {
	if os.Getenv("CONSUMERTEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	return slog.New(slog.DiscardHandler)
}

// testCommitAfterDBCommit: the transaction of ev-5 fails at COMMIT (after
// the handler returned) until the test lifts the fault. While it fails,
// the broker must not have ev-5 acknowledged; a driver or core that acked
// before the commit would. Then everything commits and is acked.
func testCommitAfterDBCommit(t *testing.T, h Harness, sqlDriver string) {
	w := newWorld(t, h, 1)
	ctx := context.Background()
	if _, err := w.db.Pool.Exec(ctx, `INSERT INTO kit_fail VALUES ('ev-5')`); err != nil {
		t.Fatal(err)
	}
	var (
		refused   atomic.Int64
		ackedWhen = make(chan int, 100)
		lifted    = make(chan struct{})
		liftOnce  sync.Once
	)
	var ev events
	hook := func(ctx context.Context, e consume.Event) context.Context {
		ev.hook(ctx, e)
		if e.Kind == consume.KindRetried && e.EventID == "ev-5" && !e.Handler {
			// The hook runs on the processing goroutine: nothing can be
			// acked while this look at the broker runs.
			ackedWhen <- w.broker.Acked(t, w.group, w.topic)
			if refused.Add(1) == 3 {
				liftOnce.Do(func() { close(lifted) })
			}
		}
		return ctx
	}
	c := w.effectConsumer(t, sqlDriver, func(cfg *consume.Config) { cfg.Hook = hook })
	start(t, c)
	w.broker.Produce(t, w.topic, msgs(0, 10, 1)...)
	select {
	case <-lifted:
	case <-time.After(60 * time.Second):
		t.Fatalf("the commit of ev-5 was refused %d times in 60s, want 3", refused.Load())
	}
	if _, err := w.db.Pool.Exec(ctx, `DELETE FROM kit_fail`); err != nil {
		t.Fatal(err)
	}
	w.waitEffects(t, 10, 60*time.Second)
	waitFor(t, 60*time.Second, "10 messages acked", func() bool { return w.broker.Acked(t, w.group, w.topic) == 10 })
	close(ackedWhen)
	for n := range ackedWhen {
		if n > 5 {
			t.Errorf("while the commit of ev-5 failed, the broker had %d messages acked: ev-5 was acked before its transaction committed", n)
		}
	}
	w.assertExactlyOnce(t, 10)
	if n := ev.count(consume.KindProcessed, ""); n != 10 {
		t.Errorf("%d processed events, want 10", n)
	}
	if len(ev.of(consume.KindCommitted)) == 0 {
		t.Error("no committed event")
	}
}

// testGracefulStop: Stop while the handler is in the middle of a message
// waits for it, commits its transaction and acks it; a second consumer
// takes over from there and every event has one effect.
func testGracefulStop(t *testing.T, h Harness) {
	w := newWorld(t, h, 2)
	entered := make(chan string, 100)
	release := make(chan struct{})
	slow := func(ctx context.Context, tx pgx.Tx, m *consume.Message) error {
		entered <- string(m.Value)
		<-release
		return effectHandler(ctx, tx, m)
	}
	a := w.consumer(t, slow, nil)
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	w.broker.Produce(t, w.topic, msgs(0, 40, 2)...)
	inHand := <-entered
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		stopped <- a.Stop(ctx)
	}()
	select {
	case err := <-stopped:
		t.Fatalf("Stop returned (%v) while a message was in hand", err)
	case <-time.After(100 * time.Millisecond): // a bounded look for a wrong early return
	}
	close(release)
	if err := <-stopped; err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if n := w.count(t, `SELECT count(*) FROM kit_effect WHERE value = $1`, inHand); n != 1 {
		t.Fatalf("message in hand %s: %d effects, want 1", inHand, n)
	}
	effects := w.count(t, `SELECT count(*) FROM kit_effect`)
	if acked := w.broker.Acked(t, w.group, w.topic); acked != effects {
		t.Fatalf("acked %d, effects %d: Stop did not ack what it finished", acked, effects)
	}
	b := w.consumer(t, effectHandler, nil)
	start(t, b)
	w.waitEffects(t, 40, 60*time.Second)
	w.assertExactlyOnce(t, 40)
}

// testPoisonInOrder: on one stream, ev-3 fails every time and ev-6 fails
// Permanently; both are dead-lettered, in stream order, with the error and
// the attempts in their headers, and the other messages are handled in
// order.
func testPoisonInOrder(t *testing.T, h Harness, batch bool) {
	w := newWorld(t, h, 1)
	var mu sync.Mutex
	attempts := map[string]int{}
	hnd := func(ctx context.Context, tx pgx.Tx, m *consume.Message) error {
		mu.Lock()
		attempts[m.EventID]++
		mu.Unlock()
		switch m.EventID {
		case "ev-3":
			return errors.New("poison: amount is negative")
		case "ev-6":
			return consume.Permanent(errors.New("malformed payload"))
		}
		return effectHandler(ctx, tx, m)
	}
	c := w.consumer(t, hnd, func(cfg *consume.Config) { cfg.Batch, cfg.MaxAttempts = batch, 3 })
	start(t, c)
	w.broker.Produce(t, w.topic, msgs(0, 10, 1)...)
	dl := w.broker.Read(t, w.dlq, 2, 60*time.Second)
	w.waitEffects(t, 8, 60*time.Second)
	if got := joinValues(dl); got != "3 6" {
		t.Fatalf("dead letters %q, want \"3 6\" (stream order)", got)
	}
	for i, want := range []struct{ id, err string }{{"ev-3", "poison: amount is negative"}, {"ev-6", "malformed payload"}} {
		if dl[i].EventID != want.id || !strings.Contains(headerValues(dl[i]), want.err) {
			t.Errorf("dead letter %d = %s %v, want %s carrying %q", i, dl[i].EventID, dl[i].Headers, want.id, want.err)
		}
	}
	rows, err := w.db.Pool.Query(context.Background(), `SELECT value FROM kit_effect ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if want := "0 1 2 4 5 7 8 9"; strings.Join(got, " ") != want {
		t.Errorf("effects in order %v, want %s", got, want)
	}
	waitFor(t, 60*time.Second, "10 messages acked", func() bool { return w.broker.Acked(t, w.group, w.topic) == 10 })
	mu.Lock()
	defer mu.Unlock()
	if n := attempts["ev-3"]; n < 3 || n > 4 { // +1 for the failed batch
		t.Errorf("ev-3 ran %d times, want 3 (4 in batch mode)", n)
	}
}

func headerValues(m Msg) string {
	var b strings.Builder
	for k, v := range m.Headers {
		b.WriteString(k + "=" + v + ";")
	}
	return b.String()
}
