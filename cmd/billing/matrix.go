package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idemkit/idem/examples/billing/chaos"
	"github.com/idemkit/idem/internal/cli"
)

// matrixRow is one combination of billing chaos --matrix: a broker (and
// Kafka client), an outbox mode and an idempotency store.
type matrixRow struct {
	broker, client, outbox, store string
}

func (m matrixRow) String() string {
	b := m.broker
	if m.client != "" {
		b = m.client
	}
	return b + "/" + m.outbox + "/" + m.store
}

// matrixRows is every combination, in the order the table prints them:
// broker {kafka franz-go, kafka kafka-go, nats} × outbox {table, wal} ×
// store {postgres, redis}.
func matrixRows() []matrixRow {
	var rows []matrixRow
	for _, b := range []struct{ broker, client string }{{chaos.BrokerKafka, "franz"}, {chaos.BrokerKafka, "kafkago"}, {chaos.BrokerNATS, ""}} {
		for _, o := range []string{chaos.OutboxTable, chaos.OutboxWAL} {
			for _, s := range []string{"postgres", "redis"} {
				rows = append(rows, matrixRow{b.broker, b.client, o, s})
			}
		}
	}
	return rows
}

// matrixResult is one row's outcome.
type matrixResult struct {
	row     matrixRow
	skipped string // why the row did not run
	rep     *chaos.Report
	err     error
	wall    time.Duration
}

// selectRows picks the rows named in only (comma-separated, as the table
// names them), or all of them.
func selectRows(only string) ([]matrixRow, error) {
	all := matrixRows()
	if only == "" {
		return all, nil
	}
	var out []matrixRow
	for _, name := range strings.Split(only, ",") {
		name = strings.TrimSpace(name)
		found := false
		for _, r := range all {
			if r.String() == name {
				out = append(out, r)
				found = true
			}
		}
		if !found {
			var names []string
			for _, r := range all {
				names = append(names, r.String())
			}
			return nil, cli.Usagef("--matrix-rows: no row %q; the rows are %s", name, strings.Join(names, ", "))
		}
	}
	return out, nil
}

// runMatrix runs the harness once per row and prints one table. A row the
// harness refuses (a usage error) or whose infrastructure is missing (no
// Redis) is skipped with the reason; any row that fails fails the whole.
func runMatrix(ctx context.Context, h *harnessFlags, pgtempFallback bool) error {
	rows, err := selectRows(h.matrixRows)
	if err != nil {
		return err
	}
	if h.report != "" {
		return cli.Usagef("--report is for one run, not with --matrix")
	}
	var results []matrixResult
	for _, row := range rows {
		res := matrixResult{row: row}
		rh := *h
		rh.cfg.Broker, rh.cfg.OutboxMode = row.broker, row.outbox
		rh.cfg.Env = append([]string(nil), h.cfg.Env...)
		if row.client != "" {
			rh.cfg.Env = append(rh.cfg.Env, "KAFKA_CLIENT="+row.client)
		}
		if row.outbox == chaos.OutboxWAL && rh.cfg.PGRestarts == 0 {
			// Creating a replication slot waits for every transaction
			// running on the server: on a shared server that can take the
			// whole run. Billing gets a throwaway cluster of its own (with
			// wal_level=logical), crashed once.
			rh.cfg.PGRestarts = 1
		}
		if row.broker == chaos.BrokerNATS {
			// The faults below the broker are Kafka's.
			rh.cfg.NetCuts, rh.cfg.ProduceFailRate = 0, 0
		}
		if row.store == "redis" {
			store, why := matrixRedis()
			if why != "" {
				res.skipped = why
				results = append(results, res)
				fmt.Fprintf(os.Stderr, "matrix %s: skipped: %s\n", row, why)
				continue
			}
			rh.cfg.Env = append(rh.cfg.Env, "IDEMPOTENCY_STORE="+store)
		}
		fmt.Fprintf(os.Stderr, "matrix %s: running\n", row)
		start := time.Now()
		res.rep, res.err = runOne(ctx, &rh, pgtempFallback)
		res.wall = time.Since(start)
		var ue *cli.UsageError
		if errors.As(res.err, &ue) {
			res.skipped, res.err, res.rep = "refused: "+ue.Msg, nil, nil
			fmt.Fprintf(os.Stderr, "matrix %s: skipped: %s\n", row, ue.Msg)
		}
		results = append(results, res)
		if ctx.Err() != nil {
			break
		}
	}
	failed := writeMatrix(os.Stdout, results)
	if failed > 0 {
		return fmt.Errorf("matrix: %d of %d rows failed", failed, len(results))
	}
	return nil
}

// writeMatrix prints the table and returns the number of rows that failed.
func writeMatrix(w *os.File, results []matrixResult) int {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "\ncombination\tPOSTs\tkills\tterms\trestarts\tviolations\tlinearizable\twall\tverdict")
	failed := 0
	var skipped []string
	for _, r := range results {
		switch {
		case r.skipped != "":
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t-\t-\tskipped\n", r.row)
			skipped = append(skipped, fmt.Sprintf("  %s: %s", r.row, r.skipped))
		case r.rep == nil:
			failed++
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t-\t%.0fs\tERROR %v\n", r.row, r.wall.Seconds(), r.err)
		default:
			verdict := "PASS"
			if r.err != nil || !r.rep.Pass {
				verdict = "FAIL"
				failed++
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t%.0fs\t%s\n", r.row, r.rep.Operations, r.rep.Kills, r.rep.Terms,
				r.rep.Restarts, len(r.rep.Violations), r.rep.Linearizable, r.wall.Seconds(), verdict)
		}
	}
	_ = tw.Flush()
	if len(skipped) > 0 {
		fmt.Fprintln(w, "skipped:")
		for _, s := range skipped {
			fmt.Fprintln(w, s)
		}
	}
	return failed
}

// matrixRedis is the IDEMPOTENCY_STORE of a Redis row, under a prefix of
// its own, or why there is none (no Redis reachable at REDIS_URL, else
// the local server).
func matrixRedis() (store, why string) {
	base := cli.Env("REDIS_URL", redisURLDefault)
	u, err := url.Parse(base)
	if err != nil || u.Host == "" {
		return "", fmt.Sprintf("REDIS_URL %s is not a redis:// URL with a host", cli.Redact(base))
	}
	c, err := net.DialTimeout("tcp", u.Host, 2*time.Second)
	if err != nil {
		return "", fmt.Sprintf("no Redis at %s (%v): set REDIS_URL", u.Host, err)
	}
	_ = c.Close()
	var b [4]byte
	_, _ = rand.Read(b[:])
	q := u.Query()
	q.Set("prefix", "{chaos-"+hex.EncodeToString(b[:])+"}:")
	u.RawQuery = q.Encode()
	return u.String(), ""
}
