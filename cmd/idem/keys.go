package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/cli"
)

func init() {
	register(&cli.Command{Name: "keys", Summary: "one idempotency key: show | release", Run: runKeys})
}

const keysUsage = `Usage: idem keys show|release --principal P --route R --key K [flags]

Keys are stored only as a hash of (principal, method, route, key): give the
parts and the record is found by their hash. The route is what the
middleware scopes by: the mux pattern (billing: "POST /orders/{id}/confirm")
or, without one, the request path.

  show     state (claimed, released, completed, or in_transaction for an
           uncommitted transactional claim), whether a request holds it,
           the stored response status, expiry; with --body, whether that
           body would be replayed (same fingerprint) or refused as a
           mismatch
  release  free a key stuck in progress (two-step mode): the next request
           with the same body runs the handler again, and the stuck
           handler, if it still runs, can no longer store its answer.
           --forget deletes the record instead (a completed key too).
           --fence N (required) is the fence that show printed: release
           acts on that claim only, never on a retry that took the key
           over since. A live lease is refused unless --force. --reason
           (required) and --actor (default: the OS user, with a warning)
           are recorded in the idem_admin_audit table and on stderr.

DATABASE_URL selects the database.`

type keyFlags struct {
	principal, method, route, key *string
	asJSON                        *bool
}

func keyFlagSet(name string) (*flag.FlagSet, *keyFlags) {
	fs := cli.FlagSet("keys "+name, keysUsage)
	return fs, &keyFlags{
		principal: fs.String("principal", "", "the principal (scope) that used the key (required)"),
		method:    fs.String("method", "POST", "the request method"),
		route:     fs.String("route", "", `the route as scoped: a mux pattern such as "POST /orders/{id}/confirm", or the path (required)`),
		key:       fs.String("key", "", "the Idempotency-Key (required)"),
		asJSON:    fs.Bool("json", false, "print one JSON object"),
	}
}

func (k *keyFlags) hash() (idempotency.KeyHash, error) {
	for _, f := range []struct{ name, v string }{{"--principal", *k.principal}, {"--route", *k.route}, {"--key", *k.key}} {
		if f.v == "" {
			return idempotency.KeyHash{}, cli.Usagef("%s is required", f.name)
		}
	}
	*k.method = strings.ToUpper(*k.method)
	return idempotency.HashKey(*k.principal, *k.method, *k.route, *k.key), nil
}

func runKeys(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return cli.Usagef("missing action: show or release")
	}
	switch args[0] {
	case "-h", "--help":
		fmt.Println(keysUsage)
		return nil
	case "show":
		return runKeysShow(ctx, args[1:])
	case "release":
		return runKeysRelease(ctx, args[1:])
	}
	return cli.Usagef("unknown action %q: want show or release", args[0])
}

// keyView is the --json answer of keys show.
type keyView struct {
	*idempotency.KeyRecord
	// BodyMatches is set when --body was given: true means a retry with
	// that body is replayed (or waits), false that it is refused as a
	// mismatch.
	BodyMatches *bool `json:"body_matches,omitempty"`
}

