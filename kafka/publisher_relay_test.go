package kafka_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/internal/failpoint"
	"github.com/idemkit/idem/internal/testbin"
	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testkafka"
	"github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/outbox"
)

var pubQuiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func pubEnqueue(t *testing.T, db *testdb.DB, msgs ...outbox.Message) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := outbox.EnqueueTx(ctx, tx, msgs...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
}

func pubMsg(topic, agg string, n int) outbox.Message {
	return outbox.Message{Topic: topic, AggregateType: "order", AggregateID: agg,
		EventID: fmt.Sprintf("%s-%d", agg, n), EventType: "E", Payload: []byte(strconv.Itoa(n))}
}

func pubCount(t *testing.T, db *testdb.DB, where string) int {
	t.Helper()
	var n int
	if err := db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox_event WHERE "+where).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func pubEventually(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond) // polling interval
	}
}

// pubCheckOrder checks that every aggregate's events appear in Kafka in
// sequence order 1..n, counting only each event's first appearance (a
// later copy is an at-least-once duplicate that consumers drop by event
// id), and that the first appearances are exactly want per aggregate.
func pubCheckOrder(t *testing.T, recs []*kgo.Record, want map[string]int) (dups int) {
	t.Helper()
	seen := map[string]bool{}
	next := map[string]int{}
	for _, r := range recs {
		id := pubHeader(r, kafka.HeaderEventID)
		if seen[id] {
			dups++
			continue
		}
		seen[id] = true
		key := string(r.Key)
		seq, _ := strconv.Atoi(pubHeader(r, kafka.HeaderAggregateSeq))
		next[key]++
		if seq != next[key] {
			t.Fatalf("aggregate %s: event %s has seq %d at position %d: reordered or skipped", key, id, seq, next[key])
		}
	}
	for k, n := range want {
		if next[k] != n {
			t.Fatalf("aggregate %s: %d distinct events in Kafka, want %d", k, next[k], n)
		}
	}
	return dups
}

// Four relays on one table, 10,000 events over 100 aggregates enqueued by
// concurrent writers while the relays run: every event reaches Kafka and
// each aggregate's events are in order there.
func TestFourRelaysKeepPerAggregateOrder(t *testing.T) {
	t.Parallel()
	for _, mode := range []outbox.Mode{outbox.AtLeastOnce, outbox.TwoPhase} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			const events, aggregates, writers = 10_000, 100, 8
			db := testdb.New(t, testdb.MaxConns(20))
			c := testkafka.New(t)
			c.CreateTopic(t, "orders", 8)
			ctx := context.Background()
			var relays []*outbox.Relay
			for i := range 4 {
				pub, err := kafka.NewPublisher(c.Client(t, kafka.ProducerOpts()...), nil)
				if err != nil {
					t.Fatal(err)
				}
				r, err := outbox.NewRelay(db.Pool, pub, &outbox.RelayConfig{Mode: mode, BatchSize: 200,
					PollInterval: 20 * time.Millisecond, Owner: fmt.Sprintf("relay-%d", i), Logger: pubQuiet})
				if err != nil {
					t.Fatal(err)
				}
				if err := r.Start(ctx); err != nil {
					t.Fatal(err)
				}
				relays = append(relays, r)
			}
			t.Cleanup(func() {
				for _, r := range relays {
					_ = r.Stop(context.Background())
				}
			})
			var wg sync.WaitGroup
			counter := make([]int, aggregates)
			var mu sync.Mutex
			for w := range writers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(w), 1))
					for range events / writers / 10 {
						msgs := make([]outbox.Message, 10)
						for j := range msgs {
							a := rng.IntN(aggregates)
							mu.Lock()
							counter[a]++
							n := counter[a]
							mu.Unlock()
							// EventID carries the writer's own count only to be
							// unique; order is judged by aggregate-seq.
							msgs[j] = pubMsg("orders", fmt.Sprintf("agg-%03d", a), n)
							msgs[j].EventID = fmt.Sprintf("w%d-%s", w, outbox.NewEventID())
						}
						tx, err := db.Pool.Begin(ctx)
						if err == nil {
							_, err = outbox.EnqueueTx(ctx, tx, msgs...)
							if err == nil {
								err = tx.Commit(ctx)
							} else {
								_ = tx.Rollback(ctx)
							}
						}
						if err != nil {
							t.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			pubEventually(t, "all published", 90*time.Second, func() bool {
				return pubCount(t, db, "status <> 'PUBLISHED'") == 0
			})
			recs := c.ReadAll(t, "orders", events, 30*time.Second)
			want := map[string]int{}
			for a, n := range counter {
				if n > 0 {
					want[fmt.Sprintf("agg-%03d", a)] = n
				}
			}
			if dups := pubCheckOrder(t, recs, want); dups != 0 {
				t.Errorf("%d duplicates without any failure", dups)
			}
		})
	}
}

