package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/idemkit/idem/internal/cli"
	"github.com/idemkit/idem/outbox"
)

func init() {
	register(&cli.Command{Name: "outbox", Summary: "outbox events: status | list | show | requeue | discard", Run: runOutbox})
}

const outboxUsage = `Usage: idem outbox status|list|show|requeue|discard [flags]

  status    counts by status, oldest pending age, expired leases, DEAD events
  list      events by --status, --aggregate TYPE/ID, --topic, --limit
  show ID   one event: payload, headers, attempts, last error, lease, audit trail
  requeue ID... | --dead   DEAD events back to PENDING (attempts reset)
  discard ID --reason TEXT  a DEAD event to DISCARDED (never published;
            the later events of its aggregate flow again)

Run 'idem outbox ACTION --help' for an action's flags. Every action takes
--json. DATABASE_URL selects the database (search_path selects the schema).`

const outboxStatusUsage = `Usage: idem outbox status [--json] [--lease-ttl 60s] [--dead 20]

Counts outbox events by status (PENDING, PUBLISHING, PUBLISHED, DEAD), the age
of the oldest pending event, PUBLISHING leases older than --lease-ttl (the
reaper will return them) and lists DEAD events with their last error.
DATABASE_URL selects the database (search_path selects the schema).`

func runOutbox(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return cli.Usagef("missing action: status, list, show, requeue or discard")
	}
	if args[0] == "-h" || args[0] == "--help" {
		fmt.Println(outboxUsage)
		return nil
	}
	switch args[0] {
	case "status":
		return runOutboxStatus(ctx, args[1:])
	case "list":
		return runOutboxList(ctx, args[1:])
	case "show":
		return runOutboxShow(ctx, args[1:])
	case "requeue":
		return runOutboxRequeue(ctx, args[1:])
	case "discard":
		return runOutboxDiscard(ctx, args[1:])
	}
	return cli.Usagef("unknown action %q: want status, list, show, requeue or discard", args[0])
}

func runOutboxStatus(ctx context.Context, args []string) error {
	fs := cli.FlagSet("outbox status", outboxStatusUsage)
	asJSON := fs.Bool("json", false, "print one JSON object")
	leaseTTL := fs.Duration("lease-ttl", outbox.LeaseTTLDefault, "lease age counted as expired (the relays' LeaseTTL)")
	maxDead := fs.Int("dead", 20, "list at most this many DEAD events")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.Usagef("unexpected argument %q", fs.Arg(0))
	}
	if *leaseTTL <= 0 {
		return cli.Usagef("--lease-ttl must be positive")
	}
	if *maxDead < 0 {
		return cli.Usagef("--dead must not be negative")
	}
	pool, err := cli.Connect(ctx, cli.DatabaseURL())
	if err != nil {
		return err
	}
	defer pool.Close()
	st, err := outbox.GetStatus(ctx, pool, *leaseTTL, *maxDead)
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(os.Stdout).Encode(st)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "pending\t%d\n", st.Pending)
	fmt.Fprintf(tw, "publishing\t%d\n", st.Publishing)
	fmt.Fprintf(tw, "published\t%d\n", st.Published)
	fmt.Fprintf(tw, "dead\t%d\n", st.Dead)
	fmt.Fprintf(tw, "discarded\t%d\n", st.Discarded)
	fmt.Fprintf(tw, "expired leases\t%d\t(older than %s)\n", st.ExpiredLeases, *leaseTTL)
	fmt.Fprintf(tw, "oldest pending\t%s\n", st.OldestPending.Round(time.Millisecond))
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(st.DeadEvents) > 0 {
		fmt.Println("\ndead events (each holds back the rest of its aggregate; idem outbox requeue ID releases it):")
		tw = tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "event id\taggregate\tseq\ttype\tattempts\tlast error")
		for _, d := range st.DeadEvents {
			fmt.Fprintf(tw, "%s\t%s/%s\t%d\t%s\t%d\t%s\n", d.EventID, d.AggregateType, d.AggregateID, d.Seq, d.EventType, d.Attempts, d.LastError)
		}
		return tw.Flush()
	}
	return nil
}
