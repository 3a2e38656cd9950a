package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testkafka"
	"github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/outbox"
)

// twoBrokerTopic starts a two-broker kfake cluster with topic "orders" of
// two partitions led by different brokers, and returns it with perPart
// aggregate ids hashing to each partition (found with a probe topic of the
// same partition count: the key-hash partitioner depends only on the key
// and the count).
func twoBrokerTopic(t *testing.T, perPart int) (c *testkafka.Cluster, keys [2][]string) {
	t.Helper()
	c = testkafka.New(t, kfake.NumBrokers(2))
	c.CreateTopic(t, "orders", 2)
	c.CreateTopic(t, "probe", 2)
	if l0, l1 := c.LeaderFor("orders", 0), c.LeaderFor("orders", 1); l0 == l1 {
		other := int32(0)
		if l0 == 0 {
			other = 1
		}
		if err := c.MoveTopicPartition("orders", 1, other); err != nil {
			t.Fatal(err)
		}
	}
	if c.LeaderFor("orders", 0) == c.LeaderFor("orders", 1) {
		t.Fatal("setup: both partitions on one broker")
	}
	cl := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := 0; len(keys[0]) < perPart || len(keys[1]) < perPart; i++ {
		if i == 1000 {
			t.Fatal("setup: not enough keys for each partition")
		}
		key := fmt.Sprintf("agg%d", i)
		res := cl.ProduceSync(ctx, &kgo.Record{Topic: "probe", Key: []byte(key)})
		if err := res.FirstErr(); err != nil {
			t.Fatal(err)
		}
		if p := res[0].Record.Partition; len(keys[p]) < perPart {
			keys[p] = append(keys[p], key)
		}
	}
	return c, keys
}

// failProduceOn makes broker node answer every Produce request with code
// for each partition the request carries, for as long as the cluster runs.
func failProduceOn(c *testkafka.Cluster, node int32, code int16) {
	c.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if c.CurrentNode() != node {
			return nil, nil, false
		}
		pr := req.(*kmsg.ProduceRequest)
		resp := pr.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range pr.Topics {
			st := kmsg.NewProduceResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewProduceResponseTopicPartition()
				sp.Partition, sp.ErrorCode = rp.Partition, code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
}

type rowState struct {
	status   string
	attempts int
	lastErr  string
}

func pubRows(t *testing.T, db *testdb.DB) map[string]rowState {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), "SELECT event_id, status, attempts, coalesce(last_error, '') FROM outbox_event")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]rowState{}
	for rows.Next() {
		var id string
		var s rowState
		if err := rows.Scan(&id, &s.status, &s.attempts, &s.lastErr); err != nil {
			t.Fatal(err)
		}
		out[id] = s
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// The broker leading one partition answers every Produce with
// MESSAGE_TOO_LARGE (a non-retriable error); the batch interleaves
// aggregates of both partitions (a0 b0 a1 b1 by id, a on partition 0, b
// on partition 1). Every event marked PUBLISHED must be in Kafka, and
// every failed one must stay unpublished, the first of each aggregate
// with its attempt counted. Mapping ProduceSync's results by position
// (franz-go appends them in completion order, grouped by partition)
// marked failed events PUBLISHED: lost.
func TestRelayPartialProduceFailureLosesNothing(t *testing.T) {
	t.Parallel()
	for _, mode := range []outbox.Mode{outbox.AtLeastOnce, outbox.TwoPhase} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			c, keys := twoBrokerTopic(t, 2)
			db := testdb.New(t)
			failProduceOn(c, c.LeaderFor("orders", 1), kerr.MessageTooLarge.Code)
			healthy := map[string]bool{keys[0][0]: true, keys[0][1]: true}
			for _, k := range []string{keys[0][0], keys[1][0], keys[0][1], keys[1][1]} {
				pubEnqueue(t, db, pubMsg("orders", k, 1), pubMsg("orders", k, 2))
			}
			pub, err := kafka.NewPublisher(c.Client(t, kafka.ProducerOpts()...), nil)
			if err != nil {
				t.Fatal(err)
			}
			r, err := outbox.NewRelay(db.Pool, pub, &outbox.RelayConfig{Mode: mode, DisableNotify: true,
				BatchTimeout: 20 * time.Second, BackoffMin: time.Hour, BackoffMax: time.Hour, Logger: pubQuiet})
			if err != nil {
				t.Fatal(err)
			}
			if n, err := r.RunBatch(context.Background()); n != 8 || err == nil {
				t.Fatalf("RunBatch = %d, %v; want 8 events and the partial failure", n, err)
			}
			recs := c.ReadAll(t, "orders", 4, 10*time.Second)
			inKafka := map[string]bool{}
			for _, rec := range recs {
				inKafka[pubHeader(rec, kafka.HeaderEventID)] = true
			}
			for id, s := range pubRows(t, db) {
				agg, seq, _ := strings.Cut(id, "-")
				switch {
				case healthy[agg]:
					if s.status != "PUBLISHED" || !inKafka[id] {
						t.Errorf("%s (healthy partition): %s, in Kafka %v; want PUBLISHED and delivered", id, s.status, inKafka[id])
					}
				case s.status == "PUBLISHED" || inKafka[id]:
					t.Errorf("%s (failing partition): %s, in Kafka %v; want neither (a PUBLISHED row missing from Kafka is lost)", id, s.status, inKafka[id])
				case seq == "1" && (s.attempts != 1 || !strings.Contains(s.lastErr, "MESSAGE_TOO_LARGE")):
					t.Errorf("%s: attempts %d last_error %q; want 1 and the broker's error", id, s.attempts, s.lastErr)
				}
			}
			if more, _ := c.Read("orders", 5, 2*time.Second); len(more) != 4 {
				t.Fatalf("%d records in Kafka, want the healthy partition's 4", len(more))
			}
		})
	}
}