// slowPublisher holds its first batch until released, then produces.
type pubSlow struct {
	next    outbox.Publisher
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func (p *pubSlow) Publish(ctx context.Context, events []outbox.Event) error {
	first := false
	p.once.Do(func() { first = true })
	if first {
		close(p.entered)
		<-p.release
	}
	return p.next.Publish(ctx, events)
}

// A two-phase lease is reaped during a slow publish; a second relay
// publishes the events and a later one; then the slow produce lands. Kafka
// holds each event's first copy in order and the slow copies as
// duplicates after them — never a reordering of first appearances — and
// the table keeps the new owner's result.
func TestReapedLeaseDuringSlowPublish(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	c := testkafka.New(t)
	c.CreateTopic(t, "orders", 1)
	ctx := context.Background()
	newPub := func() outbox.Publisher {
		p, err := kafka.NewPublisher(c.Client(t), nil)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	slow := &pubSlow{next: newPub(), entered: make(chan struct{}), release: make(chan struct{})}
	cfg := outbox.RelayConfig{Mode: outbox.TwoPhase, DisableNotify: true, BatchTimeout: time.Minute,
		LeaseTTL: 3 * time.Minute, Logger: pubQuiet}
	cfg.Owner = "slow"
	slowRelay, err := outbox.NewRelay(db.Pool, slow, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Owner = "fast"
	fastRelay, err := outbox.NewRelay(db.Pool, newPub(), &cfg)
	if err != nil {
		t.Fatal(err)
	}
	pubEnqueue(t, db, pubMsg("orders", "a", 1), pubMsg("orders", "a", 2))
	done := make(chan error, 1)
	go func() { _, err := slowRelay.RunBatch(ctx); done <- err }()
	<-slow.entered
	// Age the lease past its TTL rather than wait for it.
	if _, err := db.Pool.Exec(ctx, "UPDATE outbox_event SET locked_at = now() - interval '1 hour'"); err != nil {
		t.Fatal(err)
	}
	if n, err := fastRelay.Reap(ctx); err != nil || n != 2 {
		t.Fatalf("reap: %d, %v", n, err)
	}
	if _, err := fastRelay.RunBatch(ctx); err != nil {
		t.Fatal(err)
	}
	pubEnqueue(t, db, pubMsg("orders", "a", 3))
	if _, err := fastRelay.RunBatch(ctx); err != nil {
		t.Fatal(err)
	}
	close(slow.release)
	if err := <-done; err == nil || !strings.Contains(err.Error(), "lease lost") {
		t.Fatalf("slow relay: %v, want lease lost", err)
	}
	recs := c.ReadAll(t, "orders", 5, 10*time.Second)
	if dups := pubCheckOrder(t, recs, map[string]int{"a": 3}); dups != 2 {
		t.Fatalf("%d duplicates, want the slow relay's 2", dups)
	}
	var got []string
	for _, r := range recs {
		got = append(got, pubHeader(r, kafka.HeaderEventID))
	}
	if strings.Join(got, " ") != "a-1 a-2 a-3 a-1 a-2" {
		t.Fatalf("Kafka holds %v", got)
	}
	if n := pubCount(t, db, "status = 'PUBLISHED'"); n != 3 {
		t.Fatalf("%d published rows, want 3", n)
	}
}

// pubRelayProc is a relaytest process.
type pubRelayProc struct {
	cmd    *exec.Cmd
	lines  chan string
	stderr *testbin.Buffer
}

func pubBuildRelay(t *testing.T) string {
	t.Helper()
	return testbin.BuildT(t, "github.com/idemkit/idem/kafka/internal/relaytest")
}

func pubStartRelay(t *testing.T, bin string, args ...string) *pubRelayProc {
	t.Helper()
	return pubStartRelayEnv(t, bin, nil, args...)
}

// pubStartRelayEnv starts relaytest with env added to the test's own.
func pubStartRelayEnv(t *testing.T, bin string, env []string, args ...string) *pubRelayProc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &testbin.Buffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &pubRelayProc{cmd: cmd, lines: make(chan string, 16), stderr: stderr}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("relaytest stderr: %s", stderr.String())
		}
	})
	return p
}

