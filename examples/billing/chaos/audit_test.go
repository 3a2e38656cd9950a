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
	"time"
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
		return charge{ChargeID: "ch-" + key, IdempotencyKey: key, OrderID: order, CustomerID: "c-" + order, Principal: providerPrincipal, AmountKopecks: amount}
	}
	dec := func(order string, amount int64, key string) decline {
		return decline{DeclineID: "dc-" + key, IdempotencyKey: key, OrderID: order, CustomerID: "c-" + order, Principal: providerPrincipal, AmountKopecks: amount, Code: "CARD_DECLINED"}
	}
	exp := func(what, order string, amount int64, status, key string) expectation {
		return expectation{what: what, orderID: order, customerID: "c-" + order, amount: amount, status: status, keys: []string{key}}
	}
	base := []expectation{
		exp("order o1", "o1", 1000, "CHARGED", "e1:billing"),
		exp("payment p1", "o2", 950, "CHARGED", "p1:charge"),
		exp("order o3", "o3", 300, "FAILED", "e3:billing"),
	}
	good := ledger{Charges: []charge{ch("o1", 1000, "e1:billing"), ch("o2", 950, "p1:charge")}, Declines: []decline{dec("o3", 300, "e3:billing")}}
	with := func(mod func(l *ledger)) ledger {
		l := ledger{Charges: append([]charge(nil), good.Charges...), Declines: append([]decline(nil), good.Declines...)}
		mod(&l)
		return l
	}
	testCases := []struct {
		name string
		exp  []expectation
		l    ledger
		want []string
	}{
		{"all good", base, good, nil},
		{"double charge", base, with(func(l *ledger) { l.Charges = append(l.Charges, ch("o1", 1000, "e1:billing")) }), []string{"double-charge"}},
		{"lost charge", base, with(func(l *ledger) { l.Charges = l.Charges[:1] }), []string{"lost-charge"}},
		{"failed but charged", base, with(func(l *ledger) { l.Charges = append(l.Charges, ch("o3", 300, "e3:billing")) }), []string{"failed-but-charged"}},
		// A provider 500 turned into FAILED: paysim declined nothing.
		{"failed without a decline", base, with(func(l *ledger) { l.Declines = nil }), []string{"unexplained-failure"}},
		{"declined twice", base, with(func(l *ledger) { l.Declines = append(l.Declines, dec("o3", 300, "e3:billing")) }), []string{"double-decline"}},
		{"charged and declined", base, with(func(l *ledger) { l.Declines = append(l.Declines, dec("o1", 1000, "e1:billing")) }), []string{"charged-and-declined"}},
		{"charge without order", base, with(func(l *ledger) { l.Charges = append(l.Charges, ch("o9", 500, "x")) }), []string{"orphan-charge"}},
		{"decline without order", base, with(func(l *ledger) { l.Declines = append(l.Declines, dec("o9", 500, "x")) }), []string{"orphan-decline"}},
		{"wrong amount", base, with(func(l *ledger) { l.Charges[0].AmountKopecks = 1001 }), []string{"lost-charge", "orphan-charge"}},
		{"wrong customer", base, with(func(l *ledger) { l.Charges[1].CustomerID = "c-someone" }), []string{"wrong-customer"}},
		{"wrong customer on a decline", base, with(func(l *ledger) { l.Declines[0].CustomerID = "c-someone" }), []string{"wrong-customer"}},
		{"wrong principal", base, with(func(l *ledger) { l.Charges[0].Principal = "Bearer other" }), []string{"wrong-principal"}},
		// The retry that changed keys: the only charge carries a key no
		// command has.
		{"key not the command's", base, with(func(l *ledger) { l.Charges[1].IdempotencyKey = "p1:charge-r3" }), []string{"wrong-key"}},
		{"duplicate payment from a fresh key", base, with(func(l *ledger) { l.Charges = append(l.Charges, ch("o2", 950, "p1b:charge")) }), []string{"double-charge", "wrong-key"}},
		{"two commands for one target", append(base[:2:2], expectation{what: "order o3", orderID: "o3", customerID: "c-o3", amount: 300, status: "FAILED", keys: []string{"e3:billing", "e3b:billing"}}),
			good, []string{"double-command"}},
		{"no command at all", append(base[:2:2], expectation{what: "order o3", orderID: "o3", customerID: "c-o3", amount: 300, status: "FAILED", keys: []string{}}),
			good, []string{"wrong-key"}},
		{"not final", append(base, exp("order o4", "o4", 10, "CONFIRMED", "e4:billing")), good, []string{"not-final"}},
	}
	for _, tt := range testCases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			res := check(tt.exp, tt.l)
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
	if res.orders != 2 || res.payments != 1 || res.charged != 2 || res.failed != 1 || res.declines != 1 {
		t.Fatalf("counts %+v", res)
	}
}

