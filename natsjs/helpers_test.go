package natsjs_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem/natsjs"
)

func quiet() *slog.Logger {
	if os.Getenv("NATSJS_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// natsURL is the JetStream server the tests use: NATS_URL, else the local
// one (.ci/run starts it).
func natsURL() string {
	if u := os.Getenv("NATS_URL"); u != "" {
		return u
	}
	return "nats://127.0.0.1:4222"
}

// server is one test's namespace on the shared server: every stream it
// creates is under its prefix, and deleted when the test ends.
type server struct {
	url    string
	prefix string
	nc     *nats.Conn
	js     jetstream.JetStream
}

func newPrefix() string {
	var b [5]byte
	_, _ = rand.Read(b[:])
	return "t" + hex.EncodeToString(b[:])
}

func attach(t testing.TB, url, prefix string, cleanup bool) *server {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatalf("connect %s: %v (is nats-server -js running? .ci/run starts one)", url, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s := &server{url: url, prefix: prefix, nc: nc, js: js}
	t.Cleanup(func() {
		if cleanup {
			s.deleteStreams(t)
		}
		nc.Close()
	})
	return s
}

func newServer(t testing.TB) *server { return attach(t, natsURL(), newPrefix(), true) }

func (s *server) deleteStreams(t testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	names := s.js.StreamNames(ctx)
	var mine []string
	for n := range names.Name() {
		if strings.HasPrefix(n, s.prefix+"_") {
			mine = append(mine, n)
		}
	}
	for _, n := range mine {
		if err := s.js.DeleteStream(ctx, n); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Errorf("delete stream %s: %v", n, err)
		}
	}
}

// createTopic creates topic's stream (natsjs.StreamConfig under the
// prefix), with a message size limit if maxMsgSize > 0.
func (s *server) createTopic(t testing.TB, topic string, maxMsgSize int32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := natsjs.StreamConfig(natsjs.WithPrefix(s.prefix, topic))
	cfg.MaxMsgSize = maxMsgSize
	cfg.Storage = jetstream.MemoryStorage
	if _, err := s.js.CreateStream(ctx, cfg); err != nil {
		t.Fatalf("create stream for %s: %v", topic, err)
	}
}

func (s *server) stream(topic string) string {
	return natsjs.StreamName(natsjs.WithPrefix(s.prefix, topic))
}

// readAll returns every message of topic's stream, in stream order (none
// if the stream does not exist).
func (s *server) readAll(ctx context.Context, topic string) ([]*jetstream.RawStreamMsg, error) {
	st, err := s.js.Stream(ctx, s.stream(topic))
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return nil, err
	}
	var out []*jetstream.RawStreamMsg
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := st.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}

// aggregateID decodes the aggregate id of a message on topic.
func (s *server) aggregateID(topic, subject string) string {
	rest, _ := strings.CutPrefix(subject, natsjs.WithPrefix(s.prefix, topic)+".")
	_, tok, _ := strings.Cut(rest, ".")
	id, _ := natsjs.ParseToken(tok)
	return id
}