func (p *pubRelayProc) waitLine(t *testing.T, prefix string) string {
	t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				t.Fatalf("relaytest exited before printing %q", prefix)
			}
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-timeout:
			t.Fatalf("relaytest did not print %q", prefix)
		}
	}
}

func (p *pubRelayProc) wait(t *testing.T) int {
	t.Helper()
	for range p.lines { // drain so the process is not blocked on stdout
	}
	err := p.cmd.Wait()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0
}

// SIGTERM lands while a batch is in flight (the held publisher waits for
// the signal itself): the process finishes that batch — produced and
// marked — and exits 0.
func TestSIGTERMMidBatchPublishesAndMarks(t *testing.T) {
	t.Parallel()
	bin := pubBuildRelay(t)
	for _, mode := range []string{"at-least-once", "two-phase"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			c := testkafka.New(t)
			c.CreateTopic(t, "orders", 2)
			var msgs []outbox.Message
			for i := range 50 {
				msgs = append(msgs, pubMsg("orders", fmt.Sprintf("agg-%d", i%5), i/5+1))
			}
			pubEnqueue(t, db, msgs...)
			p := pubStartRelay(t, bin, "-db", db.URL, "-brokers", strings.Join(c.Addrs, ","), "-mode", mode,
				"-hold", "term", "-batch-timeout", "30s", "-lease-ttl", "70s", "-batch-size", "100")
			line := p.waitLine(t, "IN-FLIGHT")
			if line != "IN-FLIGHT 50" {
				t.Fatalf("got %q", line)
			}
			if n := pubCount(t, db, "status = 'PUBLISHED'"); n != 0 {
				t.Fatalf("%d published before the signal", n)
			}
			if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if code := p.wait(t); code != 0 {
				t.Fatalf("exit status %d", code)
			}
			if n := pubCount(t, db, "status = 'PUBLISHED'"); n != 50 {
				t.Fatalf("%d of 50 published after SIGTERM", n)
			}
			recs := c.ReadAll(t, "orders", 50, 10*time.Second)
			want := map[string]int{}
			for i := range 5 {
				want[fmt.Sprintf("agg-%d", i)] = 10
			}
			pubCheckOrder(t, recs, want)
		})
	}
}

