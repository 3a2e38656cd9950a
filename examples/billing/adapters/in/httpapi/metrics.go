package httpapi

import (
	"context"
	"crypto/subtle"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/problem"
	"github.com/idemkit/idem/outbox"
)

// Metrics are billing's Prometheus metrics. The core packages know nothing
// of Prometheus: the idempotency middleware's Hook and the charge worker's
// callback feed these counters here, in the adapter.
type Metrics struct {
	reg      *prometheus.Registry
	requests *prometheus.CounterVec
	idem     *prometheus.CounterVec
	charges  *prometheus.CounterVec
	inboxDup *prometheus.CounterVec
	provRep  prometheus.Counter
}

// NewMetrics registers billing's metrics (and the Go runtime's) in a fresh
// registry.
func NewMetrics() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "billing_http_requests_total", Help: "HTTP requests by method, route and status.",
		}, []string{"method", "route", "status"}),
		idem: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "billing_idempotency_events_total",
			Help: "Idempotency middleware events by kind: replay (a stored response replayed), conflict (409 in progress), mismatch (key reused with another body), claim, complete, release, ...",
		}, []string{"kind"}),
		charges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "billing_charges_total", Help: "Charges settled by the charge worker, by target (order, payment) and outcome (charged, failed).",
		}, []string{"target", "outcome"}),
		inboxDup: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "billing_inbox_duplicates_total", Help: "Redelivered events skipped as already processed (processed_event), by consumer.",
		}, []string{"consumer"}),
		provRep: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "billing_provider_replays_total", Help: "Charges the provider answered from its idempotency store (the key had been charged before).",
		}),
	}
	m.reg.MustRegister(m.requests, m.idem, m.charges, m.inboxDup, m.provRep, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Registry is the registry /metrics serves: idem's own collector (module
// github.com/idemkit/idem/prom) registers its metrics here, beside
// billing's.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// MaxScrapesDefault is ScrapeConfig.MaxInFlight's default.
const MaxScrapesDefault = 2

// ScrapeConfig is the access rule of GET /metrics.
type ScrapeConfig struct {
	// Token is the bearer token a scrape must present (BILLING_METRICS_TOKEN).
	// Defaults to "": see Anonymous.
	Token string
	// Anonymous, with no Token, serves /metrics to anyone: app sets it only
	// for a loopback listener. Defaults to false: without a Token every
	// scrape is refused with 401.
	Anonymous bool
	// MaxInFlight caps concurrent scrapes; more are refused with 503.
	// Defaults to MaxScrapesDefault (2).
	MaxInFlight int
}

// Handler serves the registry under cfg's access rule. A scrape reads
// counters and the gauges the background refresh (Gauges) last computed:
// it never queries the database or Kafka.
func (m *Metrics) Handler(cfg ScrapeConfig) http.Handler {
	n := cfg.MaxInFlight
	if n <= 0 {
		n = MaxScrapesDefault
	}
	prom := promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{MaxRequestsInFlight: n})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if cfg.Token == "" && !cfg.Anonymous {
			w.Header().Set("WWW-Authenticate", `Bearer realm="billing-metrics"`)
			problem.Write(w, http.StatusUnauthorized, CodeUnauthorized, "/metrics needs BILLING_METRICS_TOKEN on a listener that is not loopback (or use ADMIN_ADDR)")
			return
		}
		if cfg.Token != "" {
			scheme, secret, _ := strings.Cut(r.Header.Get("Authorization"), " ")
			if !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare([]byte(secret), []byte(cfg.Token)) != 1 {
				w.Header().Set("WWW-Authenticate", `Bearer realm="billing-metrics"`)
				problem.Write(w, http.StatusUnauthorized, CodeUnauthorized, "a valid metrics token is required")
				return
			}
		}
		prom.ServeHTTP(w, r)
	})
}

// IdempotencyHook is idempotency.Config.Hook.
func (m *Metrics) IdempotencyHook(ctx context.Context, e idempotency.Event) context.Context {
	m.idem.WithLabelValues(string(e.Kind)).Inc()
	return ctx
}

// InboxDuplicate returns a counter function for consumer's skipped
// redeliveries.
func (m *Metrics) InboxDuplicate(consumer string) func() {
	c := m.inboxDup.WithLabelValues(consumer)
	return c.Inc
}

// ProviderReplay counts one charge answered from the provider's store.
func (m *Metrics) ProviderReplay() { m.provRep.Inc() }

// ChargeSettled counts one settled charge.
func (m *Metrics) ChargeSettled(target, outcome string) {
	m.charges.WithLabelValues(target, outcome).Inc()
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// countRequests counts every request by its route pattern and a method
// from a fixed set, never by raw input: the path would explode the label
// set with ids, and the method is whatever the client sends (a 64 KiB
// token is a valid method), each new one a series kept for good.
func (m *Metrics) countRequests(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		route := r.Pattern
		if route == "" {
			route = "unmatched"
		}
		if sw.status == 0 {
			sw.status = http.StatusOK
		}
		m.requests.WithLabelValues(methodLabel(r.Method), route, statusLabel(sw.status)).Inc()
	})
}

// methodLabel is r.Method if it is one of RFC 9110's methods (or PATCH),
// else "other".
func methodLabel(method string) string {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace:
		return method
	}
	return "other"
}

// statusLabel is the status code; net/http only sends 100..999.
func statusLabel(code int) string {
	if code < 100 || code > 999 {
		return "other"
	}
	return strconv.Itoa(code)
}

// RefreshIntervalDefault is GaugesConfig.Interval's default.
const RefreshIntervalDefault = 5 * time.Second

