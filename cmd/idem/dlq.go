package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/internal/cli"
	"github.com/idemkit/idem/kafka"
)

func init() {
	register(&cli.Command{Name: "dlq", Summary: "dead-letter topics: list | show | redrive", Run: runDLQ})
}

const dlqUsage = `Usage: idem dlq list TOPIC [--limit N] [--offset O [--partition P]] [--json]
       idem dlq show TOPIC PARTITION OFFSET [--json]
       idem dlq redrive --from TOPIC.dlq --reason WHY [--actor WHO] [--to TOPIC]
                        [--filter-error SUBSTR] [--force] [--dry-run] [--json]

Reads the dead-letter topics the consumers write (<topic>.dlq, records
with dlq-error, dlq-source, dlq-attempts and dlq-consumer headers) and
republishes their records to their source topic with their key, value and
original headers, plus a dlq-redrive-id header naming the dead-letter
record. list reads the newest --limit records (at most that many per
partition, from the end), or with --offset the first --limit from that
offset on.

A redrive is recorded in the database (DATABASE_URL, migrations applied):
one idem_admin_audit row (action dlq.redrive, --actor, --reason, the
records moved: topic/partition/offset and destination) and one
idem_dlq_redrive row per record, also logged on stderr. --reason is
required; --actor defaults to the OS user, with a warning. Redrives of one
topic are serialized by an advisory lock: a record already redriven (the
ledger says so, or its copy is on the destination) is skipped and listed
as such, also when two redrives run at once; --force redrives it again.
The consumer's inbox makes a replay of an event it did process harmless.

KAFKA_BROKERS (comma list) selects the cluster; default 127.0.0.1:9092.`

func dlqClient() *kafka.DLQ {
	brokers := strings.Split(cli.Env("KAFKA_BROKERS", "127.0.0.1:9092"), ",")
	return kafka.NewDLQ(kgo.SeedBrokers(brokers...), kgo.DialTimeout(5*time.Second))
}

func runDLQ(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return cli.Usagef("missing action: list, show or redrive")
	}
	switch args[0] {
	case "-h", "--help":
		fmt.Println(dlqUsage)
		return nil
	case "list":
		return runDLQList(ctx, args[1:])
	case "show":
		return runDLQShow(ctx, args[1:])
	case "redrive":
		return runDLQRedrive(ctx, args[1:])
	}
	return cli.Usagef("unknown action %q: want list, show or redrive", args[0])
}

// dlqView is a record as --json prints it: value as JSON when it is.
type dlqView struct {
	kafka.DeadLetterRecord
	ID          string            `json:"id"`
	Key         string            `json:"key"`
	Value       json.RawMessage   `json:"value,omitempty"`
	ValueBase64 []byte            `json:"value_base64,omitempty"`
	Headers     map[string]string `json:"headers"`
}

func viewOf(r kafka.DeadLetterRecord) dlqView {
	v := dlqView{DeadLetterRecord: r, ID: r.ID(), Key: string(r.Key), Headers: r.HeaderMap()}
	if len(r.Value) > 0 && json.Valid(r.Value) {
		v.Value = r.Value
	} else {
		v.ValueBase64 = r.Value
	}
	return v
}

// withTimeout bounds a command that reads a topic to its end.
func withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, d)
}

func runDLQList(ctx context.Context, args []string) error {
	fs := cli.FlagSet("dlq list", dlqUsage)
	asJSON := fs.Bool("json", false, "print a JSON array")
	limit := fs.Int("limit", 100, "at most this many records, the newest (0: all)")
	offset := fs.Int64("offset", -1, "read from this offset of each partition on, instead of the newest")
	partition := fs.Int("partition", -1, "read this partition only")
	timeout := fs.Duration("timeout", time.Minute, "give up reading after this long")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return cli.Usagef("want one topic (for example orders.events.dlq), got %d arguments", len(pos))
	}
	if *limit < 0 {
		return cli.Usagef("--limit must not be negative")
	}
	if flagSet(fs, "offset") && *offset < 0 {
		return cli.Usagef("--offset must not be negative")
	}
	lo := kafka.ListOptions{Limit: *limit, Offset: *offset}
	if flagSet(fs, "partition") {
		if *partition < 0 || *partition > math.MaxInt32 {
			return cli.Usagef("--partition must be a non-negative integer")
		}
		lo.Partitions = []int32{int32(*partition)}
	}
	ctx, cancel := withTimeout(ctx, *timeout)
	defer cancel()
	recs, err := dlqClient().ListFrom(ctx, pos[0], lo)
	if err != nil {
		return err
	}
	if *asJSON {
		views := make([]dlqView, 0, len(recs))
		for _, r := range recs {
			views = append(views, viewOf(r))
		}
		return printJSON(views)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "partition\toffset\ttime\tevent id\tsource\tattempts\terror")
	for _, r := range recs {
		fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%s\t%d\t%s\n", r.Partition, r.Offset, r.Timestamp.UTC().Format(time.RFC3339),
			termSafe(r.EventID, false), termSafe(r.Source, false), r.Attempts, oneLineText(r.Error, 80))
	}
	return tw.Flush()
}

