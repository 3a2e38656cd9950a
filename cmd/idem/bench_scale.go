package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/inbox"
	"github.com/idemkit/idem/internal/cli"
	"github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/migrate"
	"github.com/idemkit/idem/outbox"
)

func init() {
	registerBench(&benchScenario{
		Name: "scale",
		Summary: "Cost versus the data kept: for each retained size of --sizes, a scratch schema\n" +
			"of its own seeded with generate_series (that many completed idempotency records,\n" +
			"PUBLISHED outbox events and processed_event rows, all inside their retention,\n" +
			"plus --purge-rows expired rows of each table), then:\n" +
			"transactional@N: fresh requests through the ModeTransactional Idempotency-Key\n" +
			"  middleware (--clients keep-alive clients, the handler writes one row in the\n" +
			"  request transaction), --seconds;\n" +
			"relay@N: outbox.Relay (at-least-once, to an in-process kfake broker) draining\n" +
			"  --events PENDING events that follow the retained ones on the same aggregates;\n" +
			"inbox@N: one transaction per record around inbox.MarkProcessedTx of a new event\n" +
			"  id (--inbox-clients goroutines), --seconds;\n" +
			"purge-idempotency@N, purge-outbox@N, purge-inbox@N: the --purge-rows expired\n" +
			"  rows deleted by Middleware.Purge, Relay.Purge and inbox.Purge (rows/s) while\n" +
			"  the N retained rows stay.\n" +
			"Every size is seeded first; then the sizes take turns (--rounds interleaved\n" +
			"rounds of transactional and inbox, one relay batch each, each purge across the\n" +
			"sizes back to back), so that a shared machine's drift hits all sizes alike.\n" +
			"Every result's ratio is to the same curve at the first size (0 by default).\n" +
			"--svg DIR writes one SVG per curve (ops/s against retained rows).",
		Flags: func(fs *benchFlags) {
			fs.String("sizes", "0,1000000,10000000", "retained rows per table, comma-separated, ascending; ratios are to the first")
			fs.Int("seconds", 6, "measured seconds of transactional and inbox per size, split over the rounds")
			fs.Int("rounds", 3, "interleaved rounds: every round runs every size once")
			fs.Int("clients", 32, "concurrent HTTP clients of transactional")
			fs.Int("inbox-clients", 4, "concurrent goroutines of inbox")
			fs.Int("events", 50_000, "PENDING events drained by relay per size")
			fs.Int("batch-size", 1000, "relay batch size")
			fs.Int("purge-rows", 100_000, "expired rows of each table deleted by the purges per size")
			fs.String("svg", "", "write one SVG per curve into this directory")
		},
		Run: runBenchScale,
	})
}

// benchScaleCurves are the curves, in report order; each result is named
// curve@size.
var benchScaleCurves = []string{"transactional", "relay", "inbox", "purge-idempotency", "purge-outbox", "purge-inbox"}

// benchScaleAggregates is how many aggregates the outbox events, retained
// and pending, are spread over.
const benchScaleAggregates = 1000

// errBenchScaleSizes is a bad --sizes list.
var errBenchScaleSizes = errors.New("--sizes must be a comma-separated ascending list of row counts ≥ 0")

func parseScaleSizes(s string) ([]int, error) {
	var sizes []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 || (len(sizes) > 0 && n <= sizes[len(sizes)-1]) {
			return nil, errBenchScaleSizes
		}
		sizes = append(sizes, n)
	}
	if len(sizes) == 0 {
		return nil, errBenchScaleSizes
	}
	return sizes, nil
}

type benchScaleOpts struct {
	seconds, rounds, clients, inboxClients, events, batchSize, purgeRows int
}

