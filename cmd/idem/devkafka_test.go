package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// devkafkaProc is a running `idem devkafka`.
type devkafkaProc struct {
	cmd    *exec.Cmd
	addr   string
	exited chan error
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startDevkafka starts the broker and waits for its "listening on" line.
func startDevkafka(t *testing.T, args ...string) *devkafkaProc {
	t.Helper()
	cmd := exec.Command(idemBin, append([]string{"devkafka"}, args...)...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &devkafkaProc{cmd: cmd, exited: make(chan error, 1)}
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "listening on "); ok {
				select {
				case line <- a:
				default:
				}
			}
		}
		p.exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.exited
	})
	select {
	case p.addr = <-line:
	case err := <-p.exited:
		p.exited <- err
		t.Fatalf("devkafka exited before listening: %v: %s", err, stderr.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("devkafka did not print its address: %s", stderr.String())
	}
	return p
}

func (p *devkafkaProc) signal(t *testing.T, sig syscall.Signal) error {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.exited:
		p.exited <- err
		return err
	case <-time.After(30 * time.Second):
		t.Fatalf("devkafka did not exit on %v", sig)
		return nil
	}
}

func TestDevkafkaSurvivesRestarts(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	port := fmt.Sprint(freePort(t))
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	p := startDevkafka(t, "--data-dir", dir, "--port", port, "--partitions", "2", "--topics", "pre")
	if p.addr != "127.0.0.1:"+port {
		t.Fatalf("address %q, want 127.0.0.1:%s", p.addr, port)
	}
	const total, consumed = 60, 25
	func() {
		cl, err := kgo.NewClient(kgo.SeedBrokers(p.addr), kgo.RequiredAcks(kgo.AllISRAcks()),
			kgo.DefaultProduceTopic("events"), kgo.AllowAutoTopicCreation())
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		for i := range total {
			r := &kgo.Record{Key: []byte(fmt.Sprint(i % 7)), Value: []byte(fmt.Sprint(i))}
			if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
				t.Fatalf("produce %d: %v", i, err)
			}
		}
		// Commit offsets for part of the records in a consumer group.
		cons, err := kgo.NewClient(kgo.SeedBrokers(p.addr), kgo.ConsumeTopics("events"),
			kgo.ConsumerGroup("g1"), kgo.DisableAutoCommit(),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		if err != nil {
			t.Fatal(err)
		}
		defer cons.Close()
		got := 0
		for got < consumed {
			fs := cons.PollRecords(ctx, consumed-got)
			if err := ctx.Err(); err != nil {
				t.Fatal(err)
			}
			for _, r := range fs.Records() {
				if err := cons.CommitRecords(ctx, r); err != nil {
					t.Fatal(err)
				}
				got++
			}
		}
	}()

	// SIGKILL: no chance to flush anything beyond what was written.
	if err := p.signal(t, syscall.SIGKILL); err == nil {
		t.Fatal("SIGKILL: exit status 0, want killed")
	}
	p = startDevkafka(t, "--data-dir", dir, "--port", port)
	checkState(ctx, t, p.addr, total, consumed)

	// SIGTERM: graceful stop, exit 0, and the state is still there.
	if err := p.signal(t, syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v, want exit 0", err)
	}
	p = startDevkafka(t, "--data-dir", dir, "--port", port)
	checkState(ctx, t, p.addr, total, consumed)
	if err := p.signal(t, syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v, want exit 0", err)
	}
}

// checkState asserts that the topics, records and group offsets written
// before the restart are all there.
func checkState(ctx context.Context, t *testing.T, addr string, total, consumed int) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	topics, err := adm.ListTopics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !topics.Has("pre") || !topics.Has("events") {
		t.Fatalf("topics after restart: %v", topics.Names())
	}
	ends, err := adm.ListEndOffsets(ctx, "events")
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	ends.Each(func(o kadm.ListedOffset) { n += o.Offset })
	if n != int64(total) {
		t.Fatalf("records after restart: %d, want %d", n, total)
	}
	offs, err := adm.FetchOffsets(ctx, "g1")
	if err != nil {
		t.Fatal(err)
	}
	var committed int64
	offs.Each(func(o kadm.OffsetResponse) { committed += o.At })
	if committed != int64(consumed) {
		t.Fatalf("group g1 committed %d after restart, want %d", committed, consumed)
	}
	// The records themselves are readable, in order per key.
	cons, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics("events"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	seen := map[string]bool{}
	for len(seen) < total {
		fs := cons.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read back %d of %d records: %v", len(seen), total, err)
		}
		fs.EachRecord(func(r *kgo.Record) { seen[string(r.Value)] = true })
	}
}

func TestDevkafkaBadFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"devkafka", "--port", "70000"},
		{"devkafka", "--partitions", "0"},
		{"devkafka", "extra"},
	} {
		_, stderr, code := runIdem(t, nil, args...)
		if code != 2 || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%v: exit %d, stderr %q; want 2 and one line", args, code, stderr)
		}
	}
}
