package wal_test

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/internal/failpoint"
	"github.com/idemkit/idem/internal/testbin"
	"github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/outbox"
)

// A failpoint SIGKILLs the WAL relay process in one of its crash windows,
// on its first batch; a restarted relay (failpoints off) finishes. Killed
// at relay-mid-claim (decoded, nothing sent) every event reaches Kafka
// once; killed at relay-published (the broker has the first publish call,
// the slot's position is not past it) that call's events come twice.
// Either way nothing is lost and the first copies are in commit order.
func TestFailpointKillThenRestart(t *testing.T) {
	t.Parallel()
	bin := testbin.BuildT(t, "github.com/idemkit/idem/outbox/wal/internal/waltest")
	for _, point := range []string{failpoint.RelayMidClaim, failpoint.RelayPublished} {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			const total = 20
			var want []string
			for i := range total {
				want = append(want, fmt.Sprintf("ev-%02d", i))
			}
			// The slot must exist before the events are written: the first
			// relay creates it, and dies at its first batch.
			p := b.startProc(t, bin, failpoint.EnvVar+"="+point+"=kill")
			p.waitLine(t, "ACQUIRED")
			for i := 0; i < total; i += 5 {
				var ms []outbox.Message
				for j := i; j < i+5; j++ {
					ms = append(ms, msg(fmt.Sprintf("agg-%d", j%4), want[j]))
				}
				b.enqueue(t, ms...)
			}
			exited := make(chan error, 1)
			go func() { exited <- p.cmd.Wait() }()
			var err error
			select {
			case err = <-exited:
			case <-time.After(60 * time.Second):
				t.Fatalf("the relay armed at %s did not die in 60 s:\n%s", point, p.stderr.String())
			}
			ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
			if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
				t.Fatalf("relay did not die by SIGKILL: %v\n%s", err, p.stderr.String())
			}
			if hit := "idem-failpoint: hit " + point + " kill"; !strings.Contains(p.stderr.String(), hit) {
				t.Fatalf("stderr lacks %q:\n%s", hit, p.stderr.String())
			}
			cl := b.kc.Client(t, kgo.ConsumeTopics(b.topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			before := readFor(t, cl, time.Second)
			switch {
			case point == failpoint.RelayMidClaim && len(before) != 0:
				t.Fatalf("%d records in Kafka after a kill before the first publish", len(before))
			case point == failpoint.RelayPublished && len(before) == 0:
				t.Fatal("nothing in Kafka after a kill past the first publish")
			}

			p2 := b.startProc(t, bin)
			p2.waitLine(t, "ACQUIRED")
			seen := map[string]bool{}
			var first []string
			for _, id := range before {
				seen[id] = true
				first = append(first, id)
			}
			dups := 0
			deadline := time.Now().Add(60 * time.Second)
			for len(seen) < total || dups < len(before) {
				if time.Now().After(deadline) {
					t.Fatalf("%d of %d events, %d copies again, after the restart", len(seen), total, dups)
				}
				for _, id := range readFor(t, cl, 200*time.Millisecond) {
					if seen[id] {
						dups++
						continue
					}
					seen[id] = true
					first = append(first, id)
				}
			}
			if more := readFor(t, cl, time.Second); len(more) != 0 {
				t.Fatalf("%d more records after every event and its expected copies: %v", len(more), more)
			}
			for i := range first {
				if first[i] != want[i] {
					t.Fatalf("first deliveries out of commit order at %d: %v", i, first)
				}
			}
			// Each event the dead relay sent comes once more, no other.
			if dups != len(before) {
				t.Fatalf("%d copies again, want %d (what the killed relay sent)", dups, len(before))
			}
		})
	}
}

// readFor returns the event ids cl fetches within d.
func readFor(t *testing.T, cl *kgo.Client, d time.Duration) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var out []string
	for ctx.Err() == nil {
		fs := cl.PollFetches(ctx)
		fs.EachRecord(func(r *kgo.Record) { out = append(out, kafka.RecordEventID(r)) })
	}
	return out
}