func runBenchScale(ctx context.Context, env *benchEnv) ([]benchResult, error) {
	sizes, err := parseScaleSizes(*env.Strings["sizes"])
	if err != nil {
		return nil, cli.Usagef("%v", err)
	}
	o := benchScaleOpts{
		seconds: *env.Ints["seconds"], rounds: *env.Ints["rounds"], clients: *env.Ints["clients"], inboxClients: *env.Ints["inbox-clients"],
		events: *env.Ints["events"], batchSize: *env.Ints["batch-size"], purgeRows: *env.Ints["purge-rows"],
	}
	for name, v := range map[string]int{"seconds": o.seconds, "rounds": o.rounds, "clients": o.clients, "inbox-clients": o.inboxClients,
		"events": o.events, "batch-size": o.batchSize, "purge-rows": o.purgeRows} {
		if v < 1 {
			return nil, cli.Usagef("--%s must be at least 1", name)
		}
	}
	if o.batchSize > 100_000 {
		return nil, cli.Usagef("--batch-size must be at most 100000")
	}
	svgDir := *env.Strings["svg"]
	if svgDir != "" {
		if err := os.MkdirAll(svgDir, 0o755); err != nil {
			return nil, cli.Usagef("--svg %s: %v", svgDir, err)
		}
	}

	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		return nil, fmt.Errorf("start kfake: %w", err)
	}
	defer cluster.Close()
	cl, err := kgo.NewClient(append(kafka.ProducerOpts(), kgo.SeedBrokers(cluster.ListenAddrs()...),
		kgo.ProducerBatchCompression(kgo.NoCompression()))...)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	resp, err := kadm.NewClient(cl).CreateTopic(ctx, 8, 1, nil, "bench.scale")
	if err == nil {
		err = resp.Err
	}
	if err != nil {
		return nil, fmt.Errorf("create topic: %w", err)
	}
	pub, err := kafka.NewPublisher(cl, nil)
	if err != nil {
		return nil, err
	}

	// Every size is seeded first, each in a schema of its own; then the
	// sizes take turns, so that the drifting load of a shared machine falls
	// on all of them alike and the ratios between sizes stay honest.
	var subjects []*scaleSubject
	defer func() {
		for _, s := range subjects {
			s.close(ctx)
		}
	}()
	for _, n := range sizes {
		s, err := newScaleSubject(ctx, env, n, o, pub)
		if err != nil {
			return nil, fmt.Errorf("size %d: %w", n, err)
		}
		subjects = append(subjects, s)
	}
	slice := time.Duration(o.seconds) * time.Second / time.Duration(o.rounds)
	for round := range o.rounds {
		warm := 200 * time.Millisecond
		if round == 0 {
			warm = time.Second
		}
		for _, s := range subjects {
			if err := s.loadHTTP(ctx, o, warm, slice); err != nil {
				return nil, fmt.Errorf("transactional@%d: %w", s.n, err)
			}
			if err := s.loadInbox(ctx, o, warm, slice); err != nil {
				return nil, fmt.Errorf("inbox@%d: %w", s.n, err)
			}
		}
	}
	// The relays take turns too, one batch each.
	for active := len(subjects); active > 0; {
		for _, s := range subjects {
			if s.relayDone {
				continue
			}
			if err := s.relayBatch(ctx); err != nil {
				return nil, fmt.Errorf("relay@%d: %w", s.n, err)
			}
			if s.relayDone {
				active--
			}
		}
	}
	purges := make([][]benchResult, len(subjects))
	for _, curve := range []string{"purge-idempotency", "purge-outbox", "purge-inbox"} {
		for i, s := range subjects {
			r, err := s.purge(ctx, curve, o)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", scaleName(curve, s.n), err)
			}
			purges[i] = append(purges[i], r)
		}
	}
	var results []benchResult
	for i, s := range subjects {
		rs := []benchResult{s.httpS.result(scaleName("transactional", s.n))}
		relay, err := s.relayResult(ctx, o)
		if err != nil {
			return nil, fmt.Errorf("relay@%d: %w", s.n, err)
		}
		rs = append(rs, relay, s.inboxS.result(scaleName("inbox", s.n)))
		for _, r := range append(rs, purges[i]...) {
			fmt.Fprintf(env.Log, "scale: %s: %.0f ops/s, p50 %.2f ms, p99 %.2f ms (%d ops)\n", r.Name, r.OpsPerSec, r.P50Ms, r.P99Ms, r.Ops)
			results = append(results, r)
		}
	}
	benchScaleRatios(env.Log, sizes, results)
	if svgDir != "" {
		for _, c := range benchScaleCurves {
			var pts []scalePoint
			for _, r := range results {
				if curve, size, ok := splitScaleName(r.Name); ok && curve == c {
					pts = append(pts, scalePoint{Size: size, OpsPerSec: r.OpsPerSec, Ratio: r.Ratio})
				}
			}
			path := filepath.Join(svgDir, "scale-"+c+".svg")
			if err := os.WriteFile(path, scaleSVG(c, benchScaleUnit(c), pts), 0o644); err != nil {
				return nil, err
			}
			fmt.Fprintf(env.Log, "scale: wrote %s\n", path)
		}
	}
	return results, nil
}