// SIGKILL mid-batch in two-phase mode leaves the batch PUBLISHING; a
// restarted relay's reaper returns it after the lease TTL, attempts
// preserved, and publishes it.
func TestSIGKILLTwoPhaseReapedAfterRestart(t *testing.T) {
	t.Parallel()
	bin := pubBuildRelay(t)
	db := testdb.New(t)
	c := testkafka.New(t)
	c.CreateTopic(t, "orders", 2)
	var msgs []outbox.Message
	for i := range 40 {
		msgs = append(msgs, pubMsg("orders", fmt.Sprintf("agg-%d", i%4), i/4+1))
	}
	pubEnqueue(t, db, msgs...)
	brokers := strings.Join(c.Addrs, ",")
	p := pubStartRelay(t, bin, "-db", db.URL, "-brokers", brokers, "-mode", "two-phase",
		"-hold", "forever", "-batch-timeout", "30s", "-lease-ttl", "70s")
	p.waitLine(t, "IN-FLIGHT")
	if n := pubCount(t, db, "status = 'PUBLISHING' AND attempts = 1"); n != 40 {
		t.Fatalf("%d of 40 PUBLISHING under lease", n)
	}
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t); code == 0 {
		t.Fatal("SIGKILLed process exited 0")
	}
	if n := pubCount(t, db, "status = 'PUBLISHING'"); n != 40 {
		t.Fatalf("after SIGKILL %d rows PUBLISHING, want 40", n)
	}
	p2 := pubStartRelay(t, bin, "-db", db.URL, "-brokers", brokers, "-mode", "two-phase",
		"-batch-timeout", "500ms", "-lease-ttl", "2s")
	p2.waitLine(t, "STARTED")
	pubEventually(t, "reaped and published", 60*time.Second, func() bool {
		return pubCount(t, db, "status = 'PUBLISHED'") == 40
	})
	if n := pubCount(t, db, "attempts = 2"); n != 40 {
		t.Fatalf("%d of 40 rows with attempts 2 (one per claim, preserved by the reaper)", n)
	}
	recs := c.ReadAll(t, "orders", 40, 10*time.Second)
	want := map[string]int{}
	for i := range 4 {
		want[fmt.Sprintf("agg-%d", i)] = 10
	}
	pubCheckOrder(t, recs, want)
	if err := p2.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p2.wait(t); code != 0 {
		t.Fatalf("restarted relay exit status %d", code)
	}
}

// A failpoint SIGKILLs the relay process in one of its crash windows, on
// its first batch; a restarted relay (failpoints off) finishes the job.
// Killed at RelayPublished (the broker has the batch, the table does not
// know), the batch is published again: every event twice in Kafka, first
// deliveries still in order, nothing lost. Killed at RelayMidClaim
// (claimed, nothing sent), each event reaches Kafka once. Two-phase rows
// come back through the reaper after the lease TTL; at-least-once rows
// through the rolled-back claim.
func TestFailpointKillThenRestart(t *testing.T) {
	t.Parallel()
	bin := pubBuildRelay(t)
	testCases := []struct {
		point string
		mode  string
		dups  int
	}{
		{failpoint.RelayPublished, "at-least-once", 20},
		{failpoint.RelayPublished, "two-phase", 20},
		{failpoint.RelayMidClaim, "at-least-once", 0},
		{failpoint.RelayMidClaim, "two-phase", 0},
	}
	for _, tt := range testCases {
		t.Run(tt.point+"/"+tt.mode, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			c := testkafka.New(t)
			c.CreateTopic(t, "orders", 2)
			var msgs []outbox.Message
			for i := range 20 {
				msgs = append(msgs, pubMsg("orders", fmt.Sprintf("agg-%d", i%4), i/4+1))
			}
			pubEnqueue(t, db, msgs...)
			args := []string{"-db", db.URL, "-brokers", strings.Join(c.Addrs, ","), "-mode", tt.mode,
				"-batch-timeout", "500ms", "-lease-ttl", "2s"}
			p := pubStartRelayEnv(t, bin, []string{failpoint.EnvVar + "=" + tt.point + "=kill"}, args...)
			p.wait(t)
			if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
				t.Fatalf("relay did not die by SIGKILL: %v\n%s", p.cmd.ProcessState, p.stderr.String())
			}
			if want := "idem-failpoint: hit " + tt.point + " kill"; !strings.Contains(p.stderr.String(), want) {
				t.Fatalf("stderr lacks %q:\n%s", want, p.stderr.String())
			}
			if n := pubCount(t, db, "status = 'PUBLISHED'"); n != 0 {
				t.Fatalf("%d rows PUBLISHED after a kill before the mark", n)
			}
			// The restarted relay gets a roomy batch: on a loaded machine a
			// 500 ms batch can run out of time after the broker took the
			// events and before the mark commits, and republish them (an
			// at-least-once duplicate, not the window under test). A lease
			// younger than 10 s is not reaped, so the two-phase rows come
			// back 10 s after the first relay's claim.
			args2 := append(args[:len(args)-4:len(args)-4], "-batch-timeout", "4s", "-lease-ttl", "10s")
			p2 := pubStartRelay(t, bin, args2...)
			p2.waitLine(t, "STARTED")
			pubEventually(t, "all published after the restart", 60*time.Second, func() bool {
				return pubCount(t, db, "status = 'PUBLISHED'") == 20
			})
			if err := p2.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if code := p2.wait(t); code != 0 {
				t.Fatalf("restarted relay exit status %d", code)
			}
			recs := c.ReadAll(t, "orders", 20+tt.dups, 10*time.Second)
			want := map[string]int{}
			for i := range 4 {
				want[fmt.Sprintf("agg-%d", i)] = 5
			}
			if dups := pubCheckOrder(t, recs, want); dups != tt.dups {
				t.Fatalf("%d duplicates in Kafka, want %d", dups, tt.dups)
			}
			if more, _ := c.Read("orders", 20+tt.dups+1, time.Second); len(more) != 20+tt.dups {
				t.Fatalf("%d records in Kafka, want %d", len(more), 20+tt.dups)
			}
		})
	}
}

