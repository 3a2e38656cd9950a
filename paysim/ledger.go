package paysim

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
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
	// ErrLedgerFull is a new key on a ledger at its bounds
	// (Config.MaxLedgerEntries, Config.MaxLedgerBytes): nothing was
	// recorded, and nothing charged. Keys already in the ledger keep
	// their entries and answers. Client.Charge returns it, wrapping the
	// *idemclient.StatusError, for a 507 LEDGER_FULL; it is not
	// retryable, since a simulator's ledger only shrinks with a restart.
	ErrLedgerFull = errors.New("paysim: ledger full")
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

// Entries is one consistent snapshot of a ledger view, as GET /ledger
// returns it: {"charges":[…],"declines":[…]}, oldest first, never null.
// Next, on a page of GET /ledger?limit=, is the after value of the
// following page; empty on the last.
type Entries struct {
	Charges  []Charge  `json:"charges"`
	Declines []Decline `json:"declines"`
	Next     string    `json:"next,omitempty"`
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
//
// A ledger is bounded: it remembers at most maxKeys keys and maxBytes of
// what they cost (see keyCost and entryCost); past that, a new key is
// ErrLedgerFull and nothing is recorded, while a key it already holds keeps
// its entry and its answer. Entries are never changed or removed, so a view
// read in pieces (GET /ledger's pages, a streamed answer) is the snapshot
// of the instant it began.
type Ledger struct {
	mu       sync.Mutex
	rows     []Charge
	declines []Decline
	log      []entryRef // every entry, in the order settled: the whole view
	byKey    map[ledgerKey]keyRef
	// principals interns every principal once (its entries hold that one
	// string) and keeps the principal's own view, in log order.
	principals map[string]*principalView
	maxKeys    int
	maxBytes   int64
	bytes      int64
	now        func() time.Time
}

// entryRef points at an entry: an index in rows, or in declines.
type entryRef struct {
	declined bool
	i        int32
}

// keyRef is what the ledger knows of a key: reserved by admit (the key
// reached the charge step and its cost is counted) or settled, with its
// entry.
type keyRef struct {
	settled bool
	entry   entryRef
	// fields is the length of order_id + customer_id the reservation
	// counted.
	fields int
}

type principalView struct {
	name string
	log  []entryRef
}

// Costs, in bytes, that the ledger counts against its budget. They stand
// for everything paysim keeps per key and per entry, measured with
// TestLedgerBudgetCoversTheHeap: the ledger's row and index, the
// principal's view, the fault counters and the idempotency middleware's
// record of the key (its hash, fingerprint and stored answer).
const (
	keyOverhead       = 832
	entryOverhead     = 320
	principalOverhead = 256
)

// keyCost is what a key costs once it reaches the charge step, settled or
// not.
func keyCost(key string) int64 { return int64(len(key)) + keyOverhead }

// entryCost is what an entry costs beyond its key: fields is the length of
// its order and customer ids.
func entryCost(fields int) int64 { return int64(fields) + entryOverhead }

func principalCost(p string) int64 { return int64(len(p)) + principalOverhead }

// NewLedger returns an empty ledger without bounds (paysim's Server gives
// its own the bounds of its Config).
func NewLedger() *Ledger { return newLedger(math.MaxInt32, math.MaxInt64) }

func newLedger(maxKeys int, maxBytes int64) *Ledger {
	return &Ledger{
		byKey: map[ledgerKey]keyRef{}, principals: map[string]*principalView{},
		maxKeys: maxKeys, maxBytes: maxBytes, now: time.Now,
	}
}

type ledgerKey struct{ principal, key string }

func keyOf(c Charge) ledgerKey {
	return ledgerKey{c.Principal, c.IdempotencyKey}
}

// Insert charges c unless c.IdempotencyKey already has an entry for
// c.Principal. It returns the row (new or existing) and whether it was
// inserted. An existing row for a different order, customer or amount is
// ErrLedgerConflict, with the existing row; a declined key is
// ErrKeyDeclined; a new key on a full ledger is ErrLedgerFull. ChargeID
// and CreatedAt are assigned here.
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
// customer or amount is ErrLedgerConflict, a new key on a full ledger is
// ErrLedgerFull. DeclineID and CreatedAt are assigned here; an empty Code
// is CodeCardDeclined.
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

// known reports whether the ledger holds principal's key, settled or
// reserved.
func (l *Ledger) known(principal, key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.byKey[ledgerKey{principal, key}]
	return ok
}

// full reports whether no new key fits any more, whatever its size.
func (l *Ledger) full() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.byKey) >= l.maxKeys || l.bytes+keyCost("k")+entryCost(2) > l.maxBytes
}

// admit reserves room for principal's key and an entry with fields bytes
// of ids, before the key is claimed: from then on the key is known, and
// whatever happens to the request (a fault, an abandoned charge) the
// memory it leaves behind is counted. A known key is admitted at no cost;
// a new one that does not fit is ErrLedgerFull.
func (l *Ledger) admit(principal, key string, fields int) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.byKey[ledgerKey{principal, key}]; ok {
		return nil
	}
	pv, err := l.reserveLocked(principal, key, fields)
	if err != nil {
		return err
	}
	l.byKey[ledgerKey{pv.name, strings.Clone(key)}] = keyRef{fields: fields}
	return nil
}

