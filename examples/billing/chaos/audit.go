package chaos

import (
	"fmt"
	"sort"
	"strings"

	"github.com/idemkit/idem/paysim"
)

// providerPrincipal is the principal paysim records for billing's charges:
// billing sends paysim no Authorization header, and paysim scopes such a
// request (and shows it in its ledger) as paysim.ScopeDefault. A charge
// under any other principal was sent by something else, or with another
// credential, and escapes the provider's per-principal key dedup.
const providerPrincipal = paysim.ScopeDefault

// expectation is one charge the system owes: a confirmed order (its
// total) or an accepted payment (its amount), with its final status.
type expectation struct {
	what       string // "order o-1" or "payment p-1"
	orderID    string
	customerID string
	amount     int64
	status     string
	// keys are the idempotency keys of the ChargeRequested commands billing
	// wrote for this target (its outbox); the charge or decline must carry
	// one of them. Nil when the outbox was not read (unit tests): the key
	// is then not checked.
	keys []string
}

// expected lists what the driver was promised, with the statuses read at
// quiescence (keyed by GET path).
func (d *driver) expected(statuses map[string]string) []expectation {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []expectation
	for _, o := range d.orders {
		if o.Confirmed {
			out = append(out, expectation{what: "order " + o.ID, orderID: o.ID, customerID: o.CustomerID, amount: o.Total, status: statuses["/orders/"+o.ID]})
		}
	}
	for _, p := range d.payments {
		out = append(out, expectation{what: "payment " + p.ID, orderID: p.OrderID, customerID: p.CustomerID, amount: p.Amount, status: statuses["/payments/"+p.ID]})
	}
	return out
}

// ledger is paysim's GET /ledger: the charges and the definitive declines.
type ledger struct {
	Charges  []charge  `json:"charges"`
	Declines []decline `json:"declines"`
}

// charge is one charge of paysim's ledger.
type charge struct {
	ChargeID       string `json:"charge_id"`
	IdempotencyKey string `json:"idempotency_key"`
	OrderID        string `json:"order_id"`
	CustomerID     string `json:"customer_id"`
	Principal      string `json:"principal"`
	AmountKopecks  int64  `json:"amount_kopecks"`
}

// decline is one definitive decline of paysim's ledger (402 CARD_DECLINED).
type decline struct {
	DeclineID      string `json:"decline_id"`
	IdempotencyKey string `json:"idempotency_key"`
	OrderID        string `json:"order_id"`
	CustomerID     string `json:"customer_id"`
	Principal      string `json:"principal"`
	AmountKopecks  int64  `json:"amount_kopecks"`
	Code           string `json:"code"`
}

type auditResult struct {
	orders, payments, charged, failed, declines int
	violations                                  []Violation
}

// entry is a charge or a decline, for the checks they share.
type entry struct {
	kind                                  string // "charge", "decline"
	id, key, orderID, customerID, princip string
	amount                                int64
}

func entries(l ledger) []entry {
	out := make([]entry, 0, len(l.Charges)+len(l.Declines))
	for _, c := range l.Charges {
		out = append(out, entry{"charge", c.ChargeID, c.IdempotencyKey, c.OrderID, c.CustomerID, c.Principal, c.AmountKopecks})
	}
	for _, d := range l.Declines {
		out = append(out, entry{"decline", d.DeclineID, d.IdempotencyKey, d.OrderID, d.CustomerID, d.Principal, d.AmountKopecks})
	}
	return out
}