// GaugesConfig configures the background gauges.
type GaugesConfig struct {
	// DB is read for the outbox gauges (billing_outbox_pending,
	// billing_outbox_oldest_pending_age_seconds, billing_outbox_dead).
	// Defaults to nil: no outbox gauges.
	DB outbox.DBTX
	// Lag is read for billing_consumer_lag of Groups. Defaults to nil: no
	// lag gauge.
	Lag *kadm.Client
	// Groups are the consumer groups whose lag is exported. Defaults to
	// none.
	Groups []string
	// Interval is the time between two refreshes; each also bounds its own
	// queries. Defaults to RefreshIntervalDefault (5s).
	Interval time.Duration
	// Logger receives refresh failures. Defaults to slog.Default().
	Logger *slog.Logger
}

// Gauges computes the gauges that cost a database or Kafka round trip in
// the background, one refresh at a time, and serves the last values to
// every scrape: scrapers, however many, add no load to the pool the API
// uses. A gauge appears once its first refresh succeeded; after a failed
// refresh it keeps its last value, and
// billing_gauges_refreshed_timestamp_seconds{source} says how old that is.
type Gauges struct {
	cfg GaugesConfig
	log *slog.Logger

	pending, oldest, dead, lag, refreshed *prometheus.Desc

	mu     sync.Mutex
	st     *outbox.Status // nil until the first refresh
	lags   map[[2]string]float64
	stamps map[string]time.Time
}

// NewGauges registers the background gauges with m's registry; Run
// refreshes them.
func (m *Metrics) NewGauges(cfg GaugesConfig) *Gauges {
	if cfg.Interval <= 0 {
		cfg.Interval = RefreshIntervalDefault
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	g := &Gauges{
		cfg: cfg, log: log,
		pending:   prometheus.NewDesc("billing_outbox_pending", "Outbox events not yet published.", nil, nil),
		oldest:    prometheus.NewDesc("billing_outbox_oldest_pending_age_seconds", "Age of the oldest unpublished outbox event.", nil, nil),
		dead:      prometheus.NewDesc("billing_outbox_dead", "Outbox events that used up their attempts.", nil, nil),
		lag:       prometheus.NewDesc("billing_consumer_lag", "Records not yet committed by a consumer group, per topic.", []string{"group", "topic"}, nil),
		refreshed: prometheus.NewDesc("billing_gauges_refreshed_timestamp_seconds", "When the background gauges of a source (outbox, lag) were last refreshed.", []string{"source"}, nil),
		stamps:    map[string]time.Time{},
	}
	m.reg.MustRegister(g)
	return g
}

// Run refreshes the gauges at once, then every Interval, until ctx ends;
// it returns nil then. It is lifecycle.Go's function.
func (g *Gauges) Run(ctx context.Context) error {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		g.Refresh(ctx)
		t.Reset(g.cfg.Interval)
	}
}

// Refresh computes every gauge once, each source bounded by Interval.
func (g *Gauges) Refresh(ctx context.Context) {
	if g.cfg.DB != nil {
		g.refreshOutbox(ctx)
	}
	if g.cfg.Lag != nil && len(g.cfg.Groups) > 0 {
		g.refreshLag(ctx)
	}
}

func (g *Gauges) refreshOutbox(parent context.Context) {
	ctx, cancel := context.WithTimeout(parent, g.cfg.Interval)
	defer cancel()
	st, err := outbox.GetStatus(ctx, g.cfg.DB, outbox.LeaseTTLDefault, 0)
	if err != nil {
		if parent.Err() == nil { // not the stop
			g.log.Warn("metrics: outbox status", "error", err)
		}
		return
	}
	g.mu.Lock()
	g.st = st
	g.stamps["outbox"] = time.Now()
	g.mu.Unlock()
}

func (g *Gauges) refreshLag(parent context.Context) {
	ctx, cancel := context.WithTimeout(parent, g.cfg.Interval)
	defer cancel()
	lags, err := g.cfg.Lag.Lag(ctx, g.cfg.Groups...)
	if err != nil {
		if parent.Err() == nil {
			g.log.Warn("metrics: consumer lag", "error", err)
		}
		return
	}
	out := map[[2]string]float64{}
	for _, grp := range g.cfg.Groups {
		gl, ok := lags[grp]
		if !ok || gl.Error() != nil {
			continue
		}
		for topic, total := range gl.Lag.TotalByTopic() {
			out[[2]string{grp, topic}] = float64(total.Lag)
		}
	}
	g.mu.Lock()
	g.lags = out
	g.stamps["lag"] = time.Now()
	g.mu.Unlock()
}

// Describe implements prometheus.Collector.
func (g *Gauges) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{g.pending, g.oldest, g.dead, g.lag, g.refreshed} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: the last refreshed values, no
// I/O.
func (g *Gauges) Collect(ch chan<- prometheus.Metric) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if st := g.st; st != nil {
		ch <- prometheus.MustNewConstMetric(g.pending, prometheus.GaugeValue, float64(st.Pending+st.Publishing))
		ch <- prometheus.MustNewConstMetric(g.oldest, prometheus.GaugeValue, st.OldestPending.Seconds())
		ch <- prometheus.MustNewConstMetric(g.dead, prometheus.GaugeValue, float64(st.Dead))
	}
	for k, v := range g.lags {
		ch <- prometheus.MustNewConstMetric(g.lag, prometheus.GaugeValue, v, k[0], k[1])
	}
	for source, at := range g.stamps {
		ch <- prometheus.MustNewConstMetric(g.refreshed, prometheus.GaugeValue, float64(at.UnixNano())/1e9, source)
	}
}
