// Package testkafka starts a kfake cluster per test: a real Kafka wire
// protocol broker on a random loopback port, closed when the test ends.
package testkafka

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/internal/kfakereap"
)

// Cluster is one test's broker.
type Cluster struct {
	*kfake.Cluster
	Addrs []string
}

// New starts a single-broker kfake cluster on 127.0.0.1:0. Extra kfake
// options are applied after the defaults.
func New(t testing.TB, opts ...kfake.Opt) *Cluster {
	t.Helper()
	all := append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)
	c, err := kfake.NewCluster(all...)
	if err != nil {
		t.Fatalf("testkafka: start kfake: %v", err)
	}
	t.Cleanup(c.Close)
	// Registered after c.Close, so run before it: kfake keeps a member that
	// died while its JoinGroup waited, for ever; the reaper expires it at
	// its session timeout, as Kafka does (see package kfakereap).
	r, err := kfakereap.Start(c, 0, nil)
	if err != nil {
		t.Fatalf("testkafka: start the group reaper: %v", err)
	}
	t.Cleanup(r.Stop)
	return &Cluster{Cluster: c, Addrs: c.ListenAddrs()}
}

// Client returns a kgo client for the cluster, closed at test end.
func (c *Cluster) Client(t testing.TB, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	all := append([]kgo.Opt{kgo.SeedBrokers(c.Addrs...)}, opts...)
	cl, err := kgo.NewClient(all...)
	if err != nil {
		t.Fatalf("testkafka: client: %v", err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// CreateTopic creates topic with the given number of partitions.
func (c *Cluster) CreateTopic(t testing.TB, topic string, partitions int32) {
	t.Helper()
	cl := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, partitions, 1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		t.Fatalf("testkafka: create topic %s: %v", topic, err)
	}
}

// ReadAll consumes topic from the start (read_committed) until n records
// have arrived, and fails the test if they do not arrive within timeout.
// Records come back in per-partition order.
func (c *Cluster) ReadAll(t testing.TB, topic string, n int, timeout time.Duration) []*kgo.Record {
	t.Helper()
	recs, err := c.Read(topic, n, timeout)
	if err != nil {
		t.Fatalf("testkafka: read %s: got %d of %d records: %v", topic, len(recs), n, err)
	}
	return recs
}

// Read is ReadAll without the test: it returns what arrived and an error if
// fewer than n records came within timeout.
func (c *Cluster) Read(topic string, n int, timeout time.Duration) ([]*kgo.Record, error) {
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(c.Addrs...),
		kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
	)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out []*kgo.Record
	for len(out) < n {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return out, err
		}
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) {
				ferr = err
			}
		})
		if ferr != nil {
			return out, ferr
		}
		out = append(out, fs.Records()...)
	}
	return out, nil
}