// reserveLocked counts a new key, with an entry of fields bytes, against
// the bounds, and returns its principal's view (created if need be).
func (l *Ledger) reserveLocked(principal, key string, fields int) (*principalView, error) {
	cost := keyCost(key) + entryCost(fields)
	pv := l.principals[principal]
	if pv == nil {
		cost += principalCost(principal)
	}
	if len(l.byKey) >= l.maxKeys || l.bytes+cost > l.maxBytes {
		return nil, ErrLedgerFull
	}
	if pv == nil {
		pv = &principalView{name: strings.Clone(principal)}
		l.principals[pv.name] = pv
	}
	l.bytes += cost
	return pv, nil
}

// settle is the one write path: it returns the key's entry (a charge or a
// decline), recording c first, as a decline with declineCode when that is
// set, if the key has none. An existing entry for a different order,
// customer or amount is ErrLedgerConflict, returned with that entry; a key
// that does not fit is ErrLedgerFull, with nothing recorded.
func (l *Ledger) settle(c Charge, declineCode string) (ch *Charge, dec *Decline, inserted bool, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ref, ok := l.byKey[keyOf(c)]
	if ok && ref.settled {
		var order, customer string
		var amount int64
		if ref.entry.declined {
			d := l.declines[ref.entry.i]
			dec, order, customer, amount = &d, d.OrderID, d.CustomerID, d.AmountKopecks
		} else {
			old := l.rows[ref.entry.i]
			ch, order, customer, amount = &old, old.OrderID, old.CustomerID, old.AmountKopecks
		}
		if order != c.OrderID || customer != c.CustomerID || amount != c.AmountKopecks {
			err = ErrLedgerConflict
		}
		return ch, dec, false, err
	}
	fields := len(c.OrderID) + len(c.CustomerID)
	var pv *principalView
	if ok {
		// Reserved by admit, perhaps for other ids (an earlier attempt
		// that failed before charging): count the difference.
		if extra := entryCost(fields) - entryCost(ref.fields); extra > 0 {
			if l.bytes+extra > l.maxBytes {
				return nil, nil, false, ErrLedgerFull
			}
			l.bytes += extra
		}
		pv = l.principals[c.Principal]
	} else if pv, err = l.reserveLocked(c.Principal, c.IdempotencyKey, fields); err != nil {
		return nil, nil, false, err
	}
	c.Principal = pv.name
	c.IdempotencyKey = strings.Clone(c.IdempotencyKey)
	now := l.now().UTC()
	var e entryRef
	if declineCode != "" {
		d := Decline{
			DeclineID: fmt.Sprintf("dc_%08d", len(l.declines)+1), IdempotencyKey: c.IdempotencyKey, OrderID: c.OrderID,
			CustomerID: c.CustomerID, Principal: c.Principal, AmountKopecks: c.AmountKopecks, Code: declineCode, CreatedAt: now,
		}
		e = entryRef{declined: true, i: int32(len(l.declines))}
		l.declines = append(l.declines, d)
		dec = &d
	} else {
		c.ChargeID = fmt.Sprintf("ch_%08d", len(l.rows)+1)
		c.CreatedAt = now
		e = entryRef{i: int32(len(l.rows))}
		l.rows = append(l.rows, c)
		ch = &c
	}
	l.byKey[keyOf(c)] = keyRef{settled: true, entry: e, fields: fields}
	l.log = append(l.log, e)
	pv.log = append(pv.log, e)
	return ch, dec, true, nil
}

// viewLen is the number of entries in a view: principal's own, or the
// whole ledger when all is set.
func (l *Ledger) viewLen(principal string, all bool) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.viewLocked(principal, all))
}

func (l *Ledger) viewLocked(principal string, all bool) []entryRef {
	if all {
		return l.log
	}
	if pv := l.principals[principal]; pv != nil {
		return pv.log
	}
	return nil
}

// chunk copies the charges (or, with declines, the declines) at positions
// [from, to) of a view, in order. Positions below the view's length never
// change, so successive chunks read one snapshot.
func (l *Ledger) chunk(principal string, all bool, from, to int, declines bool) ([]Charge, []Decline) {
	l.mu.Lock()
	defer l.mu.Unlock()
	v := l.viewLocked(principal, all)
	to = min(to, len(v))
	var cs []Charge
	var ds []Decline
	for _, e := range v[min(from, to):to] {
		switch {
		case e.declined && declines:
			ds = append(ds, l.declines[e.i])
		case !e.declined && !declines:
			cs = append(cs, l.rows[e.i])
		}
	}
	return cs, ds
}

// Usage is what a ledger holds against its bounds.
type Usage struct {
	Keys     int   // keys remembered: every entry's, and those reserved by a charge that did not settle
	MaxKeys  int   // the bound of Keys
	Bytes    int64 // the estimated bytes they hold
	MaxBytes int64 // the bound of Bytes
}

// Usage returns what the ledger holds against its bounds.
func (l *Ledger) Usage() Usage {
	l.mu.Lock()
	defer l.mu.Unlock()
	return Usage{Keys: len(l.byKey), MaxKeys: l.maxKeys, Bytes: l.bytes, MaxBytes: l.maxBytes}
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
