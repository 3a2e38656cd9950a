package consumertest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/consume"
	"github.com/idemkit/idem/internal/failpoint"
	"github.com/idemkit/idem/internal/testbin"
)

// The child's environment.
const (
	childEnv      = "IDEM_CONSUMERTEST_CHILD" // "1" in the child
	childBroker   = "IDEM_CONSUMERTEST_BROKER"
	childDB       = "IDEM_CONSUMERTEST_DB"
	childGroup    = "IDEM_CONSUMERTEST_GROUP"
	childTopic    = "IDEM_CONSUMERTEST_TOPIC"
	childBatch    = "IDEM_CONSUMERTEST_BATCH"
	childSQL      = "IDEM_CONSUMERTEST_SQL" // the database/sql driver, or empty for pgx
	childFinished = "consumertest-child: handled=%d duplicates=%d\n"
)

// testKillAfterDBCommit, with real processes:
//
//  1. child A handles ev-0..ev-99 and stops gracefully (SIGTERM): all 100
//     are acked;
//  2. ev-100..ev-299 are produced; child B runs with the
//     consumer-db-committed failpoint armed to kill, and dies by SIGKILL
//     right after its first transaction committed, before the ack: the
//     database is ahead of the broker;
//  3. child C handles the rest: the messages B committed come back and are
//     duplicates (the handler does not run for them), every event has
//     exactly one effect, and all 300 are acked after C's graceful stop.
func testKillAfterDBCommit(t *testing.T, h Harness, batch bool, sqlDriver string) {
	w := newWorld(t, h, 3)
	env := []string{
		childEnv + "=1", childBroker + "=" + w.broker.Addr(), childDB + "=" + w.db.URL,
		childGroup + "=" + w.group, childTopic + "=" + w.topic, childBatch + "=" + fmt.Sprint(batch), childSQL + "=" + sqlDriver,
		failpoint.EnvVar + "=",
	}
	w.broker.Produce(t, w.topic, msgs(0, 100, 3)...)

	// 1.
	a := startChild(t, env)
	w.waitEffects(t, 100, 60*time.Second)
	a.term(t)
	if acked := w.broker.Acked(t, w.group, w.topic); acked != 100 {
		t.Fatalf("after A's graceful stop: %d acked, want 100", acked)
	}

	// 2.
	w.broker.Produce(t, w.topic, msgs(100, 300, 3)...)
	b := startChild(t, append(env, failpoint.EnvVar+"="+failpoint.ConsumerDBCommitted+"=kill"))
	if err := b.cmd.Wait(); !killed(err) {
		t.Fatalf("B did not die by SIGKILL: %v\n%s", err, b.out.String())
	}
	if !strings.Contains(b.out.String(), "idem-failpoint: hit "+failpoint.ConsumerDBCommitted+" kill") {
		t.Fatalf("B died, but not at the failpoint:\n%s", b.out.String())
	}
	processed := w.count(t, `SELECT count(*) FROM processed_event`)
	acked := w.broker.Acked(t, w.group, w.topic)
	if acked != 100 || processed <= acked {
		t.Fatalf("after the kill: %d processed_event rows, %d acked; want the database ahead of the broker's 100", processed, acked)
	}

	// 3.
	c := startChild(t, env)
	w.waitEffects(t, 300, 120*time.Second)
	out := c.term(t)
	var handled, dups int
	if _, err := fmt.Sscanf(lastMatch(out, "consumertest-child:"), strings.TrimSuffix(childFinished, "\n"), &handled, &dups); err != nil {
		t.Fatalf("C's output %q: %v", out, err)
	}
	if want := processed - 100; dups < want {
		t.Errorf("C skipped %d duplicates, want at least %d (what B committed and did not ack)", dups, want)
	}
	if handled != 300-processed {
		t.Errorf("C handled %d, want %d", handled, 300-processed)
	}
	w.assertExactlyOnce(t, 300)
	if acked := w.broker.Acked(t, w.group, w.topic); acked != 300 {
		t.Errorf("after C's graceful stop: %d acked, want 300", acked)
	}
}

type child struct {
	cmd *exec.Cmd
	out *testbin.Buffer
}

func startChild(t *testing.T, env []string) *child {
	t.Helper()
	root, _, _ := strings.Cut(t.Name(), "/")
	cmd := exec.Command(os.Args[0], "-test.run=^"+root+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	out := &testbin.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return &child{cmd: cmd, out: out}
}

// term stops the child gracefully and returns its output.
func (c *child) term(t *testing.T) string {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Wait(); err != nil {
		t.Fatalf("child: %v\n%s", err, c.out.String())
	}
	return c.out.String()
}

func killed(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signal() == syscall.SIGKILL
}

func lastMatch(s, prefix string) string {
	var last string
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), prefix) {
			last = strings.TrimSpace(l)
		}
	}
	return last
}

// runChild is the consumer process of testKillAfterDBCommit: it consumes
// until SIGTERM, then stops gracefully and prints what it did.
func runChild(t *testing.T, h Harness) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	defer signal.Stop(sig)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(childDB))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	broker := h.Attach(t, os.Getenv(childBroker))
	var handled, dups atomic.Int64
	d := broker.Driver(t, DriverConfig{Group: os.Getenv(childGroup), Topics: []string{os.Getenv(childTopic)}, DeadLetterTopic: os.Getenv(childTopic) + ".dlq"})
	cfg := &consume.Config{
		ConsumerID: os.Getenv(childGroup), Batch: os.Getenv(childBatch) == "true",
		AckTimeout: 5 * time.Second, Logger: quiet(),
		Hook: func(ctx context.Context, e consume.Event) context.Context {
			switch e.Kind {
			case consume.KindProcessed:
				handled.Add(1)
			case consume.KindDuplicate:
				dups.Add(1)
			}
			return ctx
		},
	}
	var c *consume.Consumer
	if driver := os.Getenv(childSQL); driver != "" {
		sdb, oerr := sql.Open(driver, os.Getenv(childDB))
		if oerr != nil {
			t.Fatal(oerr)
		}
		defer sdb.Close()
		c, err = consume.NewSQL(sdb, d, sqlEffectHandler, cfg)
	} else {
		c, err = consume.New(pool, d, func(ctx context.Context, tx pgx.Tx, m *consume.Message) error {
			return effectHandler(ctx, tx, m)
		}, cfg)
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	<-sig
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := c.Stop(sctx); err != nil {
		t.Fatal(err)
	}
	fmt.Printf(childFinished, handled.Load(), dups.Load())
}
