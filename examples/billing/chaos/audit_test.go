package chaos

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
)

func kinds(vs []Violation) []string {
	var out []string
	for _, v := range vs {
		out = append(out, v.Kind)
	}
	sort.Strings(out)
	return out
}

func TestCheck(t *testing.T) {
	t.Parallel()
	ch := func(order string, amount int64, key string) charge {
		return charge{ChargeID: "ch-" + key, IdempotencyKey: key, OrderID: order, AmountKopecks: amount}
	}
	base := []expectation{
		{what: "order o1", orderID: "o1", amount: 1000, status: "CHARGED"},
		{what: "payment p1", orderID: "o2", amount: 950, status: "CHARGED"},
		{what: "order o3", orderID: "o3", amount: 300, status: "FAILED"},
	}
	good := []charge{ch("o1", 1000, "e1:billing"), ch("o2", 950, "p1:charge")}
	testCases := []struct {
		name    string
		exp     []expectation
		charges []charge
		want    []string
	}{
		{"all good", base, good, nil},
		{"double charge", base, append(good, ch("o1", 1000, "e1-again:billing")), []string{"double-charge"}},
		{"lost charge", base, good[:1], []string{"lost-charge"}},
		{"failed but charged", base, append(good, ch("o3", 300, "e3:billing")), []string{"failed-but-charged"}},
		{"charge without order", base, append(good, ch("o9", 500, "x")), []string{"orphan-charge"}},
		{"wrong amount", base, []charge{ch("o1", 1001, "e1:billing"), good[1]}, []string{"lost-charge", "orphan-charge"}},
		{"duplicate payment from a fresh key", base, append(good, ch("o2", 950, "p1b:charge")), []string{"double-charge"}},
		{"not final", append(base, expectation{what: "order o4", orderID: "o4", amount: 10, status: "CONFIRMED"}), good, []string{"not-final"}},
	}
	for _, tt := range testCases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			res := check(tt.exp, tt.charges)
			got := kinds(res.violations)
			if len(got) != len(tt.want) {
				t.Fatalf("violations %v (%+v), want %v", got, res.violations, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Fatalf("violations %v, want %v", got, tt.want)
				}
			}
		})
	}
	res := check(base, good)
	if res.orders != 2 || res.payments != 1 || res.charged != 2 || res.failed != 1 {
		t.Fatalf("counts %+v", res)
	}
}

func TestParseProm(t *testing.T) {
	t.Parallel()
	s := parseProm(`# HELP billing_charges_total Charges by outcome.
# TYPE billing_charges_total counter
billing_charges_total{outcome="charged"} 7
billing_charges_total{outcome="replayed"} 3
billing_charges_total{outcome="replayed",worker="b"} 2 1700000000000
billing_inbox_duplicates_total 4
not a metric line
go_gc_duration_seconds{quantile="0.5"} NaN
`)
	if got := s.sum("billing_charges_total", `outcome="replayed"`); got != 5 {
		t.Errorf("replayed = %v, want 5", got)
	}
	if got := s.sum("billing_charges_total"); got != 12 {
		t.Errorf("all charges = %v, want 12", got)
	}
	if got := s.sum("billing_inbox_duplicates_total"); got != 4 {
		t.Errorf("inbox = %v, want 4", got)
	}

	// Counters restart from zero in each incarnation: the last scrape of
	// an incarnation is banked at freeze, scrapes between freeze and thaw
	// (the dying incarnation) are ignored.
	var v atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "billing_inbox_duplicates_total %d\n", v.Load())
	}))
	defer srv.Close()
	hc := &http.Client{}
	defer hc.CloseIdleConnections()
	sc := newScraper(hc)
	p1 := &proc{name: "b1", addr: strings.TrimPrefix(srv.URL, "http://")}
	ctx := context.Background()
	v.Store(4)
	sc.scrape(ctx, p1, "/metrics")
	sc.freeze(p1)
	v.Store(9)
	sc.scrape(ctx, p1, "/metrics")
	sc.thaw(p1)
	v.Store(2)
	sc.scrape(ctx, p1, "/metrics")
	if got := sc.total("billing_inbox_duplicates_total"); got != 6 {
		t.Errorf("total = %v, want 4 (first incarnation) + 2 (second)", got)
	}
	if !sc.has("billing_inbox_duplicates_total") || sc.has("paysim_replays_total") {
		t.Error("has() wrong")
	}
}
