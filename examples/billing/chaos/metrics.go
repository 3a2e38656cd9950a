package chaos

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// series is one scrape: value by series ("name" or "name{labels}").
type series map[string]float64

// parseProm parses the Prometheus text exposition format, enough for
// counters and gauges: comment lines are skipped, timestamps ignored.
func parseProm(text string) series {
	out := series{}
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		// The value follows the last space outside the label set.
		end := strings.LastIndexByte(line, '}')
		rest := line
		name := ""
		if end >= 0 {
			name, rest = line[:end+1], line[end+1:]
		} else {
			i := strings.IndexByte(line, ' ')
			if i < 0 {
				continue
			}
			name, rest = line[:i], line[i:]
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		out[name] = v
	}
	return out
}

// sum adds every series of metric name whose labels contain all of labels
// (each like `outcome="replayed"`).
func (s series) sum(name string, labels ...string) float64 {
	var t float64
	for k, v := range s {
		base, lbl, _ := strings.Cut(k, "{")
		if base != name {
			continue
		}
		ok := true
		for _, l := range labels {
			if !strings.Contains(lbl, l) {
				ok = false
			}
		}
		if ok {
			t += v
		}
	}
	return t
}

// scraper keeps the counters of processes that restart: a counter starts
// from zero in every incarnation, so the last scrape of an incarnation is
// banked before it is stopped, and totals add banked and current values.
type scraper struct {
	hc *http.Client

	mu    sync.Mutex
	last  map[*proc]series
	bank  []series
	freez map[*proc]bool
}

func newScraper(hc *http.Client) *scraper {
	return &scraper{hc: hc, last: map[*proc]series{}, freez: map[*proc]bool{}}
}

func (s *scraper) scrape(ctx context.Context, p *proc, path string) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.addr+path, nil)
	if err != nil {
		return
	}
	resp, err := s.hc.Do(req)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil || resp.StatusCode != http.StatusOK {
		return
	}
	ser := parseProm(string(b))
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.freez[p] {
		s.last[p] = ser
	}
}

// freeze banks p's last scrape before p is stopped; later scrapes of this
// incarnation are ignored until thaw.
func (s *scraper) freeze(p *proc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l, ok := s.last[p]; ok {
		s.bank = append(s.bank, l)
		delete(s.last, p)
	}
	s.freez[p] = true
}

func (s *scraper) thaw(p *proc) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.freez, p)
}

// total sums name (with labels) over every incarnation seen.
func (s *scraper) total(name string, labels ...string) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var t float64
	for _, b := range s.bank {
		t += b.sum(name, labels...)
	}
	for _, l := range s.last {
		t += l.sum(name, labels...)
	}
	return t
}

// has reports whether any scrape carried a series of metric name with all
// of labels.
func (s *scraper) has(name string, labels ...string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	check := func(se series) bool {
		for k := range se {
			b, lbl, _ := strings.Cut(k, "{")
			if b != name {
				continue
			}
			ok := true
			for _, l := range labels {
				if !strings.Contains(lbl, l) {
					ok = false
				}
			}
			if ok {
				return true
			}
		}
		return false
	}
	for _, b := range s.bank {
		if check(b) {
			return true
		}
	}
	for _, l := range s.last {
		if check(l) {
			return true
		}
	}
	return false
}

// serverCounters are the replays billing's idempotency middleware counted
// and the redeliveries its inbox skipped, over every incarnation; -1 when
// no process exported the metric. idem's collector (MetricIdem*) is read
// first: once billing serves it (its request or record counters are
// there), a missing replay or duplicate series is zero. Without it,
// billing's own counters (MetricIdempotencyEvents, MetricInboxDuplicates)
// are read.
func (s *scraper) serverCounters() (replays, inbox int64) {
	replays, inbox = -1, -1
	switch {
	case s.has(MetricIdemRequests) || s.has(MetricIdemReplays):
		replays = int64(s.total(MetricIdemReplays))
	case s.has(MetricIdempotencyEvents):
		replays = int64(s.total(MetricIdempotencyEvents, `kind="replay"`))
	}
	switch {
	case s.has(MetricIdemRecords) || s.has(MetricIdemDuplicates):
		inbox = int64(s.total(MetricIdemDuplicates))
	case s.has(MetricInboxDuplicates):
		inbox = int64(s.total(MetricInboxDuplicates))
	}
	return replays, inbox
}
