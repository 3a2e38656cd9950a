package natsjs_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/consume"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/natsjs"
)

// The order-crash child's environment.
const (
	orderChildEnv    = "NATSJS_ORDER_CHILD"
	orderChildURL    = "NATSJS_ORDER_URL"
	orderChildPrefix = "NATSJS_ORDER_PREFIX"
	orderChildDB     = "NATSJS_ORDER_DB"
	orderAckWait     = 2 * time.Second
)

func orderDriverConfig(url, prefix string) *natsjs.ConsumerConfig {
	return &natsjs.ConsumerConfig{
		URL: url, Prefix: prefix, Group: "billing", Topics: []string{"orders.events"},
		AckWait: orderAckWait, FetchMaxWait: 100 * time.Millisecond, Logger: quiet(),
	}
}

// TestOrderAcrossACrash: a member SIGKILLed with e1..e3 of one aggregate
// in hand (fetched, unacknowledged) leaves them pending on the durable
// until AckWait; e4 and e5 of the same aggregate are published after the
// kill. The restarted member must still process the aggregate's first
// deliveries in order, e1 e2 e3 e4 e5: it holds e4 and e5 back until the
// earlier ones come back to it. (With MaxAckPending 1000 and no such
// hold, it took e4 and e5 at once: e4 e5 e1 e2 e3.) A second aggregate
// with nothing pending flows meanwhile.
func TestOrderAcrossACrash(t *testing.T) {
	if os.Getenv(orderChildEnv) != "" {
		runOrderChild(t)
		return
	}
	t.Parallel()
	s := newServer(t)
	db := testdb.New(t)
	ctx := context.Background()
	s.createTopic(t, "orders.events", 0)
	s.createTopic(t, "orders.events.dlq", 0) // the consumer checks it at Start
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE order_effect (id bigserial PRIMARY KEY, event_id text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	topic := natsjs.WithPrefix(s.prefix, "orders.events")
	publish := func(aggregate string, ids ...string) {
		t.Helper()
		for _, id := range ids {
			h := nats.Header{}
			h.Set(idem.HeaderEventID, id)
			if _, err := s.js.PublishMsg(ctx, &nats.Msg{Subject: natsjs.Subject(topic, "order", aggregate), Header: h, Data: []byte(id)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	publish("a1", "e1", "e2", "e3")

	// A member takes e1..e3 and dies by SIGKILL in the handler of e1.
	cmd := exec.Command(os.Args[0], "-test.run=^TestOrderAcrossACrash$", "-test.count=1")
	cmd.Env = append(os.Environ(), orderChildEnv+"=1", orderChildURL+"="+s.url, orderChildPrefix+"="+s.prefix, orderChildDB+"="+db.URL)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	entered := make(chan string, 10)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if id, ok := strings.CutPrefix(sc.Text(), "order-child: entered "); ok {
				entered <- id
			}
		}
		close(entered)
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case id := <-entered:
		if id != "e1" {
			t.Fatalf("the child entered %s first, want e1", id)
		}
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatal("the child never entered a handler")
	}
	cons, err := s.js.Consumer(ctx, s.stream("orders.events"), "billing")
	if err != nil {
		t.Fatal(err)
	}
	info, err := cons.Info(ctx)
	if err != nil || info.NumAckPending != 3 {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("before the kill: %d pending (%v), want e1..e3 in the child's hand", info.NumAckPending, err)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("the child did not die by SIGKILL: %v", err)
	}
	publish("a1", "e4", "e5")
	publish("b1", "f1")

	// The restarted member.
	c, err := natsjs.NewConsumer(db.Pool, func(ctx context.Context, tx pgx.Tx, m jetstream.Msg) error {
		_, err := tx.Exec(ctx, `INSERT INTO order_effect (event_id) VALUES ($1)`, m.Headers().Get(idem.HeaderEventID))
		return err
	}, orderDriverConfig(s.url, s.prefix), &consume.Config{BackoffMin: time.Millisecond, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		if err := c.Stop(sctx); err != nil {
			t.Errorf("Stop: %v", err)
		}
	}()
	deadline := time.Now().Add(60 * time.Second)
	var got []string
	for {
		rows, err := db.Pool.Query(ctx, `SELECT event_id FROM order_effect ORDER BY id`)
		if err != nil {
			t.Fatal(err)
		}
		got, err = pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		if len(got) >= 6 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond) // polling interval, not a wait for an event
	}
	var a1 []string
	for _, id := range got {
		if strings.HasPrefix(id, "e") {
			a1 = append(a1, id)
		}
	}
	if strings.Join(a1, " ") != "e1 e2 e3 e4 e5" || len(got) != 6 || got[0] != "f1" {
		t.Fatalf("processed %v; want aggregate a1 in order e1 e2 e3 e4 e5, and f1 (nothing pending on its subject) first", got)
	}
}

// runOrderChild is the member that dies: it takes the aggregate's
// messages, says which it entered, and blocks there until killed.
func runOrderChild(t *testing.T) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(orderChildDB))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	block := make(chan struct{})
	c, err := natsjs.NewConsumer(pool, func(ctx context.Context, tx pgx.Tx, m jetstream.Msg) error {
		fmt.Printf("order-child: entered %s\n", m.Headers().Get(idem.HeaderEventID))
		<-block // until SIGKILL
		return nil
	}, orderDriverConfig(os.Getenv(orderChildURL), os.Getenv(orderChildPrefix)), &consume.Config{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	<-block
}
