// Package domain holds billing's entities and rules, free of any
// infrastructure.
package domain

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Order statuses.
const (
	OrderNew       = "NEW"
	OrderConfirmed = "CONFIRMED"
	OrderCharged   = "CHARGED"
	OrderFailed    = "FAILED"
)

// Payment statuses.
const (
	PaymentPending = "PENDING"
	PaymentCharged = "CHARGED"
	PaymentFailed  = "FAILED"
)

// Errors of the domain. The HTTP adapter maps each to a problem+json code.
var (
	// ErrValidation is a request whose fields break a rule; the text names
	// the field.
	ErrValidation = errors.New("billing: invalid request")
	// ErrOrderNotFound is an order that does not exist for this principal.
	ErrOrderNotFound = errors.New("billing: order not found")
	// ErrPaymentNotFound is a payment that does not exist for this principal.
	ErrPaymentNotFound = errors.New("billing: payment not found")
	// ErrOrderState is an operation the order's status does not allow
	// (confirming an order twice, paying an order that is not NEW).
	ErrOrderState = errors.New("billing: order status does not allow this")
	// ErrInvalidText is an identifier (in the path or the body) that is not
	// valid UTF-8 or holds a control character (NUL included): it is
	// refused before it reaches the database, which would fail on it.
	ErrInvalidText = errors.New("billing: invalid text")
	// ErrAmountTooLarge is an amount above MaxAmountKopecks.
	ErrAmountTooLarge = errors.New("billing: amount too large")
	// ErrCustomerMismatch is a payment whose customer is not its order's.
	ErrCustomerMismatch = errors.New("billing: customer does not match the order")
	// ErrExceedsOutstanding is a payment larger than what its order still
	// owes: the total less the payments not FAILED.
	ErrExceedsOutstanding = errors.New("billing: amount exceeds the order's outstanding amount")
	// ErrOrderHasPayments is a confirm of an order that already has
	// payments: confirming charges the whole total, so it would charge the
	// paid part twice.
	ErrOrderHasPayments = errors.New("billing: order has payments")
)

// MaxIDLen bounds client-supplied identifiers (customer ids, and the order
// and payment ids of paths and bodies, which billing makes 24 bytes long).
const MaxIDLen = 64

// MaxAmountKopecks bounds every amount (an order's total, a payment's
// amount): 100,000,000,000 kopecks, one billion roubles. Far above any
// real order, and far below int64's range, so that sums of amounts never
// overflow.
const MaxAmountKopecks int64 = 100_000_000_000

// Order is a customer's order.
type Order struct {
	ID           string `json:"id"`
	CustomerID   string `json:"customer_id"`
	TotalKopecks int64  `json:"total_kopecks"`
	Status       string `json:"status"`
	ChargeID     string `json:"charge_id,omitempty"`
	Failure      string `json:"failure,omitempty"`
	Owner        string `json:"-"`
}

// Payment is a charge requested directly by a client for an order.
type Payment struct {
	ID            string `json:"id"`
	OrderID       string `json:"order_id"`
	CustomerID    string `json:"customer_id"`
	AmountKopecks int64  `json:"amount_kopecks"`
	Status        string `json:"status"`
	ChargeID      string `json:"charge_id,omitempty"`
	Failure       string `json:"failure,omitempty"`
	Owner         string `json:"-"`
}

// NewID returns prefix_ followed by 20 random hex digits.
func NewID(prefix string) string {
	var b [10]byte
	_, _ = rand.Read(b[:])
	return prefix + "_" + hex.EncodeToString(b[:])
}

// ValidateText checks that a client-supplied identifier is text
// PostgreSQL stores: valid UTF-8 without control characters (NUL is
// refused by PostgreSQL's text type, SQLSTATE 22021). The error never
// repeats the value: it may be anything.
func ValidateText(field, s string) error {
	if !utf8.ValidString(s) {
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalidText, field)
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w: %s holds a control character (U+%04X)", ErrInvalidText, field, r)
		}
	}
	return nil
}

// ValidateID checks a client-supplied identifier: text (ValidateText), not
// blank, at most MaxIDLen bytes.
func ValidateID(field, id string) error {
	if err := ValidateText(field, id); err != nil {
		return err
	}
	if strings.TrimSpace(id) == "" {
		return fmt.Errorf("%w: %s is required", ErrValidation, field)
	}
	if len(id) > MaxIDLen {
		return fmt.Errorf("%w: %s is longer than %d bytes", ErrValidation, field, MaxIDLen)
	}
	return nil
}

// ValidateCustomerID checks a client-supplied customer id (ValidateID).
func ValidateCustomerID(field, id string) error { return ValidateID(field, id) }

// ValidateAmount checks an amount in kopecks: positive and at most
// MaxAmountKopecks.
func ValidateAmount(field string, v int64) error {
	if v <= 0 {
		return fmt.Errorf("%w: %s must be a positive number of kopecks, got %d", ErrValidation, field, v)
	}
	if v > MaxAmountKopecks {
		return fmt.Errorf("%w: %s is %d kopecks, above the limit of %d", ErrAmountTooLarge, field, v, MaxAmountKopecks)
	}
	return nil
}

// CheckPayment applies the rules a payment must meet against its order,
// read under the order's row lock with paid, the sum of the order's
// payments that are not FAILED: the order is NEW (a CONFIRMED order is
// charged its total by the confirm flow; a CHARGED or FAILED one is
// settled), the customer is the order's, and the amount fits in what the
// order still owes.
func CheckPayment(o Order, customerID string, amount, paid int64) error {
	if o.Status != OrderNew {
		return fmt.Errorf("%w: order %s is %s; only a NEW order takes payments", ErrOrderState, o.ID, o.Status)
	}
	if o.CustomerID != customerID {
		return fmt.Errorf("%w: customer_id is not the order's customer", ErrCustomerMismatch)
	}
	if outstanding := o.TotalKopecks - paid; amount > outstanding {
		return fmt.Errorf("%w: %d kopecks asked, %d outstanding of %d", ErrExceedsOutstanding, amount, outstanding, o.TotalKopecks)
	}
	return nil
}
