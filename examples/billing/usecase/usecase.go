// Package usecase holds billing's operations, written against ports: a
// Repository bound to one database transaction (the adapter decides which
// one) and a PaymentGateway. Nothing here knows HTTP, Kafka or SQL.
package usecase

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/idemkit/idem/examples/billing/domain"
)

// Topics of the reference flow (docs/contracts.md).
const (
	TopicOrderEvents     = "orders.events"
	TopicBillingCommands = "billing.commands"
)

// Event types.
const (
	EventOrderConfirmed  = "OrderConfirmed"
	EventChargeRequested = "ChargeRequested"
)

// Charge targets: what a ChargeRequested settles.
const (
	TargetOrder   = "order"
	TargetPayment = "payment"
)

// Event is one outbox event, written in the repository's transaction.
type Event struct {
	Topic         string
	AggregateType string
	AggregateID   string
	// EventID is the consumers' dedup key; empty means generated.
	EventID string
	Type    string
	Payload any
}

// Repository is billing's persistence port. Every method runs in the one
// transaction the Repository is bound to: the writes of a use case and the
// events it emits commit together or not at all.
type Repository interface {
	InsertOrder(ctx context.Context, o domain.Order) error
	// GetOrder returns domain.ErrOrderNotFound for a missing order or one
	// of another owner.
	GetOrder(ctx context.Context, id, owner string) (domain.Order, error)
	// LockOrder is GetOrder holding the order's row lock until the
	// transaction ends: the writes that depend on an order's state (its
	// payments, its confirm) run one at a time per order.
	LockOrder(ctx context.Context, id, owner string) (domain.Order, error)
	// PaidKopecks sums the order's payments that are not FAILED.
	PaidKopecks(ctx context.Context, orderID string) (int64, error)
	// ConfirmOrder moves a NEW order to CONFIRMED: domain.ErrOrderNotFound
	// or domain.ErrOrderState otherwise.
	ConfirmOrder(ctx context.Context, id, owner string) (domain.Order, error)
	InsertPayment(ctx context.Context, p domain.Payment) error
	GetPayment(ctx context.Context, id, owner string) (domain.Payment, error)
	// SettleOrder and SettlePayment record a charge outcome; false when the
	// target had already been settled (or does not exist).
	SettleOrder(ctx context.Context, id string, o ChargeOutcome) (bool, error)
	SettlePayment(ctx context.Context, id string, o ChargeOutcome) (bool, error)
	// Emit writes an event to the outbox and returns its event id.
	Emit(ctx context.Context, e Event) (string, error)
}

// ChargeOutcome is the provider's final answer for one charge.
type ChargeOutcome struct {
	Charged  bool
	ChargeID string
	Failure  string
}

// Status is the status the outcome gives its target.
func (o ChargeOutcome) Status() string {
	if o.Charged {
		return domain.OrderCharged // equal to domain.PaymentCharged
	}
	return domain.OrderFailed
}

// OrderConfirmed is the payload of the OrderConfirmed event.
type OrderConfirmed struct {
	OrderID      string `json:"order_id"`
	CustomerID   string `json:"customer_id"`
	TotalKopecks int64  `json:"total_kopecks"`
}

// ChargeRequested is the payload of the ChargeRequested command: everything
// the charge worker needs, the idempotency key included, fixed once when the
// command was written.
type ChargeRequested struct {
	Target         string `json:"target"`
	TargetID       string `json:"target_id"`
	OrderID        string `json:"order_id"`
	CustomerID     string `json:"customer_id"`
	AmountKopecks  int64  `json:"amount_kopecks"`
	IdempotencyKey string `json:"idempotency_key"`
}

// ErrBadEvent is an event payload that cannot be processed (malformed,
// missing fields). Consumers treat it as permanent.
var ErrBadEvent = errors.New("billing: malformed event")

// CreateOrder is POST /orders.
type CreateOrder struct {
	CustomerID   string `json:"customer_id"`
	TotalKopecks int64  `json:"total_kopecks"`
	// ID is the new order's id, fixed by the caller (derived from the
	// request's idempotency key, so that a re-run of the request names the
	// same order); never read from the body. Defaults to a new random id.
	ID string `json:"-"`
}

// CreateOrderExec validates cmd and inserts a NEW order.
func CreateOrderExec(ctx context.Context, repo Repository, owner string, cmd CreateOrder) (domain.Order, error) {
	if err := domain.ValidateCustomerID("customer_id", cmd.CustomerID); err != nil {
		return domain.Order{}, err
	}
	if err := domain.ValidateAmount("total_kopecks", cmd.TotalKopecks); err != nil {
		return domain.Order{}, err
	}
	if cmd.ID == "" {
		cmd.ID = domain.NewID("ord")
	}
	o := domain.Order{ID: cmd.ID, Owner: owner, CustomerID: cmd.CustomerID, TotalKopecks: cmd.TotalKopecks, Status: domain.OrderNew}
	if err := repo.InsertOrder(ctx, o); err != nil {
		return domain.Order{}, err
	}
	return o, nil
}

