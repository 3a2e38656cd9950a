package chaos

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"
)

// Violation is one broken guarantee found by the run or its audit.
type Violation struct {
	// Kind is one of: double-charge, lost-charge, failed-but-charged,
	// unexplained-failure, charged-and-declined, double-decline,
	// wrong-customer, wrong-principal, wrong-key, double-command,
	// orphan-charge, orphan-decline, not-final, replay-differs,
	// key-reuse-accepted, unexpected-status, bad-response, no-final-answer,
	// instance-down, not-idle, lost-event, reordered-event, misrouted-event,
	// not-linearizable.
	Kind    string `json:"kind"`
	Subject string `json:"subject"`
	Detail  string `json:"detail"`
	// At is the violation's moment on the timeline, in seconds since the
	// run's start: when its order, payment or key was first sent, else
	// when it was found.
	At float64 `json:"at"`
}

// Layers counts the duplicates each protection stopped.
type Layers struct {
	// HTTPReplays: answers the driver got with Idempotent-Replayed: true.
	HTTPReplays int64 `json:"http_replays"`
	// HTTPInProgress: 409 IDEMPOTENCY_KEY_IN_PROGRESS the driver got
	// (a concurrent duplicate held off while the first attempt ran).
	HTTPInProgress int64 `json:"http_in_progress"`
	// HTTPServerReplays: replays billing's idempotency middleware counted
	// (more than the driver saw: answers lost to kills were replayed too);
	// -1 when billing does not export it.
	HTTPServerReplays int64 `json:"http_server_replays"`
	// Fingerprint: keys the driver reused with another body that billing
	// refused with IDEMPOTENCY_KEY_REUSED, of FingerprintProbes sent.
	Fingerprint       int64 `json:"fingerprint"`
	FingerprintProbes int64 `json:"fingerprint_probes"`
	// Inbox: redelivered Kafka events billing's inbox skipped (from
	// billing's /metrics; -1 when billing does not export it).
	Inbox int64 `json:"inbox"`
	// Provider: charges paysim answered from its idempotency store instead
	// of charging again (-1 when unknown).
	Provider int64 `json:"provider"`
}

