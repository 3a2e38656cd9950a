package chaos

import (
	"context"
	"math"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemkit/idem/examples/billing/consumer"
	"github.com/idemkit/idem/examples/billing/usecase"
	idemprom "github.com/idemkit/idem/prom"
)

// Timeline is the run second by second, for the HTML report: what the
// driver saw (from its history), what the pipeline did (from the metrics
// scraped every second) and the moments of every fault.
type Timeline struct {
	// Seconds runs from the harness's start (0) to the audit.
	Seconds []Second `json:"seconds"`
	Marks   []Mark   `json:"marks"`
	// Groups names the consumer groups of Second.Lag, in order; empty
	// when the broker's lag was not sampled (NATS).
	Groups []string `json:"groups,omitempty"`
	// LoadStart, LoadEnd and QuiescenceEnd are seconds since the start.
	LoadStart     float64 `json:"load_start"`
	LoadEnd       float64 `json:"load_end"`
	QuiescenceEnd float64 `json:"quiescence_end"`
}

// Second is one second of the run.
type Second struct {
	T int `json:"t"`
	// POST attempts begun in the second: a POST's first attempt (Fresh),
	// its later ones (Retried), the concurrent duplicate's (Duplicate),
	// and key-reuse probes (Probes).
	Fresh     int `json:"fresh"`
	Retried   int `json:"retried"`
	Duplicate int `json:"duplicate"`
	Probes    int `json:"probes,omitempty"`
	// Latency of the POSTs that reached their final answer in the second.
	P50Ms float64 `json:"p50_ms"`
	P99Ms float64 `json:"p99_ms"`
	// Answers in the second: 5xx, none (transport errors and timeouts,
	// counted at the call), thrown away by the client on purpose.
	Status5xx int `json:"status_5xx"`
	NoAnswer  int `json:"no_answer"`
	Dropped   int `json:"dropped"`
	// OutboxBacklog is the unpublished outbox rows (idem_outbox_events
	// pending + publishing, the largest any live instance reported), -1
	// when unknown; Lag the records each group had not committed, nil
	// when not sampled; Charges the ledger charges paysim wrote in the
	// second (-1 when unknown).
	OutboxBacklog float64 `json:"outbox_backlog"`
	Lag           []int64 `json:"lag,omitempty"`
	Charges       float64 `json:"charges"`
}

// Mark is one moment of chaos.
type Mark struct {
	At float64 `json:"at"` // seconds since the start
	// Kind is kill, term, restart, broker, pg, net, failpoint or exit.
	Kind  string `json:"kind"`
	Label string `json:"label"`
}

// sample is one second's scrape of the pipeline.
type sample struct {
	at      time.Duration
	backlog float64
	charges float64
	lag     []int64
}

// timeline collects marks and samples while the run goes on.
type timeline struct {
	t0 time.Time

	mu      sync.Mutex
	marks   []Mark
	samples []sample
	load    [2]time.Duration
	quiet   time.Duration
}

func newTimeline() *timeline { return &timeline{t0: time.Now()} }

func (t *timeline) since() time.Duration { return time.Since(t.t0) }

func (t *timeline) mark(kind, label string) {
	t.mu.Lock()
	t.marks = append(t.marks, Mark{At: t.since().Seconds(), Kind: kind, Label: label})
	t.mu.Unlock()
}

// lagGroups are billing's consumer groups and their topics.
var lagGroups = []struct{ group, topic string }{
	{consumer.OrderGroup, usecase.TopicOrderEvents},
	{consumer.ChargeGroupDefault, usecase.TopicBillingCommands},
}

// groupLags is the records each of lagGroups has not committed.
func groupLags(ctx context.Context, adm *kadm.Client) ([]int64, error) {
	out := make([]int64, len(lagGroups))
	for i, g := range lagGroups {
		ends, err := adm.ListEndOffsets(ctx, g.topic)
		if err != nil {
			return nil, err
		}
		if err := ends.Error(); err != nil {
			return nil, err
		}
		offs, err := adm.FetchOffsets(ctx, g.group)
		if err != nil {
			return nil, err
		}
		ends.Each(func(o kadm.ListedOffset) {
			var at int64
			if c, ok := offs.Lookup(o.Topic, o.Partition); ok && c.Err == nil && c.At > 0 {
				at = c.At
			}
			out[i] += max(o.Offset-at, 0)
		})
	}
	return out, nil
}

// lagSampler reads the groups' lag from Kafka once a second; nil for NATS.
type lagSampler struct {
	cl  *kgo.Client
	adm *kadm.Client
}

func newLagSampler(brokers []string) *lagSampler {
	if len(brokers) == 0 {
		return nil
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return nil
	}
	return &lagSampler{cl: cl, adm: kadm.NewClient(cl)}
}