func benchScaleUnit(curve string) string {
	switch {
	case curve == "transactional":
		return "requests/s"
	case curve == "relay":
		return "events/s"
	case curve == "inbox":
		return "records/s"
	default:
		return "rows deleted/s"
	}
}

func scaleName(curve string, size int) string { return curve + "@" + strconv.Itoa(size) }

func splitScaleName(name string) (string, int, bool) {
	curve, s, ok := strings.Cut(name, "@")
	if !ok {
		return "", 0, false
	}
	n, err := strconv.Atoi(s)
	return curve, n, err == nil
}

// benchScaleRatios sets each result's ratio to its curve at the first size
// and prints, per curve, the ratio at the largest size against the issue's
// goal (≥ 0.9), met or missed: a report, not a gate.
func benchScaleRatios(log io.Writer, sizes []int, results []benchResult) {
	base := map[string]float64{}
	for _, r := range results {
		if c, n, ok := splitScaleName(r.Name); ok && n == sizes[0] {
			base[c] = r.OpsPerSec
		}
	}
	for i := range results {
		if c, _, ok := splitScaleName(results[i].Name); ok && base[c] > 0 {
			results[i].Ratio = results[i].OpsPerSec / base[c]
		}
	}
	if len(sizes) < 2 {
		return
	}
	last := sizes[len(sizes)-1]
	for _, r := range results {
		if c, n, ok := splitScaleName(r.Name); ok && n == last && r.Ratio > 0 {
			verdict := "met"
			if r.Ratio < 0.9 {
				verdict = "MISSED"
			}
			fmt.Fprintf(log, "scale: %s at %d / at %d = %.2f (goal ≥ 0.90: %s)\n", c, last, sizes[0], r.Ratio, verdict)
		}
	}
}

// scaleSubject is one retained size: its scratch schema, seeded, with the
// transactional middleware served on loopback over it and a relay, and
// the figures gathered so far.
type scaleSubject struct {
	n     int
	pool  *pgxpool.Pool
	drop  func()
	srv   *http.Server
	conns *benchConns
	run   string
	seq   atomic.Int64
	relay *outbox.Relay

	httpS, inboxS benchSamples
	relayLat      []float64
	relayElapsed  time.Duration
	relayTotal    int
	relayDone     bool
}

