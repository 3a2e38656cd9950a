package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/failpoint"
	"github.com/idemkit/idem/internal/testbin"
	"github.com/idemkit/idem/internal/testdb"
)

// The CI chaos run: about 300 POSTs against 3 billing instances, several
// SIGKILLs and SIGTERMs, one broker restart, paysim dropping, failing and
// declining, and failpoints killing one instance in every crash window
// that the code marks. Every confirmed order and payment must be charged
// exactly once, every FAILED must be one of paysim's declines, and every
// window must have been hit.
func TestChaosEndToEnd(t *testing.T) {
	t.Parallel()
	windows := landedWindows(t)
	db := testdb.New(t, testdb.Empty())
	var log bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	rep, err := Run(ctx, &Config{
		IdemBin: needIdem(t), BillingBin: needBilling(t), DatabaseURL: db.URL,
		// A SIGKILLed consumer holds its partitions until its group session
		// times out: quiescence may take a while, and that is not a failure.
		Quiescence: 4 * time.Minute,
		Orders:     100, Payments: 50, Instances: 3,
		Kills: 3, Terms: 2, BrokerRestarts: 1,
		DropRate: 0.2, FailRate: 0.1, DeclineRate: 0.05, Seed: 42,
		// Long enough for the holder to die in every window, each death
		// followed by a session's wait before its restart (45 s left
		// charger-provider-answered unhit in one CI run of seven windows).
		Failpoints: true, LoadDuration: 60 * time.Second,
		Progress: &log,
	})
	if rep != nil {
		var out strings.Builder
		rep.WriteText(&out)
		t.Log(out.String())
	}
	if err != nil {
		t.Fatalf("run: %v\n%s", err, log.String())
	}
	if !rep.Pass {
		t.Fatalf("violations (logs in %s):\n%s", rep.WorkDir, log.String())
	}
	if rep.Kills != 3 || rep.Terms != 2 || rep.BrokerRestarts != 1 || rep.Restarts != 5 {
		t.Errorf("chaos not carried out: %d kills, %d terms, %d broker restarts, %d restarts", rep.Kills, rep.Terms, rep.BrokerRestarts, rep.Restarts)
	}
	if rep.Operations != 300 {
		t.Errorf("operations %d, want 300", rep.Operations)
	}
	if rep.ConfirmedOrders != 100 || rep.AcceptedPayments != 50 || rep.Charged+rep.Failed != 150 || rep.LedgerCharges != rep.Charged {
		t.Errorf("audit figures: %+v", rep)
	}
	if rep.ClientRetries == 0 || rep.Stopped.HTTPReplays == 0 {
		t.Errorf("no retries or replays: the run proved nothing about the key layer: %+v", rep)
	}
	if rep.Failed == 0 || rep.Failed != rep.LedgerDeclines {
		t.Errorf("%d FAILED for %d declines in the ledger: the decline audit was not exercised", rep.Failed, rep.LedgerDeclines)
	}
	f := rep.Failpoints
	if f == nil {
		t.Fatal("no failpoint report")
	}
	for _, w := range windows {
		if f.Hits[w] == 0 {
			t.Errorf("failpoint window %s was never hit (hits %v)", w, f.Hits)
		}
	}
	// A kill in an HTTP window cuts the request that reached it: the
	// driver's attempt fails in transit and its retry takes over.
	if cut := f.Hits[failpoint.HTTPHandlerDone] + f.Hits[failpoint.HTTPResponseStored]; rep.TransportErrors < int64(cut) {
		t.Errorf("%d kills in HTTP windows but %d transport errors", cut, rep.TransportErrors)
	}
	if rep.LedgerWatchSeconds <= 10 {
		t.Errorf("the idle ledger was watched %vs, not beyond the outbox lease + reaper (10s)", rep.LedgerWatchSeconds)
	}
	wantLinearizable(t, rep, "yes")
}

// wantLinearizable checks the model-based audit's verdict, and that it saw
// every attempt the driver made.
func wantLinearizable(t *testing.T, rep *Report, want string) {
	t.Helper()
	l := rep.Linearizability
	if l == nil || rep.Linearizable != want || l.Verdict != want {
		t.Fatalf("linearizable %q (%+v), want %s", rep.Linearizable, l, want)
	}
	if int64(l.Ops) != rep.Requests || l.Keys == 0 {
		t.Errorf("the history has %d attempts of %d keys; the driver made %d requests", l.Ops, l.Keys, rep.Requests)
	}
	if want != "no" {
		return
	}
	if len(l.Failing) == 0 || l.FailingKey == "" || l.FailingKeys == 0 {
		t.Errorf("no failing key history: %+v", l)
	}
	if b, err := os.ReadFile(l.HTMLPath); err != nil || !strings.Contains(string(b), "<html") {
		t.Errorf("porcupine's visualization %q: %v", l.HTMLPath, err)
	}
	found := false
	for _, v := range rep.Violations {
		found = found || (v.Kind == "not-linearizable" && v.Subject == "key "+l.FailingKey)
	}
	if !found {
		t.Errorf("no not-linearizable violation for key %s among %+v", l.FailingKey, rep.Violations)
	}
}