func runKeysShow(ctx context.Context, args []string) error {
	fs, kf := keyFlagSet("show")
	body := fs.String("body", "", "a request body to compare with the stored fingerprint (@FILE reads a file)")
	target := fs.String("path", "", "with --body: the request path and query as sent (defaults to the route's path when it has no {wildcards})")
	ctype := fs.String("content-type", "application/json", "with --body: the request's Content-Type")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return cli.Usagef("unexpected argument %q", pos[0])
	}
	key, err := kf.hash()
	if err != nil {
		return err
	}
	var want *idempotency.Fingerprint
	if flagSet(fs, "body") {
		b := []byte(*body)
		if name, ok := strings.CutPrefix(*body, "@"); ok {
			if b, err = os.ReadFile(name); err != nil {
				return cli.Usagef("--body %s: %v", *body, errors.Unwrap(err))
			}
		}
		p := *target
		if p == "" {
			_, p, _ = strings.Cut(*kf.route, " ") // "POST /orders" → "/orders"
			if !strings.Contains(*kf.route, " ") {
				p = *kf.route
			}
			if strings.Contains(p, "{") {
				return cli.Usagef("--path is required with --body: the route %q has wildcards", *kf.route)
			}
		}
		fp, err := idempotency.RequestFingerprint(*kf.method, p, *ctype, b)
		if err != nil {
			return cli.Usagef("%v", err)
		}
		want = &fp
	}
	pool, err := cli.Connect(ctx, cli.DatabaseURL())
	if err != nil {
		return err
	}
	defer pool.Close()
	rec, err := idempotency.NewPostgresStore(pool).Inspect(ctx, key)
	if err != nil {
		return err
	}
	v := keyView{KeyRecord: rec}
	if want != nil && rec.State != "in_transaction" {
		m := *want == rec.Fingerprint
		v.BodyMatches = &m
	}
	if *kf.asJSON {
		return printJSON(v)
	}
	ts := func(t *time.Time) string {
		if t == nil {
			return "-"
		}
		return t.UTC().Format(time.RFC3339)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "state\t%s\n", rec.State)
	fmt.Fprintf(tw, "in progress\t%v\n", rec.InProgress)
	if rec.Fence != 0 {
		fmt.Fprintf(tw, "fence\t%d\n", rec.Fence)
	}
	if rec.HolderPID != 0 {
		fmt.Fprintf(tw, "held by\tthe open transaction of backend %d\n", rec.HolderPID)
	}
	if rec.State != "in_transaction" {
		fmt.Fprintf(tw, "locked until\t%s\n", ts(rec.LockedUntil))
		if rec.ResponseStatus != 0 {
			fmt.Fprintf(tw, "response status\t%d\n", rec.ResponseStatus)
		}
		fmt.Fprintf(tw, "created at\t%s\n", ts(rec.CreatedAt))
		fmt.Fprintf(tw, "completed at\t%s\n", ts(rec.CompletedAt))
		fmt.Fprintf(tw, "expires at\t%s (expired: %v)\n", ts(rec.ExpiresAt), rec.Expired)
	}
	if v.BodyMatches != nil {
		verdict := "differs: a retry with it is refused (IDEMPOTENCY_KEY_REUSED)"
		if *v.BodyMatches {
			verdict = "matches: a retry with it is replayed"
		}
		fmt.Fprintf(tw, "body\t%s\n", verdict)
	}
	return tw.Flush()
}

func flagSet(fs *flag.FlagSet, name string) bool {
	found := false
	fs.Visit(func(f *flag.Flag) {
		if f.Name == name {
			found = true
		}
	})
	return found
}

func runKeysRelease(ctx context.Context, args []string) error {
	fs, kf := keyFlagSet("release")
	forget := fs.Bool("forget", false, "delete the record (also a completed one): the next request runs the handler again")
	fence := fs.Int64("fence", 0, "the fence that `idem keys show` printed: act on that claim only (required)")
	force := fs.Bool("force", false, "release (or forget) a claim whose lease is still live")
	who := fs.String("actor", "", "who acts, for the audit trail (default: the OS user)")
	reason := fs.String("reason", "", "why, for the audit trail (required)")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return cli.Usagef("unexpected argument %q", pos[0])
	}
	key, err := kf.hash()
	if err != nil {
		return err
	}
	if *fence <= 0 {
		return cli.Usagef("--fence is required: run idem keys show and pass the fence it prints")
	}
	actor, err := auditActor(*who, *reason)
	if err != nil {
		return err
	}
	pool, err := cli.Connect(ctx, cli.DatabaseURL())
	if err != nil {
		return err
	}
	defer pool.Close()
	store := idempotency.NewPostgresStore(pool)
	op := idempotency.AdminAction{Fence: *fence, Force: *force, Actor: actor, Reason: *reason}
	action, name := "released", "keys.release"
	if *forget {
		action, name = "forgotten", "keys.forget"
		err = store.Forget(ctx, key, op)
	} else {
		err = store.ForceRelease(ctx, key, op)
	}
	logAudit(name, idempotency.KeyHashHex(key), actor, *reason, err)
	if errors.Is(err, idempotency.ErrKeyNotInProgress) {
		if rec, ierr := store.Inspect(ctx, key); ierr == nil && rec.HolderPID != 0 {
			return fmt.Errorf("%w: it is held by the open transaction of backend %d (pg_terminate_backend(%d) ends it)", err, rec.HolderPID, rec.HolderPID)
		} else if ierr == nil {
			return fmt.Errorf("%w: it is %s (--forget deletes it)", err, rec.State)
		}
	}
	if errors.Is(err, idempotency.ErrLeaseLive) {
		return fmt.Errorf("%w: its handler may still run; nothing changed (--force releases it anyway)", err)
	}
	if errors.Is(err, idempotency.ErrClaimChanged) {
		return fmt.Errorf("%w; nothing changed (run idem keys show again)", err)
	}
	if err != nil {
		return err
	}
	if *kf.asJSON {
		return printJSON(map[string]any{"result": action, "fence": *fence, "actor": actor})
	}
	fmt.Printf("%s the claim of fence %d (recorded as %s)\n", action, *fence, actor)
	return nil
}