func newScaleSubject(ctx context.Context, env *benchEnv, n int, o benchScaleOpts, pub outbox.Publisher) (_ *scaleSubject, err error) {
	urls, drop, err := scratchSchemas(ctx, env.DatabaseURL, "bench_scale", 1, nil)
	if err != nil {
		return nil, err
	}
	s := &scaleSubject{n: n, drop: drop, run: uniqueRun()}
	defer func() {
		if err != nil {
			s.close(ctx)
		}
	}()
	pcfg, err := pgxpool.ParseConfig(urls[0])
	if err != nil {
		return nil, cli.Usagef("database URL is malformed")
	}
	// One connection per client: a transactional request holds its
	// connection for the whole handler.
	pcfg.MaxConns = int32(max(o.clients, o.inboxClients, 4))
	if s.pool, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
		return nil, fmt.Errorf("pool: %w", err)
	}
	if _, err := migrate.Up(ctx, s.pool); err != nil {
		return nil, fmt.Errorf("migrate scratch schema: %w", err)
	}
	t0 := time.Now()
	if err := benchScaleSeed(ctx, s.pool, n, o.purgeRows, o.events); err != nil {
		return nil, fmt.Errorf("seed: %w", err)
	}
	fmt.Fprintf(env.Log, "scale: %d: seeded %d retained + %d expired rows per table in %s\n", n, n, o.purgeRows, time.Since(t0).Round(time.Millisecond))
	if s.relay, err = outbox.NewRelay(s.pool, pub, &outbox.RelayConfig{Mode: outbox.AtLeastOnce, BatchSize: o.batchSize,
		DisableNotify: true, Logger: slog.New(slog.DiscardHandler)}); err != nil {
		return nil, err
	}
	scope := func(r *http.Request) (string, error) { return r.Header.Get("X-User"), nil }
	mw, err := idempotency.New(idempotency.NewPostgresStore(s.pool), &idempotency.Config{Scope: scope, Mode: idempotency.ModeTransactional})
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /transactional/rows", mw.Wrap(benchRowHandler(func(ctx context.Context) (int64, error) {
		tx, ok := idempotency.TxFromContext(ctx)
		if !ok {
			return 0, errors.New("no request transaction")
		}
		var id int64
		err := tx.QueryRow(ctx, `INSERT INTO bench_scale_row (body) VALUES ($1) RETURNING id`, benchHTTPBody).Scan(&id)
		return id, err
	})))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	s.conns = newBenchConns(ln.Addr().String(), o.clients)
	return s, nil
}

func (s *scaleSubject) close(ctx context.Context) {
	if s.srv != nil {
		_ = s.srv.Shutdown(context.WithoutCancel(ctx))
	}
	if s.conns != nil {
		s.conns.close()
	}
	if s.pool != nil {
		s.pool.Close()
	}
	s.drop()
}

// loadHTTP sends fresh keys to the transactional middleware for one slice.
func (s *scaleSubject) loadHTTP(ctx context.Context, o benchScaleOpts, warm, slice time.Duration) error {
	return benchLoad(ctx, o.clients, warm, slice, func(ctx context.Context) error {
		return s.conns.post(ctx, "/transactional/rows", s.run+"-"+strconv.FormatInt(s.seq.Add(1), 10), http.StatusCreated)
	}, &s.httpS)
}

// loadInbox marks new event ids processed for one slice, one transaction
// per record (BEGIN, inbox.MarkProcessedTx, COMMIT).
func (s *scaleSubject) loadInbox(ctx context.Context, o benchScaleOpts, warm, slice time.Duration) error {
	return benchLoad(ctx, o.inboxClients, warm, slice, func(ctx context.Context) error {
		id := benchScaleUUID()
		return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			first, err := inbox.MarkProcessedTx(ctx, tx, "billing-"+strconv.Itoa(int(id[0])%4), id)
			if err == nil && !first {
				err = fmt.Errorf("event %s: marked before", id)
			}
			return err
		})
	}, &s.inboxS)
}

// relayBatch runs one batch of the relay; an empty one ends the drain.
func (s *scaleSubject) relayBatch(ctx context.Context) error {
	t0 := time.Now()
	k, err := s.relay.RunBatch(ctx)
	d := time.Since(t0)
	if err != nil {
		return err
	}
	s.relayElapsed += d
	if k == 0 {
		s.relayDone = true
		return nil
	}
	s.relayLat = append(s.relayLat, float64(d.Microseconds())/1000)
	s.relayTotal += k
	return nil
}