// --unsafe=key, through the CLI as CI runs it: the driver mints a fresh key
// on every retry, so a lost answer to POST /payments becomes a second
// payment and a second charge. The audit must say so, in the JSON report
// and with exit status 1.
func TestChaosUnsafeKeyIsCaught(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(needBilling(t), "chaos", "--unsafe=key", "--json",
		"--orders", "10", "--payments", "20", "--instances", "2", "--kills", "0", "--terms", "0",
		"--broker-restarts", "0", "--drop-rate", "0.2", "--fail-rate", "0", "--seed", "7", "--duration", "5s")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+testdb.URL(), "IDEM_BIN="+needIdem(t), "KAFKA_BROKERS=")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("exit: %v, want status 1\n%s", err, stderr.String())
	}
	var rep Report
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("stdout is not one JSON report: %v\n%s", err, stdout.String())
	}
	// A failed run keeps its logs for a post-mortem; this failure is the
	// expected one.
	if rep.WorkDir == "" || !strings.Contains(stderr.String(), rep.WorkDir) {
		t.Errorf("work dir %q not reported on stderr", rep.WorkDir)
	}
	defer os.RemoveAll(rep.WorkDir)
	var out strings.Builder
	rep.WriteText(&out)
	t.Log(out.String())
	if rep.Pass || rep.Unsafe != "key" || rep.ClientRetries == 0 {
		t.Fatalf("report: pass %v unsafe %q retries %d", rep.Pass, rep.Unsafe, rep.ClientRetries)
	}
	charged := false
	for _, v := range rep.Violations {
		if v.Kind == "double-charge" || v.Kind == "orphan-charge" {
			charged = true
		}
	}
	if !charged {
		t.Fatalf("no double or orphan charge among %+v", rep.Violations)
	}
	wantLinearizable(t, &rep, "no")
	wantBillingMemory(t, &rep, 2)
	if last := strings.TrimSpace(stderr.String()); !strings.Contains(last[strings.LastIndexByte(last, '\n')+1:], "violations") {
		t.Errorf("last stderr line does not name the violations: %q", last)
	}
}

// The faults below the processes, through the CLI as an operator runs
// them: produce requests partly failing, billing's PostgreSQL crashed, and
// every connection from billing to PostgreSQL and Kafka reset, beside a
// kill and a term. Nothing may be charged twice or lost, and every outbox
// event must reach its topic with each aggregate's first deliveries in
// order. (On a relay that marks a failed event published this run fails
// with lost-event violations.)
func TestChaosInfrastructureFaults(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(needBilling(t), "chaos", "--json",
		"--orders", "50", "--payments", "25", "--instances", "3", "--kills", "1", "--terms", "1",
		"--broker-restarts", "0", "--drop-rate", "0.1", "--fail-rate", "0",
		"--produce-fail-rate", "0.2", "--pg-restarts", "2", "--net-cuts", "3",
		"--seed", "3", "--duration", "12s", "--quiescence", "2m")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+testdb.URL(), "IDEM_BIN="+needIdem(t), "KAFKA_BROKERS=")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	var rep Report
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("stdout is not one JSON report (%v): %v\n%s", runErr, err, stderr.String())
	}
	if rep.WorkDir != "" {
		defer os.RemoveAll(rep.WorkDir)
	}
	var out strings.Builder
	rep.WriteText(&out)
	t.Log(out.String())
	if runErr != nil || !rep.Pass {
		t.Fatalf("exit %v, pass %v\n%s", runErr, rep.Pass, stderr.String())
	}
	if rep.PGRestarts != 2 || rep.NetCuts != 3 || rep.NetCutConns == 0 || rep.Kills != 1 || rep.Terms != 1 {
		t.Errorf("faults not carried out: %d PostgreSQL crashes, %d cuts resetting %d connections, %d kills, %d terms",
			rep.PGRestarts, rep.NetCuts, rep.NetCutConns, rep.Kills, rep.Terms)
	}
	// 75 orders (25 carry the payments), 50 confirmed: an OrderConfirmed
	// and a ChargeRequested each, and a ChargeRequested per payment.
	if rep.KafkaEvents != 125 || rep.KafkaAggregates != 75 || rep.KafkaRecords < rep.KafkaEvents {
		t.Errorf("kafka audit checked %d events of %d aggregates in %d records, want 125 of 75", rep.KafkaEvents, rep.KafkaAggregates, rep.KafkaRecords)
	}
	if rep.KafkaRetried == 0 {
		t.Error("no outbox event had a failed publish: the produce failures were not exercised")
	}
	wantLinearizable(t, &rep, "yes")
	// One of the three was SIGKILLed and one SIGTERMed: each keeps a peak.
	wantBillingMemory(t, &rep, 3)
}

