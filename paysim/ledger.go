package paysim

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"
)

// Ledger errors. The existing entry always stands; nothing is charged.
var (
	// ErrLedgerConflict is an insert (or a decline) whose idempotency key
	// is already in the ledger for a different order, customer or amount.
	ErrLedgerConflict = errors.New("paysim: idempotency key already charged for a different request")
	// ErrKeyDeclined is an Insert for a key that was declined: a decline is
	// the key's final answer and never becomes a charge.
	ErrKeyDeclined = errors.New("paysim: idempotency key already declined")
	// ErrKeyCharged is a Decline for a key that was charged.
	ErrKeyCharged = errors.New("paysim: idempotency key already charged")
)

// Charge is one ledger row. The JSON names are the GET /ledger contract.
type Charge struct {
	ChargeID       string `json:"charge_id"`
	IdempotencyKey string `json:"idempotency_key"`
	OrderID        string `json:"order_id"`
	CustomerID     string `json:"customer_id"`
	// Principal is the merchant that asked for the charge: the scope of
	// its idempotency key (the Authorization header value, or
	// ScopeDefault without one).
	Principal     string    `json:"principal"`
	AmountKopecks int64     `json:"amount_kopecks"`
	CreatedAt     time.Time `json:"created_at"`
}

// Decline is a charge the provider refused for good (402 CARD_DECLINED):
// nothing was charged, and every later request with its key gets the same
// refusal. The JSON names are the GET /ledger contract.
type Decline struct {
	DeclineID      string    `json:"decline_id"`
	IdempotencyKey string    `json:"idempotency_key"`
	OrderID        string    `json:"order_id"`
	CustomerID     string    `json:"customer_id"`
	Principal      string    `json:"principal"`
	AmountKopecks  int64     `json:"amount_kopecks"`
	Code           string    `json:"code"`
	CreatedAt      time.Time `json:"created_at"`
}

// Entries is one consistent snapshot of the whole ledger, as GET /ledger
// returns it: {"charges":[…],"declines":[…]}, oldest first, never null.
type Entries struct {
	Charges  []Charge  `json:"charges"`
	Declines []Decline `json:"declines"`
}

// Ledger is the provider's book of charges and declines, in memory. One
// idempotency key of one principal has at most one entry, a charge or a
// decline, by construction (keys are scoped by principal, as in the
// idempotency middleware, so two merchants' keys never collide): the
// unique index (byKey) and the entries change together under one mutex,
// and Insert and Decline return the existing entry instead of adding a
// second. This holds whatever the HTTP layer in front of it does, so a test
// that finds two entries for one key has found a bug in the ledger itself,
// not a race.
type Ledger struct {
	mu       sync.Mutex
	rows     []Charge
	declines []Decline
	byKey    map[ledgerKey]entryRef
	now      func() time.Time
}

// entryRef points at a key's entry: an index in rows, or in declines.
type entryRef struct {
	declined bool
	i        int
}

// NewLedger returns an empty ledger.
func NewLedger() *Ledger {
	return &Ledger{byKey: map[ledgerKey]entryRef{}, now: time.Now}
}

type ledgerKey struct{ principal, key string }

func keyOf(c Charge) ledgerKey {
	return ledgerKey{c.Principal, c.IdempotencyKey}
}

// Insert charges c unless c.IdempotencyKey already has an entry for
// c.Principal. It returns the row (new or existing) and whether it was
// inserted. An existing row for a different order, customer or amount is
// ErrLedgerConflict, with the existing row; a declined key is
// ErrKeyDeclined. ChargeID and CreatedAt are assigned here.
func (l *Ledger) Insert(c Charge) (Charge, bool, error) {
	ch, _, inserted, err := l.settle(c, "")
	if err == nil && ch == nil {
		return Charge{}, false, ErrKeyDeclined
	}
	if ch == nil {
		return Charge{}, false, err
	}
	return *ch, inserted, err
}

// Decline records d as the key's definitive refusal unless the key already
// has an entry: the existing decline is returned (not inserted), a charged
// key is ErrKeyCharged, a decline of the key for a different order,
// customer or amount is ErrLedgerConflict. DeclineID and CreatedAt are
// assigned here; an empty Code is CodeCardDeclined.
func (l *Ledger) Decline(d Decline) (Decline, bool, error) {
	code := d.Code
	if code == "" {
		code = CodeCardDeclined
	}
	ch, dec, inserted, err := l.settle(Charge{IdempotencyKey: d.IdempotencyKey, Principal: d.Principal, OrderID: d.OrderID,
		CustomerID: d.CustomerID, AmountKopecks: d.AmountKopecks}, code)
	if err == nil && ch != nil {
		return Decline{}, false, ErrKeyCharged
	}
	if dec == nil {
		return Decline{}, false, err
	}
	return *dec, inserted, err
}

// settle is the one write path: it returns the key's entry (a charge or a
// decline), recording c first, as a decline with declineCode when that is
// set, if the key has none. An existing entry for a different order,
// customer or amount is ErrLedgerConflict, returned with that entry.
func (l *Ledger) settle(c Charge, declineCode string) (ch *Charge, dec *Decline, inserted bool, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ref, ok := l.byKey[keyOf(c)]; ok {
		var order, customer string
		var amount int64
		if ref.declined {
			d := l.declines[ref.i]
			dec, order, customer, amount = &d, d.OrderID, d.CustomerID, d.AmountKopecks
		} else {
			old := l.rows[ref.i]
			ch, order, customer, amount = &old, old.OrderID, old.CustomerID, old.AmountKopecks
		}
		if order != c.OrderID || customer != c.CustomerID || amount != c.AmountKopecks {
			err = ErrLedgerConflict
		}
		return ch, dec, false, err
	}
	now := l.now().UTC()
	if declineCode != "" {
		d := Decline{
			DeclineID: fmt.Sprintf("dc_%08d", len(l.declines)+1), IdempotencyKey: c.IdempotencyKey, OrderID: c.OrderID,
			CustomerID: c.CustomerID, Principal: c.Principal, AmountKopecks: c.AmountKopecks, Code: declineCode, CreatedAt: now,
		}
		l.byKey[keyOf(c)] = entryRef{declined: true, i: len(l.declines)}
		l.declines = append(l.declines, d)
		return nil, &d, true, nil
	}
	c.ChargeID = fmt.Sprintf("ch_%08d", len(l.rows)+1)
	c.CreatedAt = now
	l.byKey[keyOf(c)] = entryRef{i: len(l.rows)}
	l.rows = append(l.rows, c)
	return &c, nil, true, nil
}

// Charges returns a copy of every charge, oldest first.
func (l *Ledger) Charges() []Charge {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Charge(nil), l.rows...)
}

// Declines returns a copy of every decline, oldest first.
func (l *Ledger) Declines() []Decline {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Decline(nil), l.declines...)
}

// Entries returns a copy of every charge and every decline, taken at one
// instant; the slices are empty, never nil.
func (l *Ledger) Entries() Entries {
	l.mu.Lock()
	defer l.mu.Unlock()
	return Entries{Charges: append([]Charge{}, l.rows...), Declines: append([]Decline{}, l.declines...)}
}

// Len is the number of charges.
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
// principal (impossible in a Ledger by construction) or two rows for one order
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