func TestLedgerWatchOutlastsEveryRedeliveryTimer(t *testing.T) {
	t.Parallel()
	c := (&Config{IdemBin: "i", BillingBin: "b", DatabaseURL: "d"}).withDefaults()
	watch, longest := c.ledgerWatch()
	for _, tm := range c.redeliveryTimers() {
		if watch <= tm.d {
			t.Errorf("watch %v does not outlast %s %v", watch, tm.name, tm.d)
		}
	}
	if longest.d != outboxLeaseTTL(c.ShutdownTimeout)+5*time.Second || watch < longest.d+2*time.Second {
		t.Errorf("longest %s %v, watch %v", longest.name, longest.d, watch)
	}
	// An override in Env is the configuration the instances run with.
	c.Env = []string{"KAFKA_SESSION_TIMEOUT=40s"}
	if watch, longest := c.ledgerWatch(); longest.d != 40*time.Second || watch != 50*time.Second {
		t.Errorf("with a 40s session: longest %s %v, watch %v", longest.name, longest.d, watch)
	}
}

func TestCommandKeys(t *testing.T) {
	t.Parallel()
	rows := []outboxRow{
		{EventType: "OrderConfirmed", Payload: []byte(`{"order_id":"o1"}`)},
		{EventType: "ChargeRequested", Payload: []byte(`{"target":"order","target_id":"o1","idempotency_key":"e1:billing"}`)},
		{EventType: "ChargeRequested", Payload: []byte(`{"target":"payment","target_id":"p1","idempotency_key":"p1:charge"}`)},
		{EventType: "ChargeRequested", Payload: []byte(`not json`)},
	}
	got := commandKeys(rows)
	if len(got) != 2 || got["order o1"][0] != "e1:billing" || got["payment p1"][0] != "p1:charge" {
		t.Fatalf("commandKeys = %v", got)
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

// The report's server-side counters come from idem's collector when
// billing serves it, else from billing's own counters; n/a (-1) when no
// process exported either.
func TestServerCounters(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name          string
		text          string
		replays, dups int64
	}{
		{"idem collector", `idem_idempotency_requests_total{route="/orders",method="POST",mode="two_step",outcome="complete"} 9
idem_idempotency_replays_total{route="/orders",method="POST",mode="two_step"} 3
idem_idempotency_replays_total{route="/payments",method="POST",mode="two_step"} 2
idem_consumer_records_total{consumer="billing-service",topic="orders.events",outcome="processed"} 4
idem_consumer_duplicates_total{consumer="billing-charger",topic="billing.commands"} 1
billing_idempotency_events_total{kind="replay"} 99
billing_inbox_duplicates_total{consumer="billing-service"} 99
`, 5, 1},
		{"idem collector, nothing replayed or skipped", `idem_idempotency_requests_total{route="/orders",method="POST",mode="two_step",outcome="complete"} 9
idem_consumer_records_total{consumer="billing-service",topic="orders.events",outcome="processed"} 4
billing_idempotency_events_total{kind="replay"} 99
`, 0, 0},
		{"billing's own only", `billing_idempotency_events_total{kind="replay"} 7
billing_idempotency_events_total{kind="claim"} 70
billing_inbox_duplicates_total{consumer="billing-service"} 2
`, 7, 2},
		{"neither", `paysim_replays_total 4
`, -1, -1},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, tt.text) }))
		hc := &http.Client{}
		sc := newScraper(hc)
		sc.scrape(context.Background(), &proc{name: "b1", addr: strings.TrimPrefix(srv.URL, "http://")}, "/metrics")
		hc.CloseIdleConnections()
		srv.Close()
		if r, d := sc.serverCounters(); r != tt.replays || d != tt.dups {
			t.Errorf("%s: replays %d, inbox %d; want %d, %d", tt.name, r, d, tt.replays, tt.dups)
		}
	}
}