// wantBillingMemory checks the report's billing serve memory: every one of
// the instances sampled, and peaks a Go HTTP service can have (more than
// 1 MiB, less than 4 GiB), the overall one the highest of them.
func wantBillingMemory(t *testing.T, rep *Report, instances int) {
	t.Helper()
	m := rep.Memory
	if m == nil {
		t.Fatal("no billing_memory in the report")
	}
	plausible := func(b int64) bool { return b > 1<<20 && b < 4<<30 }
	if !plausible(m.PeakRSSBytes) {
		t.Errorf("billing serve peak RSS %d bytes, want between 1 MiB and 4 GiB", m.PeakRSSBytes)
	}
	if len(m.Instances) != instances {
		t.Fatalf("memory of %d instances (%+v), want %d", len(m.Instances), m.Instances, instances)
	}
	var top int64
	for _, in := range m.Instances {
		if in.Samples == 0 || !plausible(in.PeakRSSBytes) || in.LastRSSBytes <= 0 || in.LastRSSBytes > in.PeakRSSBytes {
			t.Errorf("instance memory %+v", in)
		}
		top = max(top, in.PeakRSSBytes)
	}
	if top != m.PeakRSSBytes {
		t.Errorf("overall peak %d, the instances' highest %d", m.PeakRSSBytes, top)
	}
	var out strings.Builder
	rep.WriteText(&out)
	if !strings.Contains(out.String(), "billing serve peak RSS "+mib(m.PeakRSSBytes)) {
		t.Errorf("the text report has no memory line:\n%s", out.String())
	}
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	ok := Config{IdemBin: "i", BillingBin: "b", DatabaseURL: "d"}
	testCases := []struct {
		name   string
		mutate func(c *Config)
		field  string
	}{
		{"no idem", func(c *Config) { c.IdemBin = "" }, "IdemBin"},
		{"no billing", func(c *Config) { c.BillingBin = "" }, "BillingBin"},
		{"no database", func(c *Config) { c.DatabaseURL = "" }, "DatabaseURL"},
		{"negative orders", func(c *Config) { c.Orders = -1 }, "Orders"},
		{"kills with one instance", func(c *Config) { c.Instances, c.Kills = 1, 1 }, "Instances"},
		{"broker restarts with external kafka", func(c *Config) { c.KafkaBrokers, c.BrokerRestarts = "k:9092", 1 }, "BrokerRestarts"},
		{"drop rate 1", func(c *Config) { c.DropRate = 1 }, "DropRate"},
		{"unknown unsafe layer", func(c *Config) { c.Unsafe = "everything" }, "Unsafe"},
		{"negative pg restarts", func(c *Config) { c.PGRestarts = -1 }, "PGRestarts"},
		{"net cuts with external kafka", func(c *Config) { c.KafkaBrokers, c.NetCuts = "k:9092", 1 }, "NetCuts"},
		{"produce failures with external kafka", func(c *Config) { c.KafkaBrokers, c.ProduceFailRate = "k:9092", 0.1 }, "ProduceFailRate"},
		{"produce fail rate 1", func(c *Config) { c.ProduceFailRate = 1 }, "ProduceFailRate"},
		{"unknown outbox mode", func(c *Config) { c.OutboxMode = "disk" }, "OutboxMode"},
	}
	for _, tt := range testCases {
		t.Run(tt.name, func(t *testing.T) {
			c := ok
			tt.mutate(&c)
			_, err := Run(context.Background(), &c)
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("err %v, want ErrConfig naming %s", err, tt.field)
			}
		})
	}
}

