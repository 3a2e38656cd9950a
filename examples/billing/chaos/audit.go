package chaos

import (
	"fmt"
	"sort"
	"strings"
)

// expectation is one charge the system owes: a confirmed order (its
// total) or an accepted payment (its amount), with its final status.
type expectation struct {
	what    string // "order o-1" or "payment p-1"
	orderID string
	amount  int64
	status  string
}

// expected lists what the driver was promised, with the statuses read at
// quiescence (keyed by GET path).
func (d *driver) expected(statuses map[string]string) []expectation {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []expectation
	for _, o := range d.orders {
		if o.Confirmed {
			out = append(out, expectation{what: "order " + o.ID, orderID: o.ID, amount: o.Total, status: statuses["/orders/"+o.ID]})
		}
	}
	for _, p := range d.payments {
		out = append(out, expectation{what: "payment " + p.ID, orderID: p.OrderID, amount: p.Amount, status: statuses["/payments/"+p.ID]})
	}
	return out
}

type auditResult struct {
	orders, payments, charged, failed int
	violations                        []Violation
}

// check matches ledger charges to expectations by (order id, amount). The
// driver makes order totals whole roubles and payment amounts never whole,
// and gives every payment its own order, so a match is unambiguous.
//
//   - CHARGED needs exactly one charge: none is a lost charge, more is a
//     double charge.
//   - FAILED needs none (paysim failed before charging every attempt).
//   - Anything else is work that never became final.
//   - A charge no expectation claims is a charge without an order or
//     payment: an unconfirmed order charged, a duplicate payment created
//     by a retry, or a wrong amount.
func check(exp []expectation, charges []charge) auditResult {
	type k struct {
		order  string
		amount int64
	}
	byKey := map[k][]charge{}
	for _, c := range charges {
		key := k{c.OrderID, c.AmountKopecks}
		byKey[key] = append(byKey[key], c)
	}
	var res auditResult
	for _, e := range exp {
		if strings.HasPrefix(e.what, "order ") {
			res.orders++
		} else {
			res.payments++
		}
		key := k{e.orderID, e.amount}
		got := byKey[key]
		delete(byKey, key)
		switch e.status {
		case "CHARGED":
			res.charged++
			switch {
			case len(got) == 0:
				res.violations = append(res.violations, Violation{Kind: "lost-charge", Subject: e.what,
					Detail: fmt.Sprintf("status CHARGED but no ledger charge of %d for order %s", e.amount, e.orderID)})
			case len(got) > 1:
				res.violations = append(res.violations, Violation{Kind: "double-charge", Subject: e.what,
					Detail: fmt.Sprintf("charged %d times %d (keys %s)", len(got), e.amount, keysOf(got))})
			}
		case "FAILED":
			res.failed++
			if len(got) > 0 {
				res.violations = append(res.violations, Violation{Kind: "failed-but-charged", Subject: e.what,
					Detail: fmt.Sprintf("status FAILED but charged %d times (keys %s)", len(got), keysOf(got))})
			}
		default:
			st := e.status
			if st == "" {
				st = "unknown"
			}
			res.violations = append(res.violations, Violation{Kind: "not-final", Subject: e.what,
				Detail: fmt.Sprintf("status %s at the end, %d ledger charges", st, len(got))})
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
		got := byKey[key]
		res.violations = append(res.violations, Violation{Kind: "orphan-charge", Subject: "order " + key.order,
			Detail: fmt.Sprintf("%d charge(s) of %d that no confirmed order or accepted payment claims (keys %s)", len(got), key.amount, keysOf(got))})
	}
	return res
}

func keysOf(cs []charge) string {
	var ks []string
	for _, c := range cs {
		ks = append(ks, c.IdempotencyKey)
	}
	return strings.Join(ks, ", ")
}
