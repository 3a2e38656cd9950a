package idemotel_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/hookscenario"
	idemotel "github.com/idemkit/idem/otel"
	"github.com/idemkit/idem/outbox"
)

// Every metric of the table, against what the scenario did: real
// PostgreSQL, kfake over TCP, real HTTP, the hooks installed as a user
// installs them.
func TestMetrics(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var backlog *outbox.Status
	w := hookscenario.Run(t, hookscenario.Hooks{
		Request: b.tel.RequestHook(), Client: b.tel.ClientHook(), Relay: b.tel.RelayHook(),
		Consumer: b.tel.ConsumerHook(), InboxPurge: b.tel.InboxPurgeHook(),
		BeforeRelay: func(t *testing.T, db outbox.DBTX) {
			g, err := b.tel.OutboxGauges(db, &idemotel.OutboxGaugesConfig{Interval: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			if v, ok := sum(b.metrics(t), idemotel.MetricOutboxEvents, nil); ok || v != 0 {
				t.Fatalf("backlog gauge reported %v before the first read", v)
			}
			if err := g.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(20 * time.Second)
			for g.Last() == nil && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond) // polling interval
			}
			if err := g.Stop(context.Background()); err != nil {
				t.Fatal(err)
			}
			backlog = g.Last()
			ms := b.metrics(t)
			for status, want := range map[string]float64{"pending": hookscenario.BacklogPending, "publishing": hookscenario.BacklogPublishing, "published": 0, "dead": 0} {
				if v, _ := sum(ms, idemotel.MetricOutboxEvents, map[string]string{"status": status}); v != want {
					t.Errorf("%s{status=%s} = %v, want %v", idemotel.MetricOutboxEvents, status, v, want)
				}
			}
			if v, _ := sum(ms, idemotel.MetricOutboxOldestAge, nil); v < 0 || backlog.OldestPending.Seconds() != v {
				t.Errorf("%s = %v, status says %v", idemotel.MetricOutboxOldestAge, v, backlog.OldestPending)
			}
		},
	})
	if backlog == nil {
		t.Fatal("the backlog gauges never read the outbox")
	}
	ms := b.metrics(t)
	type check struct {
		name  string
		attrs map[string]string
		want  int
	}
	checks := []check{
		{idemotel.MetricReplays, map[string]string{"route": w.Route}, w.Replays},
		{idemotel.MetricConflicts, map[string]string{"route": w.Route}, w.Conflicts},
		{idemotel.MetricMismatches, map[string]string{"route": w.Route}, w.Mismatches},
		{idemotel.MetricTakeovers, nil, w.Takeovers},
		{idemotel.MetricIdempotencyPurged, nil, w.IdempotencyPurged},
		{idemotel.MetricOutboxPublished, map[string]string{"topic": w.Topic}, w.Published},
		{idemotel.MetricOutboxFailures, map[string]string{"topic": w.Topic}, w.Failures},
		{idemotel.MetricOutboxDead, map[string]string{"topic": w.Topic}, w.Dead},
		{idemotel.MetricOutboxLatency, map[string]string{"topic": w.Topic}, w.Published},
		{idemotel.MetricOutboxReaped, nil, w.Reaped},
		{idemotel.MetricOutboxPurged, nil, w.OutboxPurged},
		{idemotel.MetricOutboxBatch, map[string]string{"outcome": idemotel.BatchPartial}, 1},
		{idemotel.MetricOutboxBatch, map[string]string{"outcome": idemotel.BatchPublished}, w.Batches - 1},
		{idemotel.MetricConsumerDuplicates, map[string]string{"consumer": w.Consumer, "topic": w.Topic}, w.Duplicates},
		{idemotel.MetricConsumerRetries, map[string]string{"consumer": w.Consumer, "cause": "handler"}, w.Retries},
		{idemotel.MetricConsumerDead, map[string]string{"consumer": w.Consumer}, w.DeadLetters},
		{idemotel.MetricInboxPurged, nil, w.InboxPurged},
	}
	for outcome, n := range w.Requests {
		checks = append(checks, check{idemotel.MetricRequests, map[string]string{"outcome": outcome}, n})
	}
	for outcome, n := range w.Records {
		checks = append(checks, check{idemotel.MetricConsumerRecords, map[string]string{"outcome": outcome, "topic": w.Topic}, n})
	}
	for outcome, n := range w.Attempts {
		checks = append(checks, check{idemotel.MetricClientAttempts, map[string]string{"outcome": outcome, "method": "POST"}, n})
	}
	for reason, n := range w.ClientRetries {
		checks = append(checks, check{idemotel.MetricClientRetries, map[string]string{"reason": reason}, n})
	}
	for _, c := range checks {
		v, ok := sum(ms, c.name, c.attrs)
		if !ok || v != float64(c.want) {
			t.Errorf("%s%v = %v (present %v), want %d", c.name, c.attrs, v, ok, c.want)
		}
	}
	if v, _ := sum(ms, idemotel.MetricOutboxBatch, map[string]string{"outcome": idemotel.BatchIdle}); v < 1 {
		t.Errorf("no idle batch duration recorded")
	}
	if v, _ := sum(ms, idemotel.MetricConsumerCommit, map[string]string{"consumer": w.Consumer, "outcome": "ok"}); v < 1 {
		t.Errorf("no commit latency recorded")
	}
	// Every metric of the table is among those exported.
	for _, name := range tableNames(t) {
		if _, ok := ms[name]; !ok {
			t.Errorf("%s, in docs/metrics.md, was not exported", name)
		}
	}
	if len(ms) != len(tableNames(t)) {
		t.Errorf("%d metrics exported, docs/metrics.md lists %d", len(ms), len(tableNames(t)))
	}
}
