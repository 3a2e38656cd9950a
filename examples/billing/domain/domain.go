// Package domain holds billing's entities and rules, free of any
// infrastructure.
package domain

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
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
	// (confirming an order twice).
	ErrOrderState = errors.New("billing: order status does not allow this")
)

// MaxIDLen bounds client-supplied identifiers (customer ids).
const MaxIDLen = 64

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

// ValidateCustomerID checks a client-supplied customer id.
func ValidateCustomerID(field, id string) error {
	if strings.TrimSpace(id) == "" {
		return fmt.Errorf("%w: %s is required", ErrValidation, field)
	}
	if len(id) > MaxIDLen {
		return fmt.Errorf("%w: %s is longer than %d", ErrValidation, field, MaxIDLen)
	}
	return nil
}

// ValidateAmount checks an amount in kopecks: positive.
func ValidateAmount(field string, v int64) error {
	if v <= 0 {
		return fmt.Errorf("%w: %s must be a positive number of kopecks, got %d", ErrValidation, field, v)
	}
	return nil
}
