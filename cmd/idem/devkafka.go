package main

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemkit/idem/internal/cli"
	"github.com/idemkit/idem/internal/kfakereap"
)

func init() {
	register(&cli.Command{Name: "devkafka", Summary: "run a development Kafka broker (kfake) that survives restarts", Run: runDevkafka})
}

const devkafkaUsage = `Usage: idem devkafka [--data-dir DIR] [--port N] [--partitions P] [--topics a,b] [--sync]
                     [--advertise HOST:PORT] [--produce-fail-rate P [--produce-fail-seed N] [--produce-fail-error NAME]]

Runs a single-broker kfake cluster (the real Kafka wire protocol, in one
process) on 127.0.0.1:PORT and prints "listening on 127.0.0.1:PORT" once it
accepts connections.

With --data-dir the broker keeps its topics, records, consumer-group offsets
and producer state in DIR and reloads them when started again on the same
directory: every write reaches the operating system before the broker answers,
so a SIGKILL loses nothing that was acknowledged (--sync also fsyncs every
batch, for machine crashes). SIGTERM or SIGINT stops it gracefully (a second
signal stops it at once). Topics are created on first use with --partitions
partitions; --topics creates the missing ones up front, on a fresh or an
existing --data-dir alike (an existing topic is left as it is).

--advertise names another address in the broker's metadata than the one it
listens on, so that clients reach it through a proxy in front of it (every
connection a client opens after the first goes to the advertised address).

--produce-fail-rate P answers that share of the partitions of produce
requests with --produce-fail-error (a non-retriable Kafka error, default
INVALID_RECORD) instead of appending them, drawn at random per partition of
each request: a request for three partitions can have one fail and two
succeed. The failed partition's records are not written. --produce-fail-seed
makes the draws reproducible (0: from the clock). For fault-injection tests
of producers.`

// maxPartitions bounds --partitions, and the partitions --produce-fail-rate
// reaches.
const maxPartitions = 10000

