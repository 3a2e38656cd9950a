package paysim

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"
)

// ErrLedgerConflict is an insert whose idempotency key is already in the
// ledger for a different order, customer or amount. The existing row
// stands; nothing is charged.
var ErrLedgerConflict = errors.New("paysim: idempotency key already charged for a different request")

// Charge is one ledger row. The JSON names are the GET /ledger contract.
type Charge struct {
	ChargeID       string `json:"charge_id"`
	IdempotencyKey string `json:"idempotency_key"`
	OrderID        string `json:"order_id"`
	CustomerID     string `json:"-"`
	// Principal is the merchant that asked for the charge (the scope of
	// its idempotency key); not part of the GET /ledger contract.
	Principal     string    `json:"-"`
	AmountKopecks int64     `json:"amount_kopecks"`
	CreatedAt     time.Time `json:"created_at"`
}

// Ledger is the provider's book of charges, in memory. One idempotency key
// of one principal has at most one row by construction (keys are scoped by
// principal, as in the idempotency middleware, so two merchants' keys never
// collide): the unique index (byKey) and the
// rows change together under one mutex, and Insert returns the existing
// row instead of adding a second. This holds whatever the HTTP layer in
// front of it does, so a test that finds two rows for one key has found a
// bug in the ledger itself, not a race.
type Ledger struct {
	mu    sync.Mutex
	rows  []Charge
	byKey map[ledgerKey]int // (principal, idempotency key) → index in rows
	now   func() time.Time
}

// NewLedger returns an empty ledger.
func NewLedger() *Ledger {
	return &Ledger{byKey: map[ledgerKey]int{}, now: time.Now}
}

type ledgerKey struct{ principal, key string }

func keyOf(c Charge) ledgerKey {
	return ledgerKey{c.Principal, c.IdempotencyKey}
}

// Insert charges c unless c.IdempotencyKey already has a row for
// c.Principal. It returns
// the row (new or existing) and whether it was inserted. An existing row
// for a different order, customer or amount is ErrLedgerConflict, with the
// existing row. ChargeID and CreatedAt are assigned here.
func (l *Ledger) Insert(c Charge) (Charge, bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if i, ok := l.byKey[keyOf(c)]; ok {
		old := l.rows[i]
		if old.OrderID != c.OrderID || old.CustomerID != c.CustomerID || old.AmountKopecks != c.AmountKopecks {
			return old, false, ErrLedgerConflict
		}
		return old, false, nil
	}
	c.ChargeID = fmt.Sprintf("ch_%08d", len(l.rows)+1)
	c.CreatedAt = l.now().UTC()
	l.byKey[keyOf(c)] = len(l.rows)
	l.rows = append(l.rows, c)
	return c, true, nil
}

// Charges returns a copy of every row, oldest first.
func (l *Ledger) Charges() []Charge {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Charge(nil), l.rows...)
}

// Len is the number of rows.
func (l *Ledger) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.rows)
}

// AuditReport is what Audit found in a ledger.
type AuditReport struct {
	// Charges is the number of rows audited.
	Charges int
	// DuplicateKeys are idempotency keys with more than one row, and how
	// many. Always empty for a Ledger; an audit of another source (or of a
	// broken ledger) may find some.
	DuplicateKeys map[string]int
	// DuplicateOrders are orders charged more than once, and how many
	// times: the double charges of a client that made a fresh key per
	// attempt.
	DuplicateOrders map[string]int
}

// Clean reports whether no key and no order was charged twice.
func (r AuditReport) Clean() bool {
	return len(r.DuplicateKeys) == 0 && len(r.DuplicateOrders) == 0
}

// Extra is the number of rows beyond one per order: the money charged
// twice.
func (r AuditReport) Extra() int {
	n := 0
	for _, c := range r.DuplicateOrders {
		n += c - 1
	}
	return n
}

func (r AuditReport) String() string {
	orders := make([]string, 0, len(r.DuplicateOrders))
	for o := range r.DuplicateOrders {
		orders = append(orders, o)
	}
	sort.Strings(orders)
	if len(orders) > 5 {
		orders = append(orders[:5], "...")
	}
	return fmt.Sprintf("%d charges, %d keys charged twice, %d orders charged twice (%d extra charges) %v",
		r.Charges, len(r.DuplicateKeys), len(r.DuplicateOrders), r.Extra(), orders)
}

// Audit looks for double charges: two rows with one idempotency key of one
// principal (impossible in a Ledger by construction; rows read back over
// GET /ledger carry no principal, so there a key is global) or two rows for one order
// (what a client that makes a fresh key per attempt produces). It assumes
// one charge per order, as in the billing flow.
func Audit(charges []Charge) AuditReport {
	r := AuditReport{Charges: len(charges), DuplicateKeys: map[string]int{}, DuplicateOrders: map[string]int{}}
	keys := map[ledgerKey]int{}
	orders := map[string]int{}
	for _, c := range charges {
		keys[keyOf(c)]++
		orders[c.OrderID]++
	}
	for k, n := range keys {
		if n > 1 {
			r.DuplicateKeys[k.key] += n
		}
	}
	for o, n := range orders {
		if n > 1 {
			r.DuplicateOrders[o] = n
		}
	}
	return r
}
