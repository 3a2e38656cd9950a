package httpapi

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/idemkit/idem/idempotency"
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

// Handler serves the registry.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// IdempotencyHook is idempotency.Config.Hook.
func (m *Metrics) IdempotencyHook(_ context.Context, e idempotency.Event) {
	m.idem.WithLabelValues(string(e.Kind)).Inc()
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

// countRequests counts every request by its route pattern (never the raw
// path: ids would explode the label set).
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
		m.requests.WithLabelValues(r.Method, route, strconv.Itoa(sw.status)).Inc()
	})
}

// scrapeTimeout bounds the database and Kafka queries of one scrape.
const scrapeTimeout = 3 * time.Second

// outboxCollector reads the outbox status at scrape time.
type outboxCollector struct {
	db      outbox.DBTX
	pending *prometheus.Desc
	oldest  *prometheus.Desc
	dead    *prometheus.Desc
	log     *slog.Logger
}

// RegisterOutbox exports outbox pending count, oldest pending age and dead
// count, read from db at each scrape.
func (m *Metrics) RegisterOutbox(db outbox.DBTX, log *slog.Logger) {
	m.reg.MustRegister(&outboxCollector{
		db:      db,
		pending: prometheus.NewDesc("billing_outbox_pending", "Outbox events not yet published.", nil, nil),
		oldest:  prometheus.NewDesc("billing_outbox_oldest_pending_age_seconds", "Age of the oldest unpublished outbox event.", nil, nil),
		dead:    prometheus.NewDesc("billing_outbox_dead", "Outbox events that used up their attempts.", nil, nil),
		log:     log,
	})
}

func (c *outboxCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.pending
	ch <- c.oldest
	ch <- c.dead
}

func (c *outboxCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	st, err := outbox.GetStatus(ctx, c.db, outbox.LeaseTTLDefault, 0)
	if err != nil {
		c.log.Warn("metrics: outbox status", "error", err)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(st.Pending+st.Publishing))
	ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, st.OldestPending.Seconds())
	ch <- prometheus.MustNewConstMetric(c.dead, prometheus.GaugeValue, float64(st.Dead))
}

// lagCollector reads consumer-group lag from Kafka at scrape time.
type lagCollector struct {
	adm    *kadm.Client
	groups []string
	lag    *prometheus.Desc
	log    *slog.Logger
}

// RegisterLag exports the lag of groups, per topic, read at each scrape.
func (m *Metrics) RegisterLag(adm *kadm.Client, log *slog.Logger, groups ...string) {
	m.reg.MustRegister(&lagCollector{
		adm: adm, groups: groups, log: log,
		lag: prometheus.NewDesc("billing_consumer_lag", "Records not yet committed by a consumer group, per topic.", []string{"group", "topic"}, nil),
	})
}

func (c *lagCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.lag }

func (c *lagCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
	defer cancel()
	lags, err := c.adm.Lag(ctx, c.groups...)
	if err != nil {
		c.log.Warn("metrics: consumer lag", "error", err)
		return
	}
	for _, g := range c.groups {
		gl, ok := lags[g]
		if !ok || gl.Error() != nil {
			continue
		}
		for topic, total := range gl.Lag.TotalByTopic() {
			ch <- prometheus.MustNewConstMetric(c.lag, prometheus.GaugeValue, float64(total.Lag), g, topic)
		}
	}
}