func runDevkafka(ctx context.Context, args []string) error {
	fs := cli.FlagSet("devkafka", devkafkaUsage)
	dataDir := fs.String("data-dir", "", "directory for the broker's state (empty: in memory only)")
	port := fs.Int("port", 9092, "TCP port on 127.0.0.1 (0: any free port)")
	partitions := fs.Int("partitions", 3, "partitions of topics created on first use or by --topics")
	topics := fs.String("topics", "", "comma-separated topics to create at start")
	syncWrites := fs.Bool("sync", false, "fsync every batch (survives machine crashes, slower)")
	advertise := fs.String("advertise", "", "HOST:PORT to name in metadata instead of the listen address (a proxy in front)")
	failRate := fs.Float64("produce-fail-rate", 0, "share of produce partition-requests answered with --produce-fail-error, in [0, 1]")
	failSeed := fs.Int64("produce-fail-seed", 0, "seed of the produce-failure draws (0: from the clock)")
	failName := fs.String("produce-fail-error", kerr.InvalidRecord.Message, "non-retriable Kafka error of a failed produce partition")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.Usagef("unexpected argument %q", fs.Arg(0))
	}
	if *port < 0 || *port > 65535 {
		return cli.Usagef("--port %d out of range 0..65535", *port)
	}
	if *partitions < 1 || *partitions > maxPartitions {
		return cli.Usagef("--partitions %d out of range 1..%d", *partitions, maxPartitions)
	}
	if *failRate < 0 || *failRate > 1 {
		return cli.Usagef("--produce-fail-rate %v out of range [0, 1]", *failRate)
	}
	failErr, err := produceFailError(*failName)
	if err != nil {
		return cli.Usagef("%v", err)
	}
	var adv *net.TCPAddr
	if *advertise != "" {
		if adv, err = parseAdvertise(*advertise); err != nil {
			return cli.Usagef("--advertise %q: %v", *advertise, err)
		}
	}
	// The real listener's address, for the "listening on" line: with
	// --advertise, kfake sees only the advertised one.
	var listenMu sync.Mutex
	var listening []string
	listen := func(network, address string) (net.Listener, error) {
		ln, err := net.Listen(network, address)
		if err != nil {
			return nil, err
		}
		listenMu.Lock()
		listening = append(listening, ln.Addr().String())
		listenMu.Unlock()
		if adv != nil {
			return advertisedListener{Listener: ln, adv: adv}, nil
		}
		return ln, nil
	}
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.Ports(*port),
		kfake.ListenFn(listen),
		kfake.DefaultNumPartitions(*partitions),
		// A stable cluster id: clients that survive a broker restart see the
		// same cluster, not a new one.
		kfake.ClusterID("idem-devkafka"),
	}
	var seed []string
	for _, t := range strings.Split(*topics, ",") {
		if t = strings.TrimSpace(t); t != "" {
			seed = append(seed, t)
		}
	}
	if len(seed) > 0 {
		opts = append(opts, kfake.SeedTopics(int32(*partitions), seed...))
	}
	if *dataDir != "" {
		opts = append(opts, kfake.DataDir(*dataDir))
	}
	if *syncWrites {
		opts = append(opts, kfake.SyncWrites())
	}
	// Signals are ours from here on: the first one stops gracefully (kfake
	// flushes its state to the data directory), a second one exits at once.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)

	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return fmt.Errorf("start broker on port %d: %w", *port, err)
	}
	autoCreateTopics(c, int32(*partitions))
	// kfake seeds topics only into a fresh data directory: a directory
	// that already holds state is loaded as it is and SeedTopics ignored.
	// Creating each --topics topic here makes the flag mean the same on
	// every start; one that exists already is left as it is.
	for _, t := range seed {
		if err := c.CreateTopic(t, int32(*partitions), nil); err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
			c.Close()
			return fmt.Errorf("create topic %s: %w", t, err)
		}
	}
	// kfake keeps a member that died while its JoinGroup waited, for
	// ever, with the partitions it was given: the reaper expires it at its
	// session timeout, as Kafka does (see package kfakereap).
	reaper, err := kfakereap.Start(c, 0, func(group, member string) {
		fmt.Fprintf(os.Stderr, "devkafka: group %s: member %s expired (nothing from it for its session timeout)\n", group, member)
	})
	if err != nil {
		c.Close()
		return fmt.Errorf("start the group reaper: %w", err)
	}
	if *failRate > 0 {
		seed := *failSeed
		if seed == 0 {
			seed = time.Now().UnixNano()
		}
		failProduce(c, *failRate, seed, failErr)
		fmt.Fprintf(os.Stderr, "devkafka: failing %.1f%% of produce partitions with %s (seed %d)\n", *failRate*100, failErr.Message, seed)
	}
	listenMu.Lock()
	for _, a := range listening {
		fmt.Printf("listening on %s\n", a)
	}
	listenMu.Unlock()
	if adv != nil {
		fmt.Printf("advertising %s\n", adv)
	}
	select {
	case <-sigs:
	case <-ctx.Done():
	}
	// The first signal reaches both sigs and the ctx of cli.Run; whichever
	// woke us, the other may still hold that same signal. Only a signal
	// that arrives from here on forces the stop: Notify takes the lock the
	// signal delivery holds, so the new channel never sees the first one.
	signal.Stop(sigs)
	force := make(chan os.Signal, 1)
	signal.Notify(force, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(force)
	fmt.Fprintln(os.Stderr, "devkafka: stopping (signal again to force)")
	reaper.Stop()
	done := make(chan struct{})
	go func() {
		c.Close()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-force:
		return fmt.Errorf("forced stop: state in %s may miss the last writes", *dataDir)
	}
}