// relayResult checks that the drain published every pending event and
// reports events over the time spent in batches.
func (s *scaleSubject) relayResult(ctx context.Context, o benchScaleOpts) (benchResult, error) {
	var published int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM outbox_event WHERE event_id LIKE 'new-%' AND status = 'PUBLISHED'`).Scan(&published); err != nil {
		return benchResult{}, err
	}
	if published != o.events || s.relayTotal < o.events {
		return benchResult{}, fmt.Errorf("published %d (claimed %d) of %d events", published, s.relayTotal, o.events)
	}
	return latencyResult(scaleName("relay", s.n), s.relayLat, o.events, s.relayElapsed), nil
}

// benchScaleUUID is a random UUID in its text form, the shape of the
// seeded event ids.
func benchScaleUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// purge runs one table's purge over the seeded expired rows, with the n
// retained rows in place, and checks that it deleted exactly the expired
// ones.
func (s *scaleSubject) purge(ctx context.Context, curve string, o benchScaleOpts) (benchResult, error) {
	var run func(context.Context) (int64, error)
	switch curve {
	case "purge-idempotency":
		mw, err := idempotency.New(idempotency.NewPostgresStore(s.pool), &idempotency.Config{Scope: func(*http.Request) (string, error) { return "", nil }})
		if err != nil {
			return benchResult{}, err
		}
		run = func(ctx context.Context) (int64, error) { k, err := mw.Purge(ctx); return int64(k), err }
	case "purge-outbox":
		relay, err := outbox.NewRelay(s.pool, benchNopPublisher{}, &outbox.RelayConfig{Retention: outbox.RetentionDefault,
			DisableNotify: true, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return benchResult{}, err
		}
		run = relay.Purge
	default:
		run = func(ctx context.Context) (int64, error) {
			return inbox.Purge(ctx, s.pool, time.Now().Add(-inbox.RetentionDefault), inbox.PurgeBatchSizeDefault)
		}
	}
	t0 := time.Now()
	k, err := run(ctx)
	d := time.Since(t0)
	if err != nil {
		return benchResult{}, err
	}
	if k != int64(o.purgeRows) {
		return benchResult{}, fmt.Errorf("deleted %d rows, want the %d expired ones", k, o.purgeRows)
	}
	return latencyResult(scaleName(curve, s.n), []float64{float64(d.Microseconds()) / 1000}, int(k), d), nil
}

// benchScaleSeed fills the three tables the way a long-running service
// leaves them, in a few INSERT … SELECT FROM generate_series statements:
//
//   - idempotency_key: n completed records (key_hash and fingerprint are
//     SHA-256 digests, as HashKey and Fingerprint make them; a small JSON
//     response with its headers), created over the last hour, expiring in
//     23 h; plus expired completed records, for the purge;
//   - outbox_event: n PUBLISHED events over benchScaleAggregates
//     aggregates, published over the last hour (inside the 7-day
//     retention), then the relay's pending events on the same aggregates,
//     numbered after them; plus PUBLISHED events 8 days old on aggregates
//     of their own, for the purge; outbox_aggregate holds every
//     aggregate's last sequence;
//   - processed_event: n rows of 4 consumers with UUID-shaped event ids
//     (the order of the index is random, as with real ids), processed over
//     the last hour; plus rows 8 days old, for the purge.
//
// Then VACUUM ANALYZE, as autovacuum would have left them.
func benchScaleSeed(ctx context.Context, pool *pgxpool.Pool, n, expired, pending int) error {
	N, E, P, A := strconv.Itoa(n), strconv.Itoa(expired), strconv.Itoa(pending), strconv.Itoa(benchScaleAggregates)
	const respHeaders = `'{"Content-Type":["application/json"],"Location":["/rows/1"]}'::jsonb`
	stmts := []string{
		`INSERT INTO idempotency_key (key_hash, fingerprint, state, locked_until, response_status, response_headers,
			response_body, created_at, completed_at, expires_at)
		 SELECT sha256(convert_to('scale-key-' || g, 'UTF8')), sha256(convert_to('scale-fp-' || g, 'UTF8')), 'completed', NULL,
		        201, ` + respHeaders + `, convert_to('{"id":' || g || ',"status":"NEW"}', 'UTF8'),
		        t, t, t + interval '24 hours'
		 FROM (SELECT g, now() - (g % 3600) * interval '1 second' AS t FROM generate_series(1, ` + N + `) g) s`,
		`INSERT INTO idempotency_key (key_hash, fingerprint, state, locked_until, response_status, response_headers,
			response_body, created_at, completed_at, expires_at)
		 SELECT sha256(convert_to('scale-old-' || g, 'UTF8')), sha256(convert_to('scale-fp-' || g, 'UTF8')), 'completed', NULL,
		        201, ` + respHeaders + `, convert_to('{"id":' || g || ',"status":"NEW"}', 'UTF8'),
		        now() - interval '25 hours', now() - interval '25 hours', now() - interval '1 hour'
		 FROM generate_series(1, ` + E + `) g`,
		`INSERT INTO outbox_event (topic, aggregate_type, aggregate_id, aggregate_seq, event_id, event_type, payload,
			status, attempts, created_at, published_at)
		 SELECT 'bench.scale', 'order', 'agg-' || (g % ` + A + `), g / ` + A + ` + 1, 'kept-' || g, 'OrderCreated',
		        convert_to('{"order_id":"' || g || '","total_kopecks":1000,"note":"' || repeat('x', 60) || '"}', 'UTF8'),
		        'PUBLISHED', 1, t, t
		 FROM (SELECT g, now() - ((` + N + ` - g) % 3600) * interval '1 second' AS t FROM generate_series(0, ` + N + ` - 1) g) s`,
		// The pending events continue each aggregate's sequence: aggregate
		// a holds ceil((n - a) / A) retained events (none when a ≥ n).
		`INSERT INTO outbox_event (topic, aggregate_type, aggregate_id, aggregate_seq, event_id, event_type, payload)
		 SELECT 'bench.scale', 'order', 'agg-' || (g % ` + A + `),
		        greatest(0, (` + N + ` - g % ` + A + ` + ` + A + ` - 1) / ` + A + `) + g / ` + A + ` + 1, 'new-' || g, 'OrderCreated',
		        convert_to('{"order_id":"' || g || '","total_kopecks":1000,"note":"' || repeat('x', 60) || '"}', 'UTF8')
		 FROM generate_series(0, ` + P + ` - 1) g`,
		`INSERT INTO outbox_event (topic, aggregate_type, aggregate_id, aggregate_seq, event_id, event_type, payload,
			status, attempts, created_at, published_at)
		 SELECT 'bench.scale', 'order', 'gone-' || (g % ` + A + `), g / ` + A + ` + 1, 'gone-' || g, 'OrderCreated',
		        convert_to('{"order_id":"' || g || '","total_kopecks":1000,"note":"' || repeat('x', 60) || '"}', 'UTF8'),
		        'PUBLISHED', 1, now() - interval '8 days', now() - interval '8 days'
		 FROM generate_series(0, ` + E + ` - 1) g`,
		`INSERT INTO outbox_aggregate (aggregate_type, aggregate_id, last_seq)
		 SELECT aggregate_type, aggregate_id, max(aggregate_seq) FROM outbox_event GROUP BY 1, 2`,
		`INSERT INTO processed_event (consumer_id, event_id, processed_at)
		 SELECT 'billing-' || (g % 4), md5('scale-ev-' || g)::uuid::text, now() - (g % 3600) * interval '1 second'
		 FROM generate_series(1, ` + N + `) g`,
		`INSERT INTO processed_event (consumer_id, event_id, processed_at)
		 SELECT 'billing-' || (g % 4), md5('scale-old-' || g)::uuid::text, now() - interval '8 days'
		 FROM generate_series(1, ` + E + `) g`,
		`CREATE TABLE bench_scale_row (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, body text NOT NULL)`,
		`VACUUM ANALYZE idempotency_key, outbox_event, outbox_aggregate, processed_event`,
	}
	for _, q := range stmts {
		if _, err := pool.Exec(ctx, q); err != nil {
			return err
		}
	}
	return nil
}
