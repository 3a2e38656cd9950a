package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idemkit/idem/internal/cli"
	"github.com/idemkit/idem/outbox"
)

const outboxListUsage = `Usage: idem outbox list [--status PENDING|PUBLISHING|PUBLISHED|DEAD|DISCARDED]
                        [--aggregate TYPE/ID] [--topic T] [--limit N] [--json]

Lists outbox events in enqueue order (oldest first), without payloads
(idem outbox show ID prints one).`

const outboxShowUsage = `Usage: idem outbox show ID [--json]

Prints one event by its event id: status, attempts, last error, lease,
timestamps, headers, the payload (pretty-printed when it is JSON) and the
audit trail of operator actions.`

const outboxRequeueUsage = `Usage: idem outbox requeue ID... [--reason TEXT] [--actor NAME] [--json]
       idem outbox requeue --dead [--aggregate TYPE/ID] [--topic T] [--reason TEXT]

Returns DEAD events to PENDING with their attempts reset; the relay then
publishes them and the later events of their aggregates they held back.
Each requeue is recorded in the row's audit trail (actor, reason, time).
An event that is not DEAD (already requeued, PUBLISHED, DISCARDED) or
unknown is refused with its reason, and the exit status is 1.`

const outboxDiscardUsage = `Usage: idem outbox discard ID --reason TEXT [--actor NAME] [--json]

Moves a DEAD event to DISCARDED, a terminal state: it is never published,
and the later events of its aggregate are (consumers see a gap in
aggregate-seq). The row stays with its payload and the audit entry. Only a
DEAD event can be discarded.`

// parseInterspersed parses flags that may come before, between or after
// positional arguments (idem outbox discard ID --reason TEXT), and returns
// the positional ones.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := cli.Parse(fs, args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// defaultActor names the operator in the audit trail: the login name.
func defaultActor() string {
	for _, k := range []string{"USER", "LOGNAME", "USERNAME"} {
		if v := os.Getenv(k); v != "" {
			return v
		}
	}
	return "cli"
}

// aggregateFlag parses TYPE/ID.
func aggregateFlag(v string) (typ, id string, err error) {
	if v == "" {
		return "", "", nil
	}
	typ, id, ok := strings.Cut(v, "/")
	if !ok || typ == "" || id == "" {
		return "", "", cli.Usagef("--aggregate %q: want TYPE/ID (for example order/42)", v)
	}
	return typ, id, nil
}

func outboxAdmin(ctx context.Context) (*outbox.Admin, func(), error) {
	pool, err := cli.Connect(ctx, cli.DatabaseURL())
	if err != nil {
		return nil, nil, err
	}
	return outbox.NewAdmin(pool), pool.Close, nil
}

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func runOutboxList(ctx context.Context, args []string) error {
	fs := cli.FlagSet("outbox list", outboxListUsage)
	asJSON := fs.Bool("json", false, "print a JSON array (with payloads)")
	status := fs.String("status", "", "only events in this status")
	aggregate := fs.String("aggregate", "", "only events of this aggregate, TYPE/ID")
	topic := fs.String("topic", "", "only events to this topic")
	limit := fs.Int("limit", outbox.ListLimitDefault, fmt.Sprintf("at most this many events (1..%d)", outbox.ListLimitMax))
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return cli.Usagef("unexpected argument %q", pos[0])
	}
	*status = strings.ToUpper(*status)
	if *status != "" && !outbox.ValidStatus(*status) {
		return cli.Usagef("--status %q: want PENDING, PUBLISHING, PUBLISHED, DEAD or DISCARDED", *status)
	}
	if *limit < 1 || *limit > outbox.ListLimitMax {
		return cli.Usagef("--limit %d: want 1..%d", *limit, outbox.ListLimitMax)
	}
	f := outbox.ListFilter{Status: *status, Topic: *topic, Limit: *limit}
	if f.AggregateType, f.AggregateID, err = aggregateFlag(*aggregate); err != nil {
		return err
	}
	admin, done, err := outboxAdmin(ctx)
	if err != nil {
		return err
	}
	defer done()
	events, err := admin.List(ctx, f)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(events)
	}
	ts := func(s string) string { return termSafe(s, false) }
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "event id\tstatus\ttopic\taggregate\tseq\ttype\tattempts\tcreated\tlast error")
	for _, e := range events {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s/%s\t%d\t%s\t%d\t%s\t%s\n", ts(e.EventID), e.Status, ts(e.Topic), ts(e.AggregateType), ts(e.AggregateID),
			e.Seq, ts(e.EventType), e.Attempts, e.CreatedAt.UTC().Format(time.RFC3339), oneLineText(e.LastError, 80))
	}
	return tw.Flush()
}