// autoCreateTopics creates a topic the first time a client asks for it in a
// Metadata request that allows auto-creation.
//
// kfake's own auto-creation (kfake.AllowAutoTopicCreation) makes the topic in
// memory only: it reaches the data directory at the next topic change or at a
// graceful stop, so after a SIGKILL the topic, and with it every record
// produced to it, is gone. Cluster.CreateTopic persists the topic list at
// once, so we route auto-creation through it instead:
//  1. the Metadata request for an unknown topic is answered normally
//     (UNKNOWN_TOPIC_OR_PARTITION), which clients retry;
//  2. meanwhile a goroutine creates the topic (the control function runs on
//     the cluster's loop and must not wait for it) and persists topics.json;
//  3. the client's retry finds the topic, and records produced to it from
//     then on survive a SIGKILL.
//
// A topic that already exists (loaded from the data directory) makes
// CreateTopic fail with TOPIC_ALREADY_EXISTS, which is ignored.
func autoCreateTopics(c *kfake.Cluster, partitions int32) {
	var tried sync.Map
	c.ControlKey(int16(kmsg.Metadata), func(req kmsg.Request) (kmsg.Response, error, bool) {
		mr, ok := req.(*kmsg.MetadataRequest)
		if !ok || !mr.AllowAutoTopicCreation {
			return nil, nil, false
		}
		for _, t := range mr.Topics {
			if t.Topic == nil || *t.Topic == "" {
				continue
			}
			if _, loaded := tried.LoadOrStore(*t.Topic, true); loaded {
				continue
			}
			go func(topic string) { _ = c.CreateTopic(topic, partitions, nil) }(*t.Topic)
		}
		return nil, nil, false
	})
}

// failProduce answers a share rate of produce partition-requests with
// failErr, drawn per partition with a generator seeded by seed.
//
// It is a kfake Fault on Produce with a When filter: kfake asks the filter
// once for each partition of a request, before the broker appends anything,
// and answers the partitions it accepts with failErr while the others of
// the same request are written normally; that is exactly a partial produce
// failure. The fault names its partitions (every one a topic of this broker
// can have, up to maxPartitions) because kfake also checks faults once per
// topic of a request, and a fault without partitions would then be drawn
// for the whole topic as well. The filter runs on the cluster's goroutine,
// one call at a time; the lock only makes that independent of kfake.
func failProduce(c *kfake.Cluster, rate float64, seed int64, failErr *kerr.Error) {
	var mu sync.Mutex
	rng := mrand.New(mrand.NewPCG(uint64(seed), 0x9a11))
	parts := make([]int32, maxPartitions)
	for i := range parts {
		parts[i] = int32(i)
	}
	c.Fault(kfake.Fault{
		Keys:       []kmsg.Key{kmsg.Produce},
		Partitions: parts,
		Err:        failErr,
		Count:      -1,
		When: func(kmsg.Request) bool {
			mu.Lock()
			defer mu.Unlock()
			return rng.Float64() < rate
		},
	})
}

// produceFailError resolves a Kafka error name (INVALID_RECORD) or code
// (87) to a non-retriable error: a retriable one would be retried inside
// the client and never reach the producer's caller.
func produceFailError(name string) (*kerr.Error, error) {
	var ke *kerr.Error
	code, numErr := strconv.Atoi(name)
	for c := int16(-1); c < 256; c++ {
		e := kerr.TypedErrorForCode(c)
		if e == nil || e.Code != c {
			continue // success, or a code kerr does not know
		}
		if numErr == nil && int(c) == code || numErr != nil && strings.EqualFold(e.Message, name) {
			ke = e
			break
		}
	}
	switch {
	case ke == nil:
		return nil, fmt.Errorf("--produce-fail-error %q: not a Kafka error name or code", name)
	case ke.Retriable:
		return nil, fmt.Errorf("--produce-fail-error %s is retriable: the client would retry it and its caller never see it", ke.Message)
	}
	return ke, nil
}

// advertisedListener is the broker's listener with another address: kfake
// names a broker in metadata by its listener's Addr.
type advertisedListener struct {
	net.Listener
	adv *net.TCPAddr
}

func (l advertisedListener) Addr() net.Addr { return l.adv }

func parseAdvertise(s string) (*net.TCPAddr, error) {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return nil, err
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 {
		return nil, fmt.Errorf("port %q out of range 1..65535", port)
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return nil, fmt.Errorf("host %q is not an IP address", host)
	}
	return &net.TCPAddr{IP: ip, Port: p}, nil
}
