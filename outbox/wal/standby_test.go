package wal_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/internal/testbin"
	"github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/outbox"
)

// relayProc is a waltest process.
type relayProc struct {
	cmd    *exec.Cmd
	lines  chan string
	stderr *testbin.Buffer
}

func (b *bundle) startProc(t *testing.T, bin string, env ...string) *relayProc {
	t.Helper()
	cmd := exec.Command(bin, "-brokers", strings.Join(b.kc.Addrs, ","), "-slot", b.slot, "-publication", b.pub, "-prefix", b.prefix, "-publish-delay", "20ms")
	cmd.Env = append(append(os.Environ(), "WALTEST_DB="+b.db.URL), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &relayProc{cmd: cmd, lines: make(chan string, 16), stderr: &testbin.Buffer{}}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
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
			t.Logf("waltest stderr: %s", p.stderr.String())
		}
	})
	return p
}

func (p *relayProc) waitLine(t *testing.T, want string) {
	t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				t.Fatalf("waltest exited before %q: %v\n%s", want, p.cmd.Wait(), p.stderr.String())
			}
			if l == want {
				return
			}
		case <-timeout:
			t.Fatalf("waltest did not print %q", want)
		}
	}
}

// waitAcquired returns the first of procs to take the slot.
func waitAcquired(t *testing.T, procs ...*relayProc) *relayProc {
	t.Helper()
	got := make(chan *relayProc, len(procs))
	done := make(chan struct{})
	defer close(done)
	for _, p := range procs {
		go func() {
			for {
				select {
				case l, ok := <-p.lines:
					if !ok {
						return
					}
					if l == "ACQUIRED" {
						got <- p
						return
					}
				case <-done:
					return
				}
			}
		}()
	}
	select {
	case p := <-got:
		return p
	case <-time.After(60 * time.Second):
		t.Fatal("no standby took the slot over")
	}
	return nil
}

func (p *relayProc) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = p.cmd.Wait()
}

// TestStandbyTakesOverAfterSIGKILL: three relay processes share a slot;
// one reads it, the others wait. Under a steady stream of transactions
// and a slow broker (so that events read and not yet delivered pile up
// in the reader) the reader is SIGKILLed, then its successor: each time a standby takes
// the slot over. Every event reaches Kafka, the first copies in commit
// order; the copies sent again after a kill are counted.
func TestStandbyTakesOverAfterSIGKILL(t *testing.T) {
	t.Parallel()
	b := setup(t)
	bin := testbin.BuildT(t, "github.com/idemkit/idem/outbox/wal/internal/waltest")
	a := b.startProc(t, bin)
	a.waitLine(t, "ACQUIRED")
	s1 := b.startProc(t, bin)
	s1.waitLine(t, "BUSY")
	s2 := b.startProc(t, bin)
	s2.waitLine(t, "BUSY")

	// One writer commits the events in a known order, 1 to 3 per
	// transaction, over 16 aggregates. It pauses at 40% until the first
	// kill and at 70% until the second, so that each kill lands with
	// events committed and not yet delivered, and writing goes on while a
	// standby takes over.
	const total = 3000
	var want []string
	for i := range total {
		want = append(want, fmt.Sprintf("ev-%05d", i))
	}
	ctx := context.Background()
	killed1, killed2 := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < total; {
			switch {
			case i >= total*7/10:
				<-killed2
			case i >= total*4/10:
				<-killed1
			}
			n := min(1+i%3, total-i)
			var msgs []outbox.Message
			for j := i; j < i+n; j++ {
				msgs = append(msgs, msg(fmt.Sprintf("agg-%d", j%16), want[j]))
			}
			err := pgx.BeginFunc(ctx, b.db.Pool, func(tx pgx.Tx) error {
				_, err := b.enq.EnqueueTx(ctx, tx, msgs...)
				return err
			})
			if err != nil {
				t.Error(err)
				return
			}
			i += n
		}
	}()
	defer wg.Wait()
	defer func() { // a failed test must not leave the writer waiting
		select {
		case <-killed1:
		default:
			close(killed1)
		}
		select {
		case <-killed2:
		default:
			close(killed2)
		}
	}()

	cl := b.kc.Client(t, kgo.ConsumeTopics(b.topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	var got []string
	seen := map[string]bool{}
	dups := 0
	readUntil := func(distinct int) {
		t.Helper()
		rctx, cancel := context.WithTimeout(ctx, 120*time.Second)
		defer cancel()
		for len(seen) < distinct {
			fs := cl.PollFetches(rctx)
			if rctx.Err() != nil {
				t.Fatalf("%d distinct events delivered, want %d", len(seen), distinct)
			}
			fs.EachRecord(func(r *kgo.Record) {
				id := kafka.RecordEventID(r)
				if seen[id] {
					dups++
					return
				}
				seen[id] = true
				got = append(got, id)
			})
		}
	}
	readUntil(total * 3 / 10)
	a.kill(t)
	close(killed1)
	next := waitAcquired(t, s1, s2)
	last := s1
	if next == s1 {
		last = s2
	}
	readUntil(total * 6 / 10)
	next.kill(t)
	close(killed2)
	waitAcquired(t, last)
	readUntil(total)

	if len(got) != total {
		t.Fatalf("%d distinct events, want %d", len(got), total)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("first deliveries out of commit order at %d: %s, want %s", i, got[i], want[i])
		}
	}
	t.Logf("%d events, %d copies sent again after 2 SIGKILLs", total, dups)
}