// A broker that never succeeds (its Produce answers NOT_ENOUGH_REPLICAS,
// a retriable error, forever) must not hold a batch past its deadline.
// franz-go retries such a record without end and honours the record's
// context only between retries, whose backoff grows to seconds; a batch
// that waits for it overruns BatchTimeout, its mark then fails on the
// expired context, and the attempt goes uncounted (at-least-once: the
// transaction rolls back) or the lease stays until the reaper takes it
// (two-phase). Here a second relay reaps every 20ms with LeaseTTL just over
// 2 × BatchTimeout: the batch must end by its deadline, record its own
// failed attempt, and never lose its lease. (On the old code a 2s batch
// took about 5s.)
func TestRelayBatchEndsByDeadlineAgainstStuckBroker(t *testing.T) {
	t.Parallel()
	for _, mode := range []outbox.Mode{outbox.AtLeastOnce, outbox.TwoPhase} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			c := testkafka.New(t)
			c.CreateTopic(t, "orders", 1)
			failProduceOn(c, c.LeaderFor("orders", 0), kerr.NotEnoughReplicas.Code)
			db := testdb.New(t)
			pubEnqueue(t, db, pubMsg("orders", "a", 1), pubMsg("orders", "b", 1))
			pub, err := kafka.NewPublisher(c.Client(t, kafka.ProducerOpts()...), nil)
			if err != nil {
				t.Fatal(err)
			}
			const batchTimeout = 2 * time.Second
			cfg := outbox.RelayConfig{Mode: mode, DisableNotify: true, BatchTimeout: batchTimeout,
				LeaseTTL: 2*batchTimeout + 100*time.Millisecond, BackoffMin: time.Hour, BackoffMax: time.Hour, Logger: pubQuiet}
			r, err := outbox.NewRelay(db.Pool, pub, &cfg)
			if err != nil {
				t.Fatal(err)
			}
			cfg.Owner = "reaper"
			reaper, err := outbox.NewRelay(db.Pool, pub, &cfg)
			if err != nil {
				t.Fatal(err)
			}
			stop := make(chan struct{})
			reaped := make(chan int64, 1)
			go func() {
				var total int64
				defer func() { reaped <- total }()
				tick := time.NewTicker(20 * time.Millisecond)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						return
					case <-tick.C:
						n, _ := reaper.Reap(context.Background())
						total += n
					}
				}
			}()
			start := time.Now()
			n, err := r.RunBatch(context.Background())
			elapsed := time.Since(start)
			close(stop)
			if got := <-reaped; got != 0 {
				t.Errorf("the reaper took %d leases back: the batch outlived LeaseTTL (it ran %v)", got, elapsed)
			}
			if n != 2 || err == nil || errors.Is(err, outbox.ErrLeaseLost) {
				t.Fatalf("RunBatch = %d, %v after %v; want 2 events and the publish error", n, err, elapsed)
			}
			for id, s := range pubRows(t, db) {
				if s.status != "PENDING" || s.attempts != 1 || s.lastErr == "" || strings.Contains(s.lastErr, "lease") {
					t.Errorf("%s after a batch against a stuck broker (%v): status %s attempts %d last_error %q; want PENDING, 1, the publish error",
						id, elapsed, s.status, s.attempts, s.lastErr)
				}
			}
		})
	}
}

