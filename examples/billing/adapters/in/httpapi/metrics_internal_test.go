package httpapi

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// blockingCollector holds every Collect until release is closed.
type blockingCollector struct {
	desc    *prometheus.Desc
	entered chan struct{}
	release chan struct{}
}

func (b *blockingCollector) Describe(ch chan<- *prometheus.Desc) { ch <- b.desc }

func (b *blockingCollector) Collect(ch chan<- prometheus.Metric) {
	b.entered <- struct{}{}
	<-b.release
	ch <- prometheus.MustNewConstMetric(b.desc, prometheus.GaugeValue, 1)
}

// TestConcurrentScrapesAreCapped: with MaxInFlight scrapes in progress,
// one more is refused with 503 at once instead of queueing.
func TestConcurrentScrapesAreCapped(t *testing.T) {
	t.Parallel()
	m := NewMetrics()
	b := &blockingCollector{desc: prometheus.NewDesc("test_blocking", "h", nil, nil), entered: make(chan struct{}, 8), release: make(chan struct{})}
	m.reg.MustRegister(b)
	h := m.Handler(ScrapeConfig{Anonymous: true, MaxInFlight: 2})
	var wg sync.WaitGroup
	codes := make([]int, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
			codes[i] = w.Code
		}()
	}
	<-b.entered
	<-b.entered
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	close(b.release)
	wg.Wait()
	if w.Code != http.StatusServiceUnavailable || codes[0] != 200 || codes[1] != 200 {
		t.Fatalf("third scrape %d (want 503), the two in flight %v (want 200)", w.Code, codes)
	}
}