// pathID checks an id taken from a path: text, else domain.ErrInvalidText;
// one longer than any id billing makes cannot exist, so notFound.
func pathID(id string, notFound error) error {
	if err := domain.ValidateText("id", id); err != nil {
		return err
	}
	if id == "" || len(id) > domain.MaxIDLen {
		return notFound
	}
	return nil
}

// ConfirmOrderExec confirms a NEW order that has no payments and, in the
// same transaction, emits OrderConfirmed (key = order id) on orders.events.
// Nothing is charged here: the charge follows from the event, through the
// consumer and the charge worker, so an HTTP request never waits on the
// provider. The confirm charges the whole total, hence the refusal
// (domain.ErrOrderHasPayments) once a payment has been made: the order's
// row lock orders it with the payments, so no payment slips in between the
// check and the confirm.
func ConfirmOrderExec(ctx context.Context, repo Repository, owner, orderID string) (domain.Order, error) {
	if err := pathID(orderID, domain.ErrOrderNotFound); err != nil {
		return domain.Order{}, err
	}
	cur, err := repo.LockOrder(ctx, orderID, owner)
	if err != nil {
		return domain.Order{}, err
	}
	if cur.Status != domain.OrderNew {
		return domain.Order{}, fmt.Errorf("%w: order %s is %s, not NEW", domain.ErrOrderState, cur.ID, cur.Status)
	}
	paid, err := repo.PaidKopecks(ctx, cur.ID)
	if err != nil {
		return domain.Order{}, err
	}
	if paid > 0 {
		return domain.Order{}, fmt.Errorf("%w: order %s has %d kopecks of payments; confirming would charge its whole total", domain.ErrOrderHasPayments, cur.ID, paid)
	}
	o, err := repo.ConfirmOrder(ctx, orderID, owner)
	if err != nil {
		return domain.Order{}, err
	}
	_, err = repo.Emit(ctx, Event{
		Topic: TopicOrderEvents, AggregateType: "order", AggregateID: o.ID, Type: EventOrderConfirmed,
		Payload: OrderConfirmed{OrderID: o.ID, CustomerID: o.CustomerID, TotalKopecks: o.TotalKopecks},
	})
	if err != nil {
		return domain.Order{}, err
	}
	return o, nil
}

// CreatePayment is POST /payments.
type CreatePayment struct {
	OrderID       string `json:"order_id"`
	CustomerID    string `json:"customer_id"`
	AmountKopecks int64  `json:"amount_kopecks"`
	// ID is the new payment's id, as CreateOrder.ID. Defaults to a new
	// random id.
	ID string `json:"-"`
}

// CreatePaymentExec records a PENDING payment for an order of owner's and,
// in the same transaction, the ChargeRequested command with the payment's
// key (payment id + ":charge"): the id is fixed here, once, so every attempt
// and every redelivery carries the same key.
//
// The payment must meet domain.CheckPayment against its order, read under
// the order's row lock. Two payments racing on one order (different keys,
// so the idempotency layer does not order them) therefore run one after
// the other:
//
//  1. the first locks the order, sums its payments (none), inserts its own
//     and commits, which releases the lock;
//  2. the second, blocked on the lock, is granted it only then; its next
//     statement takes a fresh snapshot (READ COMMITTED) and its sum counts
//     the first payment, so it is refused if the rest does not cover it.
func CreatePaymentExec(ctx context.Context, repo Repository, owner string, cmd CreatePayment) (domain.Payment, error) {
	if err := domain.ValidateID("order_id", cmd.OrderID); err != nil {
		return domain.Payment{}, err
	}
	if err := domain.ValidateCustomerID("customer_id", cmd.CustomerID); err != nil {
		return domain.Payment{}, err
	}
	if err := domain.ValidateAmount("amount_kopecks", cmd.AmountKopecks); err != nil {
		return domain.Payment{}, err
	}
	o, err := repo.LockOrder(ctx, cmd.OrderID, owner)
	if err != nil {
		return domain.Payment{}, err
	}
	paid, err := repo.PaidKopecks(ctx, o.ID)
	if err != nil {
		return domain.Payment{}, err
	}
	if err := domain.CheckPayment(o, cmd.CustomerID, cmd.AmountKopecks, paid); err != nil {
		return domain.Payment{}, err
	}
	if cmd.ID == "" {
		cmd.ID = domain.NewID("pay")
	}
	p := domain.Payment{ID: cmd.ID, Owner: owner, OrderID: o.ID, CustomerID: cmd.CustomerID, AmountKopecks: cmd.AmountKopecks, Status: domain.PaymentPending}
	if err := repo.InsertPayment(ctx, p); err != nil {
		return domain.Payment{}, err
	}
	key := p.ID + ":charge"
	_, err = repo.Emit(ctx, Event{
		Topic: TopicBillingCommands, AggregateType: "payment", AggregateID: p.ID, EventID: key, Type: EventChargeRequested,
		Payload: ChargeRequested{Target: TargetPayment, TargetID: p.ID, OrderID: o.ID, CustomerID: p.CustomerID, AmountKopecks: p.AmountKopecks, IdempotencyKey: key},
	})
	if err != nil {
		return domain.Payment{}, err
	}
	return p, nil
}