// The billing CLI's chaos and demo commands: help, and one-line errors with
// exit status 2 for bad flags.
func TestCLIFlags(t *testing.T) {
	t.Parallel()
	bin := needBilling(t)
	run := func(args ...string) (string, string, int) { return testbin.Run(t, bin, nil, args...) }
	for _, c := range []string{"chaos", "demo"} {
		out, _, code := run(c, "--help")
		for _, flag := range []string{"-unsafe", "-net-cuts", "-failpoints", "-failpoint-hits", "-decline-rate", "-profile", "Usage: billing " + c} {
			if code != 0 || !strings.Contains(out, flag) {
				t.Errorf("%s --help: exit %d, no %s in %q", c, code, flag, out)
			}
		}
		for _, args := range [][]string{{"--bogus"}, {"--unsafe", "everything"}, {"--drop-rate", "1.5"}, {"--instances", "1", "--kills", "2"}, {"extra"},
			{"--produce-fail-rate", "1"}, {"--pg-restarts", "-1"}, {"--net-cuts", "-2"}, {"--decline-rate", "1"}, {"--failpoint-hits", "0"},
			{"--profile", "huge"}, {"--profile", "long", "--bogus"}, {"--profile", "long", "extra"}} {
			_, stderr, code := run(append([]string{c}, args...)...)
			if code != 2 || strings.Count(stderr, "\n") != 1 {
				t.Errorf("%s %v: exit %d, stderr %q; want 2 and one line", c, args, code, stderr)
			}
		}
	}
}

// The embedded defaults: DATABASE_URL when set; the local server when it
// answers; else a throwaway cluster (billing demo on a fresh machine).
func TestResolveDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const dead = "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=2"
	live := testdb.URL()

	u, stop, err := ResolveDatabase(ctx, live, dead, false, nil)
	stop()
	if err != nil || u != live {
		t.Fatalf("DATABASE_URL set: %q %v", u, err)
	}
	if _, stop, err := ResolveDatabase(ctx, dead, live, true, nil); err == nil {
		stop()
		t.Fatal("an unreachable DATABASE_URL fell back to something else")
	}
	u, stop, err = ResolveDatabase(ctx, "", live, false, nil)
	stop()
	if err != nil || u != live {
		t.Fatalf("local server: %q %v", u, err)
	}
	if _, _, err := ResolveDatabase(ctx, "", dead, false, nil); !errors.Is(err, ErrNoDatabase) {
		t.Fatalf("no server, no fallback: %v, want ErrNoDatabase", err)
	}
	u, stop, err = ResolveDatabase(ctx, "", dead, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := Reachable(ctx, u, 10*time.Second); err != nil {
		stop()
		t.Fatalf("throwaway cluster %s does not answer: %v", u, err)
	}
	// A fresh schema on it works as on any server.
	su, drop, err := FreshSchema(ctx, u)
	if err != nil {
		stop()
		t.Fatal(err)
	}
	if err := Reachable(ctx, su, 10*time.Second); err != nil {
		t.Error(err)
	}
	if err := drop(ctx); err != nil {
		t.Error(err)
	}
	stop()
	if err := Reachable(ctx, u, 3*time.Second); err == nil {
		t.Fatal("throwaway cluster still answers after stop")
	}
}

// An --unsafe run whose audit finds nothing proves nothing: exit 3
// (inconclusive), with the logs kept. Here the lease protection is off but
// no POST is sent twice at once (this seed draws no duplicate for its one
// order and one payment), so nothing can show it.
func TestChaosUnsafeRunThatFindsNothingExits3(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(needBilling(t), "chaos", "--unsafe=lease", "--json",
		"--orders", "1", "--payments", "1", "--instances", "1", "--kills", "0", "--terms", "0",
		"--broker-restarts", "0", "--drop-rate", "0", "--fail-rate", "0", "--decline-rate", "0", "--seed", "3", "--duration", "1s")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+testdb.URL(), "IDEM_BIN="+needIdem(t), "KAFKA_BROKERS=")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var rep Report
	if jerr := json.Unmarshal(stdout.Bytes(), &rep); jerr != nil {
		t.Fatalf("stdout is not one JSON report (%v): %v\n%s", err, jerr, stderr.String())
	}
	if rep.WorkDir != "" {
		defer os.RemoveAll(rep.WorkDir)
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Fatalf("exit %v, want status 3\n%s", err, stderr.String())
	}
	if !rep.Pass || rep.Duplicates != 0 || !strings.Contains(stderr.String(), "inconclusive: with --unsafe=lease") {
		t.Fatalf("pass %v, %d duplicates; stderr:\n%s", rep.Pass, rep.Duplicates, stderr.String())
	}
}
