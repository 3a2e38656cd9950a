package chaos

import (
	"context"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// The supervisor against a real process: devkafka is started, produced to,
// SIGKILLed, restarted on the same port and data directory (the records
// are still there), then SIGTERMed (exit 0).
func TestProcRestartsARealProcess(t *testing.T) {
	t.Parallel()
	bin := needIdem(t)
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	dir := t.TempDir()
	p, err := newProc("devkafka", bin, []string{"devkafka", "--data-dir", dir + "/kafka", "--port", strconv.Itoa(port)},
		nil, addr, dir, tcpReady(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer p.close(10 * time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if p.isUp() {
		t.Fatal("up before start")
	}
	if err := p.start(ctx); err != nil {
		t.Fatal(err)
	}
	if !p.isUp() {
		t.Fatal("not up after start")
	}
	if err := p.start(ctx); err == nil {
		t.Fatal("second start of a running process accepted")
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.DefaultProduceTopic("t"), kgo.AllowAutoTopicCreation())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for i := range 10 {
		if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte(strconv.Itoa(i))}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	code, forced := p.stop(syscall.SIGKILL, 10*time.Second)
	if code != -1 || forced || p.isUp() {
		t.Fatalf("SIGKILL: exit %d forced %v up %v; want -1 (signalled), false, false", code, forced, p.isUp())
	}
	if err := p.start(ctx); err != nil {
		t.Fatal(err)
	}
	cons, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics("t"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	n := 0
	for n < 10 {
		fs := cons.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of 10 records after the restart", n)
		}
		n += fs.NumRecords()
	}
	code, forced = p.stop(syscall.SIGTERM, 20*time.Second)
	if code != 0 || forced {
		t.Fatalf("SIGTERM: exit %d forced %v, want 0 false", code, forced)
	}
	if p.starts != 2 {
		t.Fatalf("starts %d, want 2", p.starts)
	}
}

// A process that exits during start is reported at once, with its log.
func TestProcExitDuringStart(t *testing.T) {
	t.Parallel()
	bin := needIdem(t)
	dir := t.TempDir()
	p, err := newProc("bad", bin, []string{"devkafka", "--port", "-5"}, nil, "127.0.0.1:1", dir, tcpReady("127.0.0.1:1"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.close(time.Second)
	if err := p.start(context.Background()); err == nil || p.isUp() {
		t.Fatalf("start of a failing process: %v, up %v", err, p.isUp())
	}
}
