package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idemkit/idem/internal/cli"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/wal"
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

const outboxStatusUsage = `Usage: idem outbox status [--json] [--lease-ttl 60s] [--dead 20] [--slot NAME,...] [--lag-warn-bytes N]

Counts outbox events by status (PENDING, PUBLISHING, PUBLISHED, DEAD), the age
of the oldest pending event, PUBLISHING leases older than --lease-ttl (the
reaper will return them) and lists DEAD events with their last error.
DATABASE_URL selects the database (search_path selects the schema).

With --slot, also reports each named replication slot of the WAL outbox
(package outbox/wal): whether a relay reads it, its lag (WAL bytes past the
last confirmed event), the WAL it retains, the reader's flush lag, wal_status
and safe_wal_size. A slot lagging more than --lag-warn-bytes, or whose
wal_status is unreserved or lost, gets a warning line on stderr.`

// slotReport is one --slot line.
type slotReport struct {
	*wal.SlotStatus
	Warning string `json:"warning,omitempty"`
}

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
	slots := fs.String("slot", "", "comma list of WAL outbox replication slots to report")
	warnBytes := fs.Int64("lag-warn-bytes", wal.LagWarnBytesDefault, "warn when a slot lags more than this many bytes")
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
	if *warnBytes < 0 {
		return cli.Usagef("--lag-warn-bytes must not be negative")
	}
	var slotNames []string
	if *slots != "" {
		slotNames = strings.Split(*slots, ",")
		for _, n := range slotNames {
			if n == "" || len(n) > 63 || strings.Trim(n, "abcdefghijklmnopqrstuvwxyz0123456789_") != "" {
				return cli.Usagef("--slot: %q is not a slot name (a-z, 0-9, _)", n)
			}
		}
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
	var reports []slotReport
	for _, n := range slotNames {
		ss, err := wal.GetSlotStatus(ctx, pool, n)
		if err != nil {
			return err
		}
		rep := slotReport{SlotStatus: ss}
		switch {
		case ss.WALStatus == "lost":
			rep.Warning = "the slot is lost: WAL past max_slot_wal_keep_size was removed, events in it are gone; drop and recreate the slot"
		case ss.WALStatus == "unreserved":
			rep.Warning = "the slot is past max_slot_wal_keep_size: its WAL will be removed at the next checkpoint"
		case ss.LagBytes > *warnBytes:
			rep.Warning = fmt.Sprintf("the slot lags %d bytes, past --lag-warn-bytes %d: its relay is down or stuck, and the WAL it retains grows", ss.LagBytes, *warnBytes)
		}
		if rep.Warning != "" {
			fmt.Fprintf(os.Stderr, "warning: slot %s: %s\n", n, rep.Warning)
		}
		reports = append(reports, rep)
	}
	if *asJSON {
		if slotNames == nil {
			return json.NewEncoder(os.Stdout).Encode(st)
		}
		return json.NewEncoder(os.Stdout).Encode(struct {
			*outbox.Status
			Slots []slotReport `json:"slots"`
		}{st, reports})
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "pending\t%d\n", st.Pending)
	fmt.Fprintf(tw, "publishing\t%d\n", st.Publishing)
	fmt.Fprintf(tw, "published\t%d\n", st.Published)
	fmt.Fprintf(tw, "dead\t%d\n", st.Dead)
	fmt.Fprintf(tw, "discarded\t%d\n", st.Discarded)
	fmt.Fprintf(tw, "expired leases\t%d\t(older than %s)\n", st.ExpiredLeases, *leaseTTL)
	fmt.Fprintf(tw, "oldest pending\t%s\n", st.OldestPending.Round(time.Millisecond))
	for _, r := range reports {
		safe := "unlimited"
		if r.SafeWALSize != nil {
			safe = fmt.Sprintf("%d bytes", *r.SafeWALSize)
		}
		fmt.Fprintf(tw, "slot %s\tactive %t, lag %d bytes, retains %d bytes, flush lag %s, wal_status %s, safe_wal_size %s\n",
			r.Slot, r.Active, r.LagBytes, r.RetainedBytes, r.FlushLag.Round(time.Millisecond), r.WALStatus, safe)
	}
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