// HandleOrderConfirmed is the orders.events consumer's step, run in the
// transaction that also records eventID in processed_event: it orders the
// charge by emitting ChargeRequested with the key eventID + ":billing" (a
// key derived from the event, so every redelivery orders the same charge),
// which the outbox carries to the charge worker. The
// provider is not called here: the call may take seconds, and this
// transaction would hold its row the whole time.
func HandleOrderConfirmed(ctx context.Context, repo Repository, eventID string, payload []byte) error {
	var ev OrderConfirmed
	if err := json.Unmarshal(payload, &ev); err != nil {
		return fmt.Errorf("%w: OrderConfirmed: %v", ErrBadEvent, err)
	}
	if ev.OrderID == "" || ev.CustomerID == "" || ev.TotalKopecks <= 0 || eventID == "" {
		return fmt.Errorf("%w: OrderConfirmed %q lacks a field", ErrBadEvent, eventID)
	}
	key := eventID + ":billing"
	_, err := repo.Emit(ctx, Event{
		Topic: TopicBillingCommands, AggregateType: "order", AggregateID: ev.OrderID, EventID: key, Type: EventChargeRequested,
		Payload: ChargeRequested{Target: TargetOrder, TargetID: ev.OrderID, OrderID: ev.OrderID, CustomerID: ev.CustomerID, AmountKopecks: ev.TotalKopecks, IdempotencyKey: key},
	})
	return err
}

// ParseChargeRequested decodes and checks a ChargeRequested payload.
func ParseChargeRequested(payload []byte) (ChargeRequested, error) {
	var c ChargeRequested
	if err := json.Unmarshal(payload, &c); err != nil {
		return c, fmt.Errorf("%w: ChargeRequested: %v", ErrBadEvent, err)
	}
	if (c.Target != TargetOrder && c.Target != TargetPayment) || c.TargetID == "" || c.IdempotencyKey == "" || c.AmountKopecks <= 0 || c.CustomerID == "" || c.OrderID == "" {
		return c, fmt.Errorf("%w: ChargeRequested for %q lacks a field", ErrBadEvent, c.TargetID)
	}
	return c, nil
}

// PaymentGateway is the payment provider port.
type PaymentGateway interface {
	// Charge charges once per key, however often it is called. An error
	// wrapping ErrChargeDeclined is a definitive refusal; any other error
	// is an unknown outcome, to be retried later with the same key.
	Charge(ctx context.Context, c ChargeRequested) (Charge, error)
}

// Charge is the provider's answer to a successful charge.
type Charge struct {
	ID string
	// Replayed: the provider answered from its idempotency store, because
	// this key had been charged before (an earlier attempt or delivery).
	Replayed bool
}

// ErrChargeDeclined is a definitive refusal by the provider.
var ErrChargeDeclined = errors.New("billing: charge declined")

// RecordCharge settles the command's target with the provider's outcome,
// in the transaction that also records the command in processed_event.
// A target already settled is left alone: the first outcome stands.
func RecordCharge(ctx context.Context, repo Repository, c ChargeRequested, o ChargeOutcome) error {
	var err error
	switch c.Target {
	case TargetOrder:
		_, err = repo.SettleOrder(ctx, c.TargetID, o)
	case TargetPayment:
		_, err = repo.SettlePayment(ctx, c.TargetID, o)
	default:
		err = fmt.Errorf("%w: target %q", ErrBadEvent, c.Target)
	}
	return err
}

// GetOrderExec is GET /orders/{id}.
func GetOrderExec(ctx context.Context, repo Repository, owner, id string) (domain.Order, error) {
	if err := pathID(id, domain.ErrOrderNotFound); err != nil {
		return domain.Order{}, err
	}
	return repo.GetOrder(ctx, id, owner)
}

// GetPaymentExec is GET /payments/{id}.
func GetPaymentExec(ctx context.Context, repo Repository, owner, id string) (domain.Payment, error) {
	if err := pathID(id, domain.ErrPaymentNotFound); err != nil {
		return domain.Payment{}, err
	}
	return repo.GetPayment(ctx, id, owner)
}