// The retention purge is SIGKILLed between two of its statements
// (failpoint purge-mid-batch): the first statement's rows are gone, the
// rest stay, and the restarted relay deletes them. A partial purge is a
// smaller purge; rows that are not PUBLISHED and old are never touched.
func TestFailpointKillMidPurge(t *testing.T) {
	t.Parallel()
	bin := pubBuildRelay(t)
	db := testdb.New(t)
	c := testkafka.New(t)
	c.CreateTopic(t, "orders", 1)
	var msgs []outbox.Message
	for i := range 5 {
		msgs = append(msgs, pubMsg("orders", fmt.Sprintf("old-%d", i), 1))
	}
	pubEnqueue(t, db, append(msgs, pubMsg("orders", "dead", 1))...)
	if _, err := db.Pool.Exec(context.Background(), `UPDATE outbox_event
		SET status = CASE WHEN aggregate_id = 'dead' THEN 'DEAD' ELSE 'PUBLISHED' END,
		    published_at = CASE WHEN aggregate_id = 'dead' THEN NULL ELSE now() - interval '1 hour' END`); err != nil {
		t.Fatal(err)
	}
	args := []string{"-db", db.URL, "-brokers", strings.Join(c.Addrs, ","), "-retention", "1m", "-purge-batch-size", "2"}
	p := pubStartRelayEnv(t, bin, []string{failpoint.EnvVar + "=" + failpoint.PurgeMidBatch + "=kill"}, args...)
	p.wait(t)
	if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("relay did not die by SIGKILL: %v\n%s", p.cmd.ProcessState, p.stderr.String())
	}
	if n := pubCount(t, db, "status = 'PUBLISHED'"); n != 3 {
		t.Fatalf("%d old PUBLISHED rows left after a kill after the first purge statement, want 3", n)
	}
	p2 := pubStartRelay(t, bin, args...)
	p2.waitLine(t, "STARTED")
	pubEventually(t, "the purge finished by the restarted relay", 30*time.Second, func() bool {
		return pubCount(t, db, "status = 'PUBLISHED'") == 0
	})
	if err := p2.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p2.wait(t); code != 0 {
		t.Fatalf("restarted relay exit status %d", code)
	}
	if n := pubCount(t, db, "true"); n != 1 || pubCount(t, db, "status = 'DEAD'") != 1 {
		t.Fatalf("%d rows left, want only the DEAD one", n)
	}
}