func runDLQShow(ctx context.Context, args []string) error {
	fs := cli.FlagSet("dlq show", dlqUsage)
	asJSON := fs.Bool("json", false, "print one JSON object")
	timeout := fs.Duration("timeout", time.Minute, "give up reading after this long")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 3 {
		return cli.Usagef("want TOPIC PARTITION OFFSET, got %d arguments", len(pos))
	}
	part, err := strconv.ParseInt(pos[1], 10, 32)
	if err != nil || part < 0 {
		return cli.Usagef("partition %q is not a non-negative integer", pos[1])
	}
	off, err := strconv.ParseInt(pos[2], 10, 64)
	if err != nil || off < 0 {
		return cli.Usagef("offset %q is not a non-negative integer", pos[2])
	}
	ctx, cancel := withTimeout(ctx, *timeout)
	defer cancel()
	r, err := dlqClient().Show(ctx, pos[0], int32(part), off)
	if err != nil {
		return err
	}
	v := viewOf(*r)
	if *asJSON {
		return printJSON(v)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "record\t%s\n", termSafe(v.ID, false))
	fmt.Fprintf(tw, "time\t%s\n", r.Timestamp.UTC().Format(time.RFC3339Nano))
	fmt.Fprintf(tw, "key\t%q\n", r.Key)
	fmt.Fprintf(tw, "error\t%s\n", oneLineText(r.Error, 1100))
	fmt.Fprintf(tw, "source\t%s\n", termSafe(r.Source, false))
	fmt.Fprintf(tw, "attempts\t%d\n", r.Attempts)
	fmt.Fprintf(tw, "consumer\t%s\n", termSafe(r.Consumer, false))
	for _, h := range r.Headers {
		fmt.Fprintf(tw, "header\t%s: %s\n", termSafe(h.Key, false), oneLineText(string(h.Value), 200))
	}
	if r.Truncated {
		printTruncated(tw, r)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if v.Value != nil {
		fmt.Printf("value:\n  %s\n", termSafe(string(v.Value), true))
	} else {
		fmt.Printf("value:\n  %q\n", r.Value)
	}
	return nil
}

func runDLQRedrive(ctx context.Context, args []string) error {
	fs := cli.FlagSet("dlq redrive", dlqUsage)
	asJSON := fs.Bool("json", false, "print the report as one JSON object")
	from := fs.String("from", "", "the dead-letter topic (required)")
	to := fs.String("to", "", "the destination (defaults to each record's dlq-source topic)")
	filter := fs.String("filter-error", "", "only records whose dlq-error contains this")
	dry := fs.Bool("dry-run", false, "report what would move; produce nothing, record nothing")
	force := fs.Bool("force", false, "redrive records already redriven too (recorded as forced)")
	who := fs.String("actor", "", "who acts, for the audit trail (default: the OS user)")
	reason := fs.String("reason", "", "why, for the audit trail (required)")
	timeout := fs.Duration("timeout", 5*time.Minute, "give up after this long (a rerun continues where it stopped)")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return cli.Usagef("unexpected argument %q", pos[0])
	}
	if *from == "" {
		return cli.Usagef("--from is required (for example --from orders.events.dlq)")
	}
	if *to == *from {
		return cli.Usagef("--to must differ from --from")
	}
	actor := *who
	if !*dry {
		var err error
		if actor, err = auditActor(*who, *reason); err != nil {
			return err
		}
	}
	ctx, cancel := withTimeout(ctx, *timeout)
	defer cancel()
	pool, err := cli.Connect(ctx, cli.DatabaseURL())
	if err != nil {
		return err
	}
	defer pool.Close()
	rep, rerr := dlqClient().Redrive(ctx, kafka.RedriveOptions{From: *from, To: *to, FilterError: *filter, DryRun: *dry,
		DB: pool, Actor: actor, Reason: *reason, Force: *force})
	if rep != nil && !rep.DryRun {
		logRedrive(*from, actor, *reason, rep, rerr)
	}
	if rep != nil {
		if *asJSON {
			if err := printJSON(rep); err != nil {
				return err
			}
		} else {
			verb := "redriven"
			if rep.DryRun {
				verb = "would redrive"
			}
			for _, m := range rep.Moved {
				fmt.Printf("%s %s -> %s (event %s)\n", verb, termSafe(m.ID, false), termSafe(m.To, false), termSafe(m.EventID, false))
			}
			for _, m := range rep.AlreadyRedriven {
				if m.AuditID != 0 {
					fmt.Printf("skipped %s: already redriven to %s by %s at %s (audit row %d; --force redrives it again)\n", termSafe(m.ID, false),
						termSafe(m.To, false), termSafe(m.RedrivenBy, false), m.RedrivenAt.UTC().Format(time.RFC3339), m.AuditID)
					continue
				}
				fmt.Printf("skipped %s: already on %s (--force redrives it again)\n", termSafe(m.ID, false), termSafe(m.To, false))
			}
			printRefused(rep.Refused)
			fmt.Printf("%d %s, %d already redriven, %d filtered out\n", len(rep.Moved), verb, len(rep.AlreadyRedriven), rep.Filtered)
			if rep.AuditID != 0 {
				fmt.Printf("recorded as audit row %d (actor %s)\n", rep.AuditID, termSafe(actor, false))
			}
		}
	}
	if rerr != nil {
		if errors.Is(rerr, context.DeadlineExceeded) {
			return fmt.Errorf("%w (run it again: records already redriven are skipped)", rerr)
		}
		return rerr
	}
	return nil
}

// logRedrive logs a redrive on stderr: who, why, and each record moved.
func logRedrive(from, actor, reason string, rep *kafka.RedriveReport, err error) {
	moved := make([]string, 0, min(len(rep.Moved), 51))
	for i, m := range rep.Moved {
		if i == 50 { // the audit row has them all
			moved = append(moved, fmt.Sprintf("... %d more", len(rep.Moved)-i))
			break
		}
		moved = append(moved, termSafe(m.ID, false)+"->"+termSafe(m.To, false))
	}
	args := []any{"action", "dlq.redrive", "subject", from, "actor", actor, "reason", reason, "audit_id", rep.AuditID,
		"forced", rep.Forced, "moved", strings.Join(moved, ","), "already_redriven", len(rep.AlreadyRedriven)}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err != nil {
		log.Warn("action", append(args, "err", err)...)
		return
	}
	log.Info("action", args...)
}