// Report is the outcome of a run.
type Report struct {
	Seed int64 `json:"seed"`
	// Broker is what billing ran on: "kafka/franz", "kafka/kafkago"
	// (KAFKA_CLIENT) or "nats".
	Broker    string  `json:"broker"`
	Unsafe    string  `json:"unsafe,omitempty"`
	Orders    int     `json:"orders"`
	Payments  int     `json:"payments"`
	Instances int     `json:"instances"`
	DropRate  float64 `json:"drop_rate"`
	FailRate  float64 `json:"fail_rate"`
	// ProduceFailRate is devkafka's share of failed produce partitions.
	ProduceFailRate float64 `json:"produce_fail_rate"`
	// DeclineRate is paysim's share of keys declined for good.
	DeclineRate float64 `json:"decline_rate"`

	// Operations is POSTs that reached a final answer; Requests is HTTP
	// attempts (retries and duplicates included).
	Operations int64 `json:"operations"`
	Requests   int64 `json:"requests"`
	// ClientRetries is attempts after the first; ClientDrops the answers
	// thrown away on purpose; Duplicates the POSTs sent twice at once.
	ClientRetries int64 `json:"client_retries"`
	ClientDrops   int64 `json:"client_drops"`
	Duplicates    int64 `json:"duplicates"`
	// TransportErrors and Status5xx are the attempts that failed so.
	TransportErrors int64 `json:"transport_errors"`
	Status5xx       int64 `json:"status_5xx"`

	Kills int `json:"kills"`
	// RelayKills: the kills aimed at the instance whose relay read the
	// WAL outbox slot (OutboxWAL), counted in Kills too.
	RelayKills int `json:"relay_kills,omitempty"`
	Terms      int `json:"terms"`
	// UncleanTerms: SIGTERMs that did not end in exit status 0 within
	// SHUTDOWN_TIMEOUT plus 5s (the instance was then killed).
	UncleanTerms   int `json:"unclean_terms"`
	Restarts       int `json:"restarts"`
	BrokerRestarts int `json:"broker_restarts"`
	// PGRestarts: crashes (immediate stop) and restarts of billing's
	// PostgreSQL. NetCuts: resets of every connection through the fault
	// proxies, NetCutConns the connections they reset. StartRetries:
	// billing starts that failed (database down or cut) and were retried.
	PGRestarts   int `json:"pg_restarts"`
	NetCuts      int `json:"net_cuts"`
	NetCutConns  int `json:"net_cut_connections"`
	StartRetries int `json:"start_retries"`
	// SelfExits: billing instances that exited on their own after they
	// were ready (failpoint kills among them), SelfRestarts those started
	// again.
	SelfExits    int `json:"self_exits"`
	SelfRestarts int `json:"self_restarts"`
	// Failpoints is the failpoint coverage (nil without --failpoints).
	Failpoints *FailpointReport `json:"failpoints,omitempty"`

	Stopped Layers `json:"duplicates_stopped"`

	// Memory is billing serve's resident memory, per instance and overall
	// (nil when no instance was sampled).
	Memory *Memory `json:"billing_memory,omitempty"`

	LatencyP50Ms float64 `json:"latency_p50_ms"`
	LatencyP99Ms float64 `json:"latency_p99_ms"`
	// LoadSeconds is the driver's run; QuiescenceSeconds the time from its
	// end until every order and payment was final and the ledger still.
	LoadSeconds       float64 `json:"load_seconds"`
	QuiescenceSeconds float64 `json:"quiescence_seconds"`
	// LedgerWatchSeconds is how long quiescence watched the idle system's
	// ledger stay still: longer than LongestTimer, the longest redelivery
	// timer of the configuration. LedgerLateChanges counts the times the
	// ledger changed while the system was idle (each restarted the wait).
	LedgerWatchSeconds float64 `json:"ledger_watch_seconds"`
	LongestTimer       string  `json:"longest_timer"`
	LedgerLateChanges  int     `json:"ledger_late_changes"`

	ConfirmedOrders  int `json:"confirmed_orders"`
	AcceptedPayments int `json:"accepted_payments"`
	Charged          int `json:"charged"`
	Failed           int `json:"failed"`
	LedgerCharges    int `json:"ledger_charges"`
	LedgerDeclines   int `json:"ledger_declines"`
	// KafkaEvents and KafkaAggregates are the outbox events and aggregates
	// checked against the topics; KafkaRecords the records of this run read
	// back, KafkaRedelivered those beyond each event's first copy.
	KafkaEvents      int `json:"kafka_events"`
	KafkaAggregates  int `json:"kafka_aggregates"`
	KafkaRecords     int `json:"kafka_records"`
	KafkaRedelivered int `json:"kafka_redelivered"`
	// KafkaRetried is the outbox events whose publish failed at least once.
	KafkaRetried int `json:"kafka_retried"`

	// Linearizable is the model-based audit's verdict on the driver's
	// history: "yes", "no" or "unknown" ("" when it did not run);
	// Linearizability its details.
	Linearizable    string           `json:"linearizable,omitempty"`
	Linearizability *Linearizability `json:"linearizability,omitempty"`

	// Config is what the run was given, with the command that repeats it.
	Config RunConfig `json:"config"`
	// Timeline is the run second by second, for the HTML report.
	Timeline *Timeline `json:"timeline,omitempty"`

	Violations []Violation `json:"violations"`
	Pass       bool        `json:"pass"`
	// WorkDir holds the children's logs (kept when the run fails).
	WorkDir string `json:"work_dir,omitempty"`
}

func percentile(d []time.Duration, p float64) float64 {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(p * float64(len(s)-1))
	return float64(s[i].Microseconds()) / 1000
}

