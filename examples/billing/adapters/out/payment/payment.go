// Package payment is billing's payment-provider adapter: paysim's typed
// client over idemclient, so every attempt of one charge carries the
// command's key.
package payment

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/idemkit/idem/examples/billing/usecase"
	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/paysim"
)

// Gateway implements usecase.PaymentGateway.
type Gateway struct {
	c  *paysim.Client
	ic *idemclient.Client
}

var _ usecase.PaymentGateway = (*Gateway)(nil)

// New returns a gateway to the provider at baseURL (PAYMENT_URL). Each
// attempt is bounded by attemptTimeout; the caller's ctx bounds the call.
func New(baseURL string, attemptTimeout time.Duration) (*Gateway, error) {
	hc := &http.Client{Timeout: attemptTimeout}
	ic, err := idemclient.New(hc, nil)
	if err != nil {
		return nil, err
	}
	return NewWithClient(baseURL, ic)
}

// NewWithClient returns a gateway to the provider at baseURL over ic: an
// idemclient.Client with a hook (tracing, metrics) or a transport of the
// caller's. Close closes ic's idle connections.
func NewWithClient(baseURL string, ic *idemclient.Client) (*Gateway, error) {
	c, err := paysim.NewClient(baseURL, ic)
	if err != nil {
		return nil, err
	}
	return &Gateway{c: c, ic: ic}, nil
}

// Charge implements usecase.PaymentGateway. Definitive failures (the
// provider refused the charge, or the command can never be sent) wrap
// usecase.ErrChargeDeclined; everything else is an unknown outcome that the
// worker retries with the same key.
func (g *Gateway) Charge(ctx context.Context, c usecase.ChargeRequested) (usecase.Charge, error) {
	res, err := g.c.Charge(ctx, paysim.ChargeCommand{
		IdempotencyKey: c.IdempotencyKey,
		OrderID:        c.OrderID,
		CustomerID:     c.CustomerID,
		AmountKopecks:  c.AmountKopecks,
	})
	if err == nil {
		return usecase.Charge{ID: res.ChargeID, Replayed: res.Replayed}, nil
	}
	if errors.Is(err, paysim.ErrInvalidCharge) || (!idemclient.IsRetryable(err) && !errors.Is(err, paysim.ErrBadResponse)) {
		return usecase.Charge{}, fmt.Errorf("%w: %v", usecase.ErrChargeDeclined, err)
	}
	return usecase.Charge{}, err
}

// Close drops idle connections to the provider.
func (g *Gateway) Close() { g.ic.CloseIdleConnections() }