// check matches the provider's ledger, the only ground truth, to what the
// driver was promised, trusting nothing billing reports but the final
// status, which it checks against the ledger. Entries are matched to an
// expectation by (order id, amount): the driver makes order totals whole
// roubles and payment amounts never whole, and gives every payment its own
// order, so a match is unambiguous.
//
//   - CHARGED needs exactly one charge and no decline: none is a lost
//     charge, more is a double charge, a decline beside it means two keys
//     were used for one operation.
//   - FAILED needs no charge and exactly one decline recorded by paysim (a
//     definitive 402): the harness's faults (500s, dropped answers, cut
//     connections, crashes) are never a reason to fail a charge, so a
//     FAILED without its decline is a transient error billing gave up on or
//     mistook for a refusal.
//   - Anything else is work that never became final.
//   - Every matched charge or decline must carry the expectation's
//     customer, billing's provider principal and, when known, the key of
//     billing's ChargeRequested command for it (a charge under another key
//     is a key minted outside the command: a retry that changed keys).
//   - A charge or decline no expectation claims is an orphan: an
//     unconfirmed order charged, a duplicate payment created by a retry,
//     or a wrong amount.
func check(exp []expectation, l ledger) auditResult {
	type k struct {
		order  string
		amount int64
	}
	byKey := map[k][]entry{}
	for _, e := range entries(l) {
		key := k{e.orderID, e.amount}
		byKey[key] = append(byKey[key], e)
	}
	res := auditResult{declines: len(l.Declines)}
	bad := func(kind, subject, format string, a ...any) {
		res.violations = append(res.violations, Violation{Kind: kind, Subject: subject, Detail: fmt.Sprintf(format, a...)})
	}
	for _, e := range exp {
		if strings.HasPrefix(e.what, "order ") {
			res.orders++
		} else {
			res.payments++
		}
		key := k{e.orderID, e.amount}
		got := byKey[key]
		delete(byKey, key)
		var charges, declines []entry
		for _, g := range got {
			if g.kind == "charge" {
				charges = append(charges, g)
			} else {
				declines = append(declines, g)
			}
			switch {
			case g.customerID != e.customerID:
				bad("wrong-customer", e.what, "%s %s (key %s) is for customer %q, the order's customer is %q", g.kind, g.id, g.key, g.customerID, e.customerID)
			case g.princip != providerPrincipal:
				bad("wrong-principal", e.what, "%s %s (key %s) was made by principal %q, billing's is %q", g.kind, g.id, g.key, g.princip, providerPrincipal)
			case e.keys != nil && !contains(e.keys, g.key):
				bad("wrong-key", e.what, "%s %s carries key %q; billing's charge command for it carries %s", g.kind, g.id, g.key, quoteAll(e.keys))
			}
		}
		if len(e.keys) > 1 {
			bad("double-command", e.what, "billing wrote %d charge commands for it (keys %s)", len(e.keys), quoteAll(e.keys))
		}
		switch e.status {
		case "CHARGED":
			res.charged++
			switch {
			case len(charges) == 0:
				bad("lost-charge", e.what, "status CHARGED but no ledger charge of %d for order %s%s", e.amount, e.orderID, declinedNote(declines))
			case len(charges) > 1:
				bad("double-charge", e.what, "charged %d times %d (keys %s)", len(charges), e.amount, keysOf(charges))
			case len(declines) > 0:
				bad("charged-and-declined", e.what, "charged (key %s) and declined (keys %s): two keys for one charge", charges[0].key, keysOf(declines))
			}
		case "FAILED":
			res.failed++
			switch {
			case len(charges) > 0:
				bad("failed-but-charged", e.what, "status FAILED but charged %d times (keys %s)", len(charges), keysOf(charges))
			case len(declines) == 0:
				bad("unexplained-failure", e.what, "status FAILED but paysim recorded no decline of %d for order %s: a transient fault became a failure", e.amount, e.orderID)
			case len(declines) > 1:
				bad("double-decline", e.what, "declined %d times (keys %s): one key per charge", len(declines), keysOf(declines))
			}
		default:
			st := e.status
			if st == "" {
				st = "unknown"
			}
			bad("not-final", e.what, "status %s at the end, %d ledger charges, %d declines", st, len(charges), len(declines))
		}
	}
	var orphans []k
	for key := range byKey {
		orphans = append(orphans, key)
	}
	sort.Slice(orphans, func(i, j int) bool {
		if orphans[i].order != orphans[j].order {
			return orphans[i].order < orphans[j].order
		}
		return orphans[i].amount < orphans[j].amount
	})
	for _, key := range orphans {
		var charges, declines []entry
		for _, g := range byKey[key] {
			if g.kind == "charge" {
				charges = append(charges, g)
			} else {
				declines = append(declines, g)
			}
		}
		if len(charges) > 0 {
			bad("orphan-charge", "order "+key.order, "%d charge(s) of %d that no confirmed order or accepted payment claims (keys %s)", len(charges), key.amount, keysOf(charges))
		}
		if len(declines) > 0 {
			bad("orphan-decline", "order "+key.order, "%d decline(s) of %d that no confirmed order or accepted payment claims (keys %s)", len(declines), key.amount, keysOf(declines))
		}
	}
	return res
}

func declinedNote(ds []entry) string {
	if len(ds) == 0 {
		return ""
	}
	return " (declined under keys " + keysOf(ds) + ")"
}

func keysOf(es []entry) string {
	var ks []string
	for _, e := range es {
		ks = append(ks, e.key)
	}
	return strings.Join(ks, ", ")
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

func quoteAll(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(q, ", ")
}