func (l *lagSampler) sample(ctx context.Context) []int64 {
	if l == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 800*time.Millisecond)
	defer cancel()
	lags, err := groupLags(ctx, l.adm)
	if err != nil {
		return nil
	}
	return lags
}

func (l *lagSampler) close() {
	if l != nil {
		l.cl.Close()
	}
}

// sampleNow records the pipeline's state from the last scrapes.
func (r *run) sampleNow(ctx context.Context, lags *lagSampler) {
	s := sample{at: r.tl.since(), backlog: -1, charges: -1}
	if r.scr.has(idemprom.MetricOutboxEvents) {
		s.backlog = r.scr.liveMax(idemprom.MetricOutboxEvents, `status="pending"`) +
			r.scr.liveMax(idemprom.MetricOutboxEvents, `status="publishing"`)
	}
	if r.paysim != nil && r.scr.has(MetricPaysimCharges) {
		s.charges = r.scr.total(MetricPaysimCharges)
	}
	s.lag = lags.sample(ctx)
	r.tl.mu.Lock()
	r.tl.samples = append(r.tl.samples, s)
	r.tl.mu.Unlock()
}

// MetricPaysimCharges is paysim's counter of ledger charges.
const MetricPaysimCharges = "paysim_charges_total"

// liveMax is the largest value of name (with labels) among the live
// incarnations' last scrapes: a gauge every instance reports alike.
func (s *scraper) liveMax(name string, labels ...string) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := 0.0
	for _, l := range s.last {
		m = max(m, l.sum(name, labels...))
	}
	return m
}

// build turns the driver's history and the samples into seconds.
func (t *timeline) build(d *driver) *Timeline {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := &Timeline{Marks: append([]Mark{}, t.marks...),
		LoadStart: t.load[0].Seconds(), LoadEnd: t.load[1].Seconds(), QuiescenceEnd: t.quiet.Seconds()}
	end := t.since()
	n := int(end/time.Second) + 1
	secs := make([]Second, n)
	for i := range secs {
		secs[i] = Second{T: i, OutboxBacklog: -1, Charges: -1}
	}
	at := func(d time.Duration) int { return min(max(int(d/time.Second), 0), n-1) }
	// The driver's clock starts at hist.t0; the timeline's at t.t0.
	off := d.hist.t0.Sub(t.t0)
	for _, op := range d.hist.snapshot() {
		s := &secs[at(off+time.Duration(op.Call))]
		switch {
		case op.Probe:
			s.Probes++
		case op.Dup && op.Attempt == 0:
			s.Duplicate++
		case op.Attempt > 0:
			s.Retried++
		default:
			s.Fresh++
		}
		if op.Return < 0 {
			s.NoAnswer++
		} else if op.Status >= 500 {
			secs[at(off+time.Duration(op.Return))].Status5xx++
		}
	}
	d.mu.Lock()
	lat := make([][]time.Duration, n)
	for i, l := range d.latencies {
		j := at(off + d.latencyAt[i])
		lat[j] = append(lat[j], l)
	}
	for _, a := range d.dropsAt {
		secs[at(off+a)].Dropped++
	}
	d.mu.Unlock()
	for i := range secs {
		secs[i].P50Ms = percentile(lat[i], 0.50)
		secs[i].P99Ms = percentile(lat[i], 0.99)
	}
	prev := -1.0
	for _, s := range t.samples {
		sec := &secs[at(s.at)]
		sec.OutboxBacklog = max(sec.OutboxBacklog, s.backlog)
		if s.charges >= 0 {
			if prev >= 0 {
				sec.Charges = max(sec.Charges, 0) + max(s.charges-prev, 0)
			}
			prev = s.charges
		}
		if s.lag != nil {
			sec.Lag = s.lag
		}
	}
	for _, s := range t.samples {
		if s.lag != nil {
			for _, g := range lagGroups {
				out.Groups = append(out.Groups, g.group)
			}
			break
		}
	}
	sort.SliceStable(out.Marks, func(i, j int) bool { return out.Marks[i].At < out.Marks[j].At })
	out.Seconds = secs
	return out
}

// momentOf is the second a violation points to on the timeline: when its
// order or payment was created, when its key was first sent, else when it
// was found.
func momentOf(v Violation, created map[string]time.Duration, firstCall map[string]time.Duration, found time.Duration) float64 {
	if d, ok := created[v.Subject]; ok {
		return d.Seconds()
	}
	if k, ok := strings.CutPrefix(v.Subject, "key "); ok {
		if d, ok := firstCall[k]; ok {
			return d.Seconds()
		}
	}
	for _, f := range strings.Fields(v.Detail) {
		if d, ok := firstCall[strings.TrimSuffix(f, ":")]; ok {
			return d.Seconds()
		}
	}
	return math.Max(found.Seconds(), 0)
}