func runOutboxShow(ctx context.Context, args []string) error {
	fs := cli.FlagSet("outbox show", outboxShowUsage)
	asJSON := fs.Bool("json", false, "print one JSON object")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return cli.Usagef("want exactly one event id, got %d", len(pos))
	}
	admin, done, err := outboxAdmin(ctx)
	if err != nil {
		return err
	}
	defer done()
	e, err := admin.Show(ctx, pos[0])
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(e)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	ss := func(s string) string { return termSafe(s, false) }
	ts := func(t *time.Time) string {
		if t == nil {
			return "-"
		}
		return t.UTC().Format(time.RFC3339Nano)
	}
	fmt.Fprintf(tw, "event id\t%s\n", ss(e.EventID))
	fmt.Fprintf(tw, "status\t%s\n", e.Status)
	fmt.Fprintf(tw, "topic\t%s\n", ss(e.Topic))
	fmt.Fprintf(tw, "aggregate\t%s/%s (seq %d)\n", ss(e.AggregateType), ss(e.AggregateID), e.Seq)
	fmt.Fprintf(tw, "type\t%s\n", ss(e.EventType))
	fmt.Fprintf(tw, "attempts\t%d\n", e.Attempts)
	fmt.Fprintf(tw, "last error\t%s\n", oneLineText(e.LastError, 2000))
	fmt.Fprintf(tw, "available at\t%s\n", ts(&e.AvailableAt))
	if e.LeaseOwner != "" {
		fmt.Fprintf(tw, "lease\t%s since %s\n", ss(e.LeaseOwner), ts(e.LockedAt))
	}
	fmt.Fprintf(tw, "created at\t%s\n", ts(&e.CreatedAt))
	fmt.Fprintf(tw, "published at\t%s\n", ts(e.PublishedAt))
	for k, v := range e.Headers {
		fmt.Fprintf(tw, "header\t%s: %s\n", ss(k), ss(v))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Println("payload:")
	if e.PayloadIsJSON() {
		var b bytes.Buffer
		_ = json.Indent(&b, e.Payload, "  ", "  ")
		fmt.Printf("  %s\n", termSafe(b.String(), true))
	} else {
		fmt.Printf("  %q\n", e.Payload)
	}
	if len(e.Audit) > 0 {
		fmt.Println("audit:")
		for _, a := range e.Audit {
			fmt.Printf("  %s  %s by %s (was %s): %s\n", a.At.UTC().Format(time.RFC3339), ss(a.Action), ss(a.Actor), ss(a.From), ss(a.Reason))
		}
	}
	return nil
}

// adminResult is the --json answer of requeue and discard.
type adminResult struct {
	Action  string       `json:"action"`
	Done    []string     `json:"done"`
	Refused []adminError `json:"refused"`
}

type adminError struct {
	EventID string `json:"event_id"`
	Status  string `json:"status,omitempty"`
	Error   string `json:"error"`
}

func (r *adminResult) refuse(id string, err error) {
	ae := adminError{EventID: id, Error: err.Error()}
	var se *outbox.StateError
	if errors.As(err, &se) {
		ae.Status = se.Status
	}
	r.Refused = append(r.Refused, ae)
}

