package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idemkit/idem/internal/cli"
)

func init() {
	register(&cli.Command{Name: "devkafka", Summary: "run a development Kafka broker (kfake) that survives restarts", Run: runDevkafka})
}

const devkafkaUsage = `Usage: idem devkafka [--data-dir DIR] [--port N] [--partitions P] [--topics a,b] [--sync]

Runs a single-broker kfake cluster (the real Kafka wire protocol, in one
process) on 127.0.0.1:PORT and prints "listening on 127.0.0.1:PORT" once it
accepts connections.

With --data-dir the broker keeps its topics, records, consumer-group offsets
and producer state in DIR and reloads them when started again on the same
directory: every write reaches the operating system before the broker answers,
so a SIGKILL loses nothing that was acknowledged (--sync also fsyncs every
batch, for machine crashes). SIGTERM or SIGINT stops it gracefully (a second
signal stops it at once). Topics are created on first use with --partitions
partitions; --topics creates them up front.`

func runDevkafka(ctx context.Context, args []string) error {
	fs := cli.FlagSet("devkafka", devkafkaUsage)
	dataDir := fs.String("data-dir", "", "directory for the broker's state (empty: in memory only)")
	port := fs.Int("port", 9092, "TCP port on 127.0.0.1 (0: any free port)")
	partitions := fs.Int("partitions", 3, "partitions of topics created on first use or by --topics")
	topics := fs.String("topics", "", "comma-separated topics to create at start")
	sync := fs.Bool("sync", false, "fsync every batch (survives machine crashes, slower)")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.Usagef("unexpected argument %q", fs.Arg(0))
	}
	if *port < 0 || *port > 65535 {
		return cli.Usagef("--port %d out of range 0..65535", *port)
	}
	if *partitions < 1 || *partitions > 10000 {
		return cli.Usagef("--partitions %d out of range 1..10000", *partitions)
	}
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.Ports(*port),
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
	if *sync {
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
	for _, a := range c.ListenAddrs() {
		fmt.Printf("listening on %s\n", a)
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
