package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/internal/faultproxy"
	"github.com/idemkit/idem/kafka"
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
		{"devkafka", "--produce-fail-rate", "1.5"},
		{"devkafka", "--produce-fail-rate", "0.1", "--produce-fail-error", "NOT_LEADER_FOR_PARTITION"},
		{"devkafka", "--produce-fail-error", "NO_SUCH_ERROR"},
		{"devkafka", "--advertise", "localhost"},
	} {
		_, stderr, code := runIdem(t, nil, args...)
		if code != 2 || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%v: exit %d, stderr %q; want 2 and one line", args, code, stderr)
		}
	}
}

// --produce-fail-rate with a real client (the relay's producer options:
// acks=all, idempotent): at 1 every partition of every produce fails with
// the chosen error, at 0 none does, at 0.3 about that share of the
// partition-requests fails, often beside partitions of the same request
// that succeed, and exactly the records reported written are on the broker.
func TestDevkafkaProduceFailRate(t *testing.T) {
	t.Parallel()
	const partitions, rounds = 8, 40
	for _, tt := range []struct {
		rate     string
		min, max int // failed partition-requests of partitions*rounds
	}{
		{"1", partitions * rounds, partitions * rounds},
		{"0", 0, 0},
		// 320 draws at 0.3: mean 96, sd 8.2; the bounds are 4 sd away.
		{"0.3", 63, 129},
	} {
		t.Run("rate="+tt.rate, func(t *testing.T) {
			t.Parallel()
			p := startDevkafka(t, "--port", "0", "--topics", "t", "--partitions", fmt.Sprint(partitions),
				"--produce-fail-rate", tt.rate, "--produce-fail-seed", "5", "--produce-fail-error", "MESSAGE_TOO_LARGE")
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cl, err := kgo.NewClient(append(kafka.ProducerOpts(), kgo.SeedBrokers(p.addr),
				kgo.RecordPartitioner(kgo.ManualPartitioner()))...)
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			failed, partial := 0, 0
			written := map[string]bool{}
			for round := range rounds {
				recs := make([]*kgo.Record, partitions)
				for i := range recs {
					recs[i] = &kgo.Record{Topic: "t", Partition: int32(i), Value: []byte(fmt.Sprintf("%d-%d", round, i))}
				}
				n := 0
				for _, res := range cl.ProduceSync(ctx, recs...) {
					switch {
					case res.Err == nil:
						written[string(res.Record.Value)] = true
					case errors.Is(res.Err, kerr.MessageTooLarge):
						n++
					default:
						t.Fatalf("round %d: %s: error %v, want MESSAGE_TOO_LARGE", round, res.Record.Value, res.Err)
					}
				}
				failed += n
				if n > 0 && n < partitions {
					partial++
				}
			}
			t.Logf("rate %s: %d of %d partition-requests failed; %d of %d rounds partly failed", tt.rate, failed, partitions*rounds, partial, rounds)
			if failed < tt.min || failed > tt.max {
				t.Fatalf("%d partition-requests failed, want %d..%d", failed, tt.min, tt.max)
			}
			if tt.rate == "0.3" && partial < rounds/2 {
				t.Errorf("only %d of %d rounds had failed and written partitions side by side", partial, rounds)
			}
			// What the client was told was written is what the broker has.
			got := readAll(ctx, t, p.addr, "t", len(written))
			for v := range got {
				if !written[v] {
					t.Errorf("record %s is on the broker but its produce failed", v)
				}
			}
			if len(got) != len(written) {
				t.Errorf("broker has %d records, the client was told %d were written", len(got), len(written))
			}
		})
	}
}

// readAll reads topic from the start until n distinct values arrived, then
// a little longer, so that an extra record would show.
func readAll(ctx context.Context, t *testing.T, addr, topic string, n int) map[string]bool {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ends, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	ends.Each(func(o kadm.ListedOffset) { total += o.Offset })
	seen := map[string]bool{}
	for read := int64(0); read < total; {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			t.Fatalf("read %d of %d records: %v", read, total, err)
		}
		fs.EachRecord(func(r *kgo.Record) {
			read++
			seen[string(r.Value)] = true
		})
	}
	return seen
}

// --advertise names the proxy in metadata, so that a client seeded with the
// proxy's address stays on it: cutting the proxy's connections then cuts
// every connection the client has.
func TestDevkafkaAdvertise(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	proxy, err := faultproxy.Listen("127.0.0.1:0", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	p := startDevkafka(t, "--port", fmt.Sprint(port), "--topics", "t", "--advertise", proxy.Addr())
	if p.addr != fmt.Sprintf("127.0.0.1:%d", port) {
		t.Fatalf("listening on %s, want the real port %d", p.addr, port)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(proxy.Addr()), kgo.DefaultProduceTopic("t"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("1")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	md, err := kadm.NewClient(cl).BrokerMetadata(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(md.Brokers) != 1 || fmt.Sprintf("%s:%d", md.Brokers[0].Host, md.Brokers[0].Port) != proxy.Addr() {
		t.Fatalf("metadata brokers %+v, want only %s", md.Brokers, proxy.Addr())
	}
	if proxy.Cut() == 0 {
		t.Fatal("the client has no connection through the proxy")
	}
	// The client reconnects through the proxy and goes on.
	if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("2")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if acc, _ := proxy.Stats(); acc < 2 {
		t.Errorf("%d connections through the proxy, want a reconnection after the cut", acc)
	}
}

// --topics on a data directory that already holds state: kfake loads the
// directory and ignores its seed topics, so the flag used to do nothing
// there (topics.json kept what the first start wrote). Each start must
// create the topics it names that are missing and leave the others.
func TestDevkafkaTopicsOnExistingDataDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	port := fmt.Sprint(freePort(t))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	p := startDevkafka(t, "--data-dir", dir, "--port", port, "--partitions", "2", "--topics", "first")
	if err := p.signal(t, syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v, want exit 0", err)
	}
	// The second start names an existing topic and a new one, with another
	// partition count: the new one gets it, the existing one keeps its own.
	p = startDevkafka(t, "--data-dir", dir, "--port", port, "--partitions", "4", "--topics", "first,second")
	cl, err := kgo.NewClient(kgo.SeedBrokers(p.addr))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	topics, err := kadm.NewClient(cl).ListTopics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !topics.Has("first") || !topics.Has("second") {
		t.Fatalf("topics on the existing data dir: %v, want first and second", topics.Names())
	}
	if n := len(topics["first"].Partitions); n != 2 {
		t.Errorf("first has %d partitions, want its own 2", n)
	}
	if n := len(topics["second"].Partitions); n != 4 {
		t.Errorf("second has %d partitions, want 4", n)
	}
	if err := p.signal(t, syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v, want exit 0", err)
	}
}