// finish prints r and returns the exit error when something was refused.
func (r *adminResult) finish(asJSON bool) error {
	if asJSON {
		if err := printJSON(r); err != nil {
			return err
		}
	} else {
		for _, id := range r.Done {
			fmt.Printf("%s %s\n", strings.TrimSuffix(r.Action, "e")+"ed", id)
		}
		if len(r.Done) == 0 && len(r.Refused) == 0 {
			fmt.Printf("nothing to %s\n", r.Action)
		}
	}
	switch len(r.Refused) {
	case 0:
		return nil
	case 1:
		return errors.New(r.Refused[0].Error)
	}
	return fmt.Errorf("%d of %d events refused; first: %s", len(r.Refused), len(r.Refused)+len(r.Done), r.Refused[0].Error)
}

func runOutboxRequeue(ctx context.Context, args []string) error {
	fs := cli.FlagSet("outbox requeue", outboxRequeueUsage)
	asJSON := fs.Bool("json", false, "print one JSON object: {action, done, refused}")
	dead := fs.Bool("dead", false, "requeue every DEAD event (of --aggregate, --topic)")
	aggregate := fs.String("aggregate", "", "with --dead: only this aggregate, TYPE/ID")
	topic := fs.String("topic", "", "with --dead: only this topic")
	reason := fs.String("reason", "", "why, for the audit trail")
	actor := fs.String("actor", defaultActor(), "who, for the audit trail")
	ids, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	switch {
	case *dead && len(ids) > 0:
		return cli.Usagef("give event ids or --dead, not both")
	case !*dead && len(ids) == 0:
		return cli.Usagef("missing event id (or --dead)")
	case !*dead && (*aggregate != "" || *topic != ""):
		return cli.Usagef("--aggregate and --topic select events only with --dead")
	}
	f := outbox.ListFilter{Topic: *topic}
	if f.AggregateType, f.AggregateID, err = aggregateFlag(*aggregate); err != nil {
		return err
	}
	admin, done, err := outboxAdmin(ctx)
	if err != nil {
		return err
	}
	defer done()
	act := outbox.Action{Actor: *actor, Reason: *reason}
	res := &adminResult{Action: "requeue", Done: []string{}, Refused: []adminError{}}
	if *dead {
		if res.Done, err = admin.RequeueDead(ctx, f, act); err != nil {
			return err
		}
		return res.finish(*asJSON)
	}
	for _, id := range ids {
		switch err := admin.Requeue(ctx, id, act); {
		case err == nil:
			res.Done = append(res.Done, id)
		case errors.Is(err, outbox.ErrWrongState), errors.Is(err, outbox.ErrEventNotFound):
			res.refuse(id, err)
		default:
			return err
		}
	}
	return res.finish(*asJSON)
}

func runOutboxDiscard(ctx context.Context, args []string) error {
	fs := cli.FlagSet("outbox discard", outboxDiscardUsage)
	asJSON := fs.Bool("json", false, "print one JSON object: {action, done, refused}")
	reason := fs.String("reason", "", "why the event must never be delivered (required)")
	actor := fs.String("actor", defaultActor(), "who, for the audit trail")
	ids, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(ids) != 1 {
		return cli.Usagef("want exactly one event id, got %d", len(ids))
	}
	if strings.TrimSpace(*reason) == "" {
		return cli.Usagef("--reason is required: say why the event must never be delivered")
	}
	admin, done, err := outboxAdmin(ctx)
	if err != nil {
		return err
	}
	defer done()
	res := &adminResult{Action: "discard", Done: []string{}, Refused: []adminError{}}
	switch err := admin.Discard(ctx, ids[0], outbox.Action{Actor: *actor, Reason: *reason}); {
	case err == nil:
		res.Done = append(res.Done, ids[0])
	case errors.Is(err, outbox.ErrWrongState), errors.Is(err, outbox.ErrEventNotFound):
		res.refuse(ids[0], err)
	default:
		return err
	}
	return res.finish(*asJSON)
}