// WriteText writes the report for people.
func (r *Report) WriteText(w io.Writer) {
	unk := func(v int64) string {
		if v < 0 {
			return "n/a"
		}
		return fmt.Sprint(v)
	}
	mode := "all protections on"
	if r.Unsafe != "" {
		mode = "UNSAFE: " + r.Unsafe + " protection off"
	}
	fmt.Fprintf(w, "\nchaos run, seed %d (%s)\n", r.Seed, mode)
	fmt.Fprintf(w, "  config      broker %s, outbox %s, data layer %s\n", r.Broker, r.Config.OutboxMode, r.Config.DataLayer)
	fmt.Fprintf(w, "  load        %d orders, %d payments, %d instances, paysim drop %.0f%% fail %.0f%% decline %.0f%%, produce fail %.0f%%\n",
		r.Orders, r.Payments, r.Instances, r.DropRate*100, r.FailRate*100, r.DeclineRate*100, r.ProduceFailRate*100)
	fmt.Fprintf(w, "  operations  %d POSTs answered in %d requests: %d retries, %d answers dropped by the client, %d concurrent duplicates\n",
		r.Operations, r.Requests, r.ClientRetries, r.ClientDrops, r.Duplicates)
	fmt.Fprintf(w, "  failures    %d transport errors, %d 5xx seen by the client\n", r.TransportErrors, r.Status5xx)
	fmt.Fprintf(w, "  chaos       %d SIGKILL, %d SIGTERM (%d unclean), %d restarts (%d start retries), %d broker restarts\n",
		r.Kills, r.Terms, r.UncleanTerms, r.Restarts, r.StartRetries, r.BrokerRestarts)
	if r.RelayKills > 0 {
		fmt.Fprintf(w, "              %d of the SIGKILLs aimed at the WAL outbox slot's reader\n", r.RelayKills)
	}
	fmt.Fprintf(w, "              %d PostgreSQL crashes (immediate), %d network cuts (%d connections reset), %d exits on their own (%d restarted)\n",
		r.PGRestarts, r.NetCuts, r.NetCutConns, r.SelfExits, r.SelfRestarts)
	if f := r.Failpoints; f != nil {
		var hits []string
		for _, name := range sortedKeys(f.Hits) {
			hits = append(hits, fmt.Sprintf("%s %d", name, f.Hits[name]))
		}
		fmt.Fprintf(w, "  failpoints  %d kills: %s\n", f.Kills, strings.Join(hits, ", "))
		if len(f.Missed) > 0 {
			fmt.Fprintf(w, "              MISSED (hit fewer than %d times): %s\n", f.Target, strings.Join(f.Missed, ", "))
		}
	}
	fmt.Fprintf(w, "  stopped     HTTP key: %d replays + %d in-progress 409s seen by the client (%s replays counted by billing)\n",
		r.Stopped.HTTPReplays, r.Stopped.HTTPInProgress, unk(r.Stopped.HTTPServerReplays))
	fmt.Fprintf(w, "              fingerprint: %d of %d reused keys refused; inbox: %s redeliveries skipped; provider key: %s charges replayed\n",
		r.Stopped.Fingerprint, r.Stopped.FingerprintProbes, unk(r.Stopped.Inbox), unk(r.Stopped.Provider))
	fmt.Fprintf(w, "  latency     p50 %.1f ms, p99 %.1f ms per POST (retries included)\n", r.LatencyP50Ms, r.LatencyP99Ms)
	if m := r.Memory; m != nil {
		fmt.Fprintf(w, "  memory      %s\n", m.describe())
	}
	fmt.Fprintf(w, "  time        load %.1fs, quiescence %.1fs (the idle ledger watched %.1fs, beyond the longest redelivery timer: %s; %d late changes)\n",
		r.LoadSeconds, r.QuiescenceSeconds, r.LedgerWatchSeconds, r.LongestTimer, r.LedgerLateChanges)
	fmt.Fprintf(w, "  audit       %d confirmed orders + %d payments: %d CHARGED, %d FAILED; %d ledger charges, %d declines (order, customer, amount, principal and key of each checked)\n",
		r.ConfirmedOrders, r.AcceptedPayments, r.Charged, r.Failed, r.LedgerCharges, r.LedgerDeclines)
	label := "kafka"
	if r.Broker == BrokerNATS {
		label = "nats"
	}
	fmt.Fprintf(w, "  %-11s %d outbox events of %d aggregates (%d had a failed publish) checked against %d records (%d redeliveries): each on its topic, first deliveries in aggregate order\n",
		label, r.KafkaEvents, r.KafkaAggregates, r.KafkaRetried, r.KafkaRecords, r.KafkaRedelivered)
	if l := r.Linearizability; l != nil {
		fmt.Fprintf(w, "  model       linearizable: %s (%d attempts of %d keys checked by porcupine against a sequential Idempotency-Key model)\n",
			l.Verdict, l.Ops, l.Keys)
		if len(l.Failing) > 0 {
			fmt.Fprintf(w, "              %d keys fail; the smallest, %s:\n", l.FailingKeys, l.FailingKey)
			for _, line := range describeHistory(l.Failing) {
				fmt.Fprintf(w, "                %s\n", line)
			}
			if l.HTMLPath != "" {
				fmt.Fprintf(w, "              visualized in %s\n", l.HTMLPath)
			}
		}
	}
	if len(r.Violations) > 0 {
		kinds := map[string]int{}
		for _, v := range r.Violations {
			kinds[v.Kind]++
		}
		var ks []string
		for k, n := range kinds {
			ks = append(ks, fmt.Sprintf("%s %d", k, n))
		}
		sort.Strings(ks)
		fmt.Fprintf(w, "  violations  %d (%s)\n", len(r.Violations), strings.Join(ks, ", "))
		for i, v := range r.Violations {
			if i == 20 {
				fmt.Fprintf(w, "    … %d more (--json lists all)\n", len(r.Violations)-20)
				break
			}
			fmt.Fprintf(w, "    %-18s %s: %s\n", v.Kind, v.Subject, v.Detail)
		}
	}
	if r.WorkDir != "" {
		fmt.Fprintf(w, "  logs        %s\n", r.WorkDir)
	}
	if r.Pass && r.Unsafe != "" {
		fmt.Fprintf(w, "INCONCLUSIVE: with the %s protection off the audit found nothing: this run did not exercise it (or billing ignores BILLING_UNSAFE)\n", r.Unsafe)
		return
	}
	if r.Pass {
		fmt.Fprintf(w, "PASS: every confirmed order and payment charged exactly once, nothing lost, every replay identical, every event delivered in order\n")
	} else {
		fmt.Fprintf(w, "FAIL: %d violations\n", len(r.Violations))
	}
}

func sortedKeys(m map[string]int) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
