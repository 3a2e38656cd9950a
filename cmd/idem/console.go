package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/console"
	"github.com/idemkit/idem/internal/cli"
	"github.com/idemkit/idem/internal/httpserver"
	"github.com/idemkit/idem/kafka"
)

func init() {
	register(&cli.Command{Name: "console", Summary: "admin web console: idem console [--addr 127.0.0.1:8099]", Run: runConsole})
}

const consoleUsage = `Usage: idem console [--addr 127.0.0.1:8099] [--dlq-topics orders.events.dlq,...]

Serves the admin web console: the outbox (counts, backlog chart, dead events
with requeue and discard), idempotency keys (lookup, release), the inbox
(processed events per consumer) and, with KAFKA_BROKERS and --dlq-topics,
dead-letter topics (records, redrive).

It listens on loopback by default, and always needs a token: set
IDEM_CONSOLE_TOKEN (at least 16 characters; required for any address but
loopback), or a random one is made at start and printed once on stderr,
with a link that fills in the login form. Every request needs the token:
the login form (with your name, recorded with every action) starts a
session that expires after --session-ttl; scripts send "Authorization:
Bearer TOKEN". State changes are POSTs with a CSRF field; each is recorded
in the outbox row's audit trail or the idem_admin_audit table and logged to
stderr. DATABASE_URL selects the database.`

const consoleAddrDefault = "127.0.0.1:8099"

func runConsole(ctx context.Context, args []string) error {
	fs := cli.FlagSet("console", consoleUsage)
	addr := fs.String("addr", consoleAddrDefault, "listen address (anything but loopback needs IDEM_CONSOLE_TOKEN)")
	topics := fs.String("dlq-topics", "", "comma list of dead-letter topics to show (needs KAFKA_BROKERS)")
	interval := fs.Duration("sample-interval", console.SampleIntervalDefault, "how often the backlog chart is sampled")
	sessionTTL := fs.Duration("session-ttl", console.SessionTTLDefault, "how long a sign-in lasts")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.Usagef("unexpected argument %q", fs.Arg(0))
	}
	if *interval <= 0 {
		return cli.Usagef("--sample-interval must be positive")
	}
	if *sessionTTL <= 0 {
		return cli.Usagef("--session-ttl must be positive")
	}
	token := os.Getenv("IDEM_CONSOLE_TOKEN")
	host, _, err := net.SplitHostPort(*addr)
	if err != nil {
		return cli.Usagef("--addr %q: %v", *addr, err)
	}
	ip := net.ParseIP(host)
	loopback := host == "localhost" || (ip != nil && ip.IsLoopback())
	if !loopback && token == "" {
		return cli.Usagef("--addr %s is not a loopback address: set IDEM_CONSOLE_TOKEN (the console is an admin surface)", *addr)
	}
	if token != "" && len(token) < 16 {
		return cli.Usagef("IDEM_CONSOLE_TOKEN is shorter than 16 characters")
	}
	generated := token == ""
	if generated {
		// Never a console without a token: any local user could act
		// through it with the operator's database rights.
		b := make([]byte, 24)
		if _, err := rand.Read(b); err != nil {
			return fmt.Errorf("console token: %w", err)
		}
		token = hex.EncodeToString(b)
	}
	cfg := &console.Config{Token: token, SampleInterval: *interval, SessionTTL: *sessionTTL, Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))}
	if *topics != "" {
		brokers := os.Getenv("KAFKA_BROKERS")
		if brokers == "" {
			return cli.Usagef("--dlq-topics needs KAFKA_BROKERS")
		}
		cfg.DLQ = kafka.NewDLQ(kgo.SeedBrokers(strings.Split(brokers, ",")...), kgo.DialTimeout(5*time.Second))
		cfg.DeadLetterTopics = strings.Split(*topics, ",")
	}
	pool, err := cli.Connect(ctx, cli.DatabaseURL())
	if err != nil {
		return err
	}
	defer pool.Close()
	con, err := console.New(pool, cfg)
	if err != nil {
		return cli.Usagef("%v", err)
	}
	var hc0 httpserver.Config
	hc, err := hc0.WithDefaults()
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", *addr, err)
	}
	srv := httpserver.New(con, hc, cfg.Logger)
	if err := con.Start(ctx); err != nil {
		ln.Close()
		return err
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(hc.Limit(ln)) }()
	fmt.Printf("idem console listening on http://%s/ (token required)\n", ln.Addr())
	if generated {
		fmt.Fprintf(os.Stderr, "idem console: no IDEM_CONSOLE_TOKEN set: this run's token is %s\n"+
			"    sign in at http://%s/login?token=%s\n", token, ln.Addr(), token)
	}

	select {
	case err := <-served:
		_ = con.HardStop(context.Background())
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = srv.Shutdown(sctx)
	<-served
	_ = con.HardStop(sctx)
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}
