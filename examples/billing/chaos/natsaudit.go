package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/examples/billing/consumer"
	"github.com/idemkit/idem/examples/billing/usecase"
	"github.com/idemkit/idem/natsjs"
)

// Brokers of Config.Broker (billing chaos --broker).
const (
	// BrokerKafka: a devkafka child (or KafkaBrokers). The default.
	BrokerKafka = "kafka"
	// BrokerNATS: a nats-server -js child with a store directory, which
	// BrokerRestarts restarts; billing runs with BROKER=nats.
	BrokerNATS = "nats"
)

// ErrNoNATSServer means Broker is BrokerNATS and no nats-server binary
// was found.
var ErrNoNATSServer = errors.New("chaos: --broker nats needs nats-server (Debian package nats-server) on PATH, or Config.NATSServerBin")

// startNATS starts the nats-server child with JetStream and a store
// directory in the work directory, so that its streams survive its
// restarts, and returns its URL.
func (r *run) startNATS(ctx context.Context) (string, error) {
	bin := r.cfg.NATSServerBin
	if bin == "" {
		p, err := exec.LookPath("nats-server")
		if err != nil {
			return "", ErrNoNATSServer
		}
		bin = p
	}
	port, err := freePort()
	if err != nil {
		return "", err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	args := []string{"-js", "-sd", filepath.Join(r.cfg.WorkDir, "nats"), "-a", "127.0.0.1", "-p", strconv.Itoa(port)}
	url := "nats://" + addr
	if r.broker, err = newProc("nats-server", bin, args, []string{disarmed}, addr, r.logDir, natsReady(url)); err != nil {
		return "", err
	}
	r.progress.logf("starting nats-server -js on %s", addr)
	if err := r.broker.start(ctx); err != nil {
		return "", err
	}
	return url, nil
}

// natsReady answers once JetStream answers on url (the TCP port opens
// before JetStream has recovered its streams).
func natsReady(url string) func(context.Context) bool {
	return func(ctx context.Context) bool {
		nc, js, err := natsConnect(url)
		if err != nil {
			return false
		}
		defer nc.Close()
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err = js.AccountInfo(ctx)
		return err == nil
	}
}

func natsConnect(url string) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(url, nats.Timeout(2*time.Second), nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond))
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// natsLag is consumerLag on NATS: which of billing's durable consumers
// has messages not yet delivered or delivered and not acknowledged ("" when
// none). A durable that does not exist yet lags by its whole stream.
func natsLag(ctx context.Context, url string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	nc, js, err := natsConnect(url)
	if err != nil {
		return "", err
	}
	defer nc.Close()
	groups := []struct{ group, topic string }{
		{consumer.OrderGroup, usecase.TopicOrderEvents},
		{consumer.ChargeGroupDefault, usecase.TopicBillingCommands},
	}
	var lagging []string
	for _, g := range groups {
		st, err := js.Stream(ctx, natsjs.StreamName(g.topic))
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue // billing has not created it: nothing published yet
		}
		if err != nil {
			return "", err
		}
		ci, err := st.Consumer(ctx, g.group)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			info, err := st.Info(ctx)
			if err != nil {
				return "", err
			}
			if info.State.Msgs > 0 {
				lagging = append(lagging, fmt.Sprintf("%s not bound yet, %d messages on %s", g.group, info.State.Msgs, g.topic))
			}
			continue
		}
		if err != nil {
			return "", err
		}
		info, err := ci.Info(ctx)
		if err != nil {
			return "", err
		}
		if n := info.NumPending + uint64(info.NumAckPending); n > 0 {
			lagging = append(lagging, fmt.Sprintf("%s %d behind on %s (%d unacknowledged)", g.group, n, g.topic, info.NumAckPending))
		}
	}
	return strings.Join(lagging, ", "), nil
}

// readStreams is readTopics on NATS: every message of each topic's
// stream, as a wireRecord (Partition 0, Offset the stream sequence,
// Timestamp the time the server stored it, the aggregate id from the
// subject's last token). checkKafka then applies the same audit: every
// outbox event on its topic at least once, and the first copies of each
// aggregate's events in sequence order, a stream's sequence being its
// order.
func readStreams(ctx context.Context, url string, topics []string) ([]wireRecord, error) {
	if len(topics) == 0 {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	nc, js, err := natsConnect(url)
	if err != nil {
		return nil, fmt.Errorf("chaos: nats audit: %w", err)
	}
	defer nc.Close()
	var out []wireRecord
	for _, topic := range topics {
		st, err := js.Stream(ctx, natsjs.StreamName(topic))
		if err != nil {
			return nil, fmt.Errorf("chaos: nats audit: stream of %s: %w", topic, err)
		}
		info, err := st.Info(ctx)
		if err != nil {
			return nil, fmt.Errorf("chaos: nats audit: stream of %s: %w", topic, err)
		}
		for seq := info.State.FirstSeq; seq > 0 && seq <= info.State.LastSeq; seq++ {
			m, err := st.GetMsg(ctx, seq)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				continue // deleted: nothing deletes here, but a gap is no copy
			}
			if err != nil {
				return nil, fmt.Errorf("chaos: nats audit: %s #%d: %w", topic, seq, err)
			}
			w, ok := natsRecord(m)
			if ok {
				out = append(out, w)
			}
		}
	}
	return out, nil
}

// natsRecord reads one stored message as a wireRecord; ok is false for a
// message without an event id.
func natsRecord(m *jetstream.RawStreamMsg) (wireRecord, bool) {
	id := m.Header.Get(idem.HeaderEventID)
	if id == "" {
		return wireRecord{}, false
	}
	w := wireRecord{EventID: id, Offset: int64(m.Sequence), Timestamp: m.Time,
		AggregateType: m.Header.Get(idem.HeaderAggregateType)}
	w.Seq, _ = strconv.ParseInt(m.Header.Get(idem.HeaderAggregateSeq), 10, 64)
	// topic.<aggregate type>.<aggregate id>: the topic is what the last two
	// tokens leave.
	toks := strings.Split(m.Subject, ".")
	if len(toks) >= 3 {
		w.Topic = strings.Join(toks[:len(toks)-2], ".")
		if aid, err := natsjs.ParseToken(toks[len(toks)-1]); err == nil {
			w.AggregateID = aid
		} else {
			w.AggregateID = toks[len(toks)-1]
		}
	}
	return w, true
}

// brokerName is Report.Broker: the broker, and on Kafka billing's client
// (KAFKA_CLIENT from Env, else the harness's own environment).
func (c *Config) brokerName() string {
	if c.Broker == BrokerNATS {
		return BrokerNATS
	}
	client := os.Getenv("KAFKA_CLIENT")
	for _, kv := range c.Env {
		if v, ok := strings.CutPrefix(kv, "KAFKA_CLIENT="); ok {
			client = v
		}
	}
	if client == "" {
		client = "franz"
	}
	return BrokerKafka + "/" + client
}