// Faults the broker answers for some records of a batch and not others:
// a record over the topic's max.message.bytes (the broker's
// MESSAGE_TOO_LARGE fails the whole produce batch of its partition), and a
// topic that does not exist. In each, the failed events stay unpublished
// with their attempt counted, the later events of their aggregate wait
// (a-2, even on a healthy topic), and everything else is delivered and
// marked — in the first batch, or for a partition-mate of the oversize
// record (failed with it, counted) in the first batch after its backoff.
func TestRelayProduceFaults(t *testing.T) {
	t.Parallel()
	testCases := []struct {
		name  string
		topic string // a-1's topic
		setup func(t *testing.T, c *testkafka.Cluster)
		want  string // in a-1's last_error
	}{
		{"broker MESSAGE_TOO_LARGE", "small", func(t *testing.T, c *testkafka.Cluster) {
			if err := c.Cluster.CreateTopic("small", 1, map[string]string{"max.message.bytes": "2048"}); err != nil {
				t.Fatal(err)
			}
		}, "MESSAGE_TOO_LARGE"},
		{"missing topic", "nope", func(*testing.T, *testkafka.Cluster) {}, "nope"},
	}
	for _, tt := range testCases {
		for _, mode := range []outbox.Mode{outbox.AtLeastOnce, outbox.TwoPhase} {
			t.Run(tt.name+"/"+mode.String(), func(t *testing.T) {
				t.Parallel()
				c := testkafka.New(t)
				c.CreateTopic(t, "orders", 2)
				tt.setup(t, c)
				db := testdb.New(t)
				a1 := pubMsg(tt.topic, "a", 1)
				a1.Payload = make([]byte, 10_000) // incompressible: the broker sees it whole
				for i := range a1.Payload {
					a1.Payload[i] = byte(rand.Uint32())
				}
				b1 := pubMsg("small", "b", 1) // a partition-mate of a-1 when the topic exists
				if tt.topic != "small" {
					b1.Topic = "orders"
				}
				pubEnqueue(t, db, a1, pubMsg("orders", "a", 2), b1, pubMsg("orders", "c", 1))
				pub, err := kafka.NewPublisher(c.Client(t, kafka.ProducerOpts()...), nil)
				if err != nil {
					t.Fatal(err)
				}
				r, err := outbox.NewRelay(db.Pool, pub, &outbox.RelayConfig{Mode: mode, DisableNotify: true,
					BatchTimeout: 4 * time.Second, BackoffMin: time.Hour, BackoffMax: time.Hour, Logger: pubQuiet})
				if err != nil {
					t.Fatal(err)
				}
				if n, err := r.RunBatch(context.Background()); n != 4 || err == nil {
					t.Fatalf("RunBatch = %d, %v; want 4 and a failure", n, err)
				}
				rows := pubRows(t, db)
				if s := rows["a-1"]; s.status != "PENDING" || s.attempts != 1 || !strings.Contains(s.lastErr, tt.want) {
					t.Fatalf("a-1: %+v, want PENDING, 1 attempt, an error naming %q", s, tt.want)
				}
				if s := rows["a-2"]; s.status != "PENDING" || s.attempts != 0 {
					t.Fatalf("a-2: %+v, want PENDING and untried behind a-1", s)
				}
				if rows["c-1"].status != "PUBLISHED" {
					t.Fatalf("c-1: %+v", rows["c-1"])
				}
				// b-1 may have failed with its partition-mate: end its backoff.
				if _, err := db.Pool.Exec(context.Background(), "UPDATE outbox_event SET available_at = now() WHERE event_id = 'b-1'"); err != nil {
					t.Fatal(err)
				}
				pubEventually(t, "b-1 published", 30*time.Second, func() bool {
					_, _ = r.RunBatch(context.Background())
					return pubRows(t, db)["b-1"].status == "PUBLISHED"
				})
				got := map[string]bool{}
				for _, topic := range []string{"orders", b1.Topic} {
					n := 1
					if topic == "orders" && b1.Topic == "orders" {
						n = 2
					}
					for _, rec := range c.ReadAll(t, topic, n, 10*time.Second) {
						got[pubHeader(rec, kafka.HeaderEventID)] = true
					}
				}
				if got["a-1"] || got["a-2"] || !got["b-1"] || !got["c-1"] {
					t.Fatalf("in Kafka: %v, want b-1 and c-1 only", got)
				}
				if s := pubRows(t, db)["a-2"]; s.status != "PENDING" {
					t.Fatalf("a-2 after the drain: %+v", s)
				}
			})
		}
	}
}
