package idemprom_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/idemkit/idem/internal/hookscenario"
	"github.com/idemkit/idem/outbox"
	idemprom "github.com/idemkit/idem/prom"
)

// scrape GETs /metrics over HTTP and parses it as Prometheus does.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape: %d", resp.StatusCode)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// value adds the samples of name whose labels include want (a
// histogram's sample count); found is false when the family is absent.
func value(fams map[string]*dto.MetricFamily, name string, want map[string]string) (v float64, found bool) {
	f, ok := fams[name]
	if !ok {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		for k, x := range want {
			if labels[k] != x {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			v += m.GetCounter().GetValue()
		case m.Gauge != nil:
			v += m.GetGauge().GetValue()
		case m.Histogram != nil:
			v += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return v, true
}

// Every metric of the table, scraped over HTTP and parsed with expfmt,
// against what the scenario did (3 replays → 3, one dead letter → 1, …):
// real PostgreSQL, kfake over TCP, real HTTP.
func TestScrape(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := idemprom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(srv.Close)
	url := srv.URL + "/metrics"
	var gauges *idemprom.OutboxGauges
	w := hookscenario.Run(t, hookscenario.Hooks{
		Request: m.RequestHook(), Client: m.ClientHook(), Relay: m.RelayHook(),
		Consumer: m.ConsumerHook(), InboxPurge: m.InboxPurgeHook(),
		BeforeRelay: func(t *testing.T, db outbox.DBTX) {
			if gauges, err = m.OutboxGauges(db, &idemprom.OutboxGaugesConfig{Interval: time.Hour}); err != nil {
				t.Fatal(err)
			}
			if _, ok := scrape(t, url)[idemprom.MetricOutboxEvents]; ok {
				t.Fatal("the backlog gauge was served before the first read")
			}
			if err := gauges.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(20 * time.Second)
			for gauges.Last() == nil && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond) // polling interval
			}
			fams := scrape(t, url)
			for status, want := range map[string]float64{"pending": hookscenario.BacklogPending, "publishing": hookscenario.BacklogPublishing, "published": 0, "dead": 0} {
				if v, _ := value(fams, idemprom.MetricOutboxEvents, map[string]string{"status": status}); v != want {
					t.Errorf("%s{status=%s} = %v, want %v", idemprom.MetricOutboxEvents, status, v, want)
				}
			}
			if v, ok := value(fams, idemprom.MetricOutboxOldestAge, nil); !ok || v != gauges.Last().OldestPending.Seconds() {
				t.Errorf("%s = %v (present %v), status says %v", idemprom.MetricOutboxOldestAge, v, ok, gauges.Last().OldestPending)
			}
		},
	})
	if gauges == nil {
		t.Fatal("no gauges")
	}
	// The gauges serve their last read; a scrape does not refresh them.
	if err := gauges.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	fams := scrape(t, url)
	if v, _ := value(fams, idemprom.MetricOutboxEvents, map[string]string{"status": "pending"}); v != hookscenario.BacklogPending {
		t.Errorf("a scrape after the relay ran changed the backlog gauge to %v: it must serve the last background read", v)
	}
	type check struct {
		name  string
		attrs map[string]string
		want  int
	}
	checks := []check{
		{idemprom.MetricReplays, map[string]string{"route": w.Route}, w.Replays},
		{idemprom.MetricConflicts, map[string]string{"route": w.Route}, w.Conflicts},
		{idemprom.MetricMismatches, map[string]string{"route": w.Route}, w.Mismatches},
		{idemprom.MetricTakeovers, nil, w.Takeovers},
		{idemprom.MetricIdempotencyPurged, nil, w.IdempotencyPurged},
		{idemprom.MetricOutboxPublished, map[string]string{"topic": w.Topic}, w.Published},
		{idemprom.MetricOutboxFailures, map[string]string{"topic": w.Topic}, w.Failures},
		{idemprom.MetricOutboxDead, map[string]string{"topic": w.Topic}, w.Dead},
		{idemprom.MetricOutboxLatency, map[string]string{"topic": w.Topic}, w.Published},
		{idemprom.MetricOutboxReaped, nil, w.Reaped},
		{idemprom.MetricOutboxPurged, nil, w.OutboxPurged},
		{idemprom.MetricOutboxBatch, map[string]string{"outcome": idemprom.BatchPartial}, 1},
		{idemprom.MetricOutboxBatch, map[string]string{"outcome": idemprom.BatchPublished}, w.Batches - 1},
		{idemprom.MetricConsumerDuplicates, map[string]string{"consumer": w.Consumer, "topic": w.Topic}, w.Duplicates},
		{idemprom.MetricConsumerRetries, map[string]string{"consumer": w.Consumer, "cause": "handler"}, w.Retries},
		{idemprom.MetricConsumerDead, map[string]string{"consumer": w.Consumer}, w.DeadLetters},
		{idemprom.MetricInboxPurged, nil, w.InboxPurged},
	}
	for outcome, n := range w.Requests {
		checks = append(checks, check{idemprom.MetricRequests, map[string]string{"outcome": outcome}, n})
	}
	for outcome, n := range w.Records {
		checks = append(checks, check{idemprom.MetricConsumerRecords, map[string]string{"outcome": outcome, "topic": w.Topic}, n})
	}
	for outcome, n := range w.Attempts {
		checks = append(checks, check{idemprom.MetricClientAttempts, map[string]string{"outcome": outcome, "method": "POST"}, n})
	}
	for reason, n := range w.ClientRetries {
		checks = append(checks, check{idemprom.MetricClientRetries, map[string]string{"reason": reason}, n})
	}
	for _, c := range checks {
		v, ok := value(fams, c.name, c.attrs)
		if !ok || v != float64(c.want) {
			t.Errorf("%s%v = %v (present %v), want %d", c.name, c.attrs, v, ok, c.want)
		}
	}
	if v, _ := value(fams, idemprom.MetricOutboxBatch, map[string]string{"outcome": idemprom.BatchIdle}); v < 1 {
		t.Errorf("no idle batch duration observed")
	}
	if v, _ := value(fams, idemprom.MetricConsumerCommit, map[string]string{"consumer": w.Consumer, "outcome": "ok"}); v < 1 {
		t.Errorf("no commit latency observed")
	}
	// The scrape serves exactly the table's metrics.
	table := tableRows(t)
	for _, r := range table {
		if _, ok := fams[r.prom]; !ok {
			t.Errorf("%s, in docs/metrics.md, was not served", r.prom)
		}
	}
	if len(fams) != len(table) {
		t.Errorf("%d families served, docs/metrics.md lists %d", len(fams), len(table))
	}
}

type row struct{ otel, prom, kind, unit string }

func tableRows(t *testing.T) []row {
	t.Helper()
	b, err := os.ReadFile("../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	var out []row
	for _, line := range strings.Split(string(b), "\n") {
		c := strings.Split(line, "|")
		if len(c) < 6 || !strings.HasPrefix(strings.TrimSpace(c[1]), "`idem.") {
			continue
		}
		cell := func(i int) string { return strings.Trim(strings.TrimSpace(c[i]), "`") }
		out = append(out, row{cell(1), cell(2), cell(3), cell(4)})
	}
	if len(out) == 0 {
		t.Fatal("docs/metrics.md has no table")
	}
	return out
}

// The table's two names of each metric follow one rule: the Prometheus
// name is the OpenTelemetry name with dots as underscores, _seconds for
// unit s, _total for a counter.
func TestTableNamesFollowTheRule(t *testing.T) {
	t.Parallel()
	for _, r := range tableRows(t) {
		want := strings.ReplaceAll(r.otel, ".", "_")
		if r.unit == "s" {
			want += "_seconds"
		}
		if r.kind == "counter" {
			want += "_total"
		}
		if r.prom != want {
			t.Errorf("%s: Prometheus name %s, the rule gives %s", r.otel, r.prom, want)
		}
	}
}

// A second collector on one registry is an error, not a panic.
func TestNewTwiceOnOneRegistry(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	if _, err := idemprom.New(reg); err != nil {
		t.Fatal(err)
	}
	if _, err := idemprom.New(reg); err == nil {
		t.Fatal("a second New on one registry succeeded")
	}
}
