package paysim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemclient"
)

// ErrInvalidCharge is a ChargeCommand that must not be sent: no key, no
// order or customer, or an amount that is not positive. Not retryable.
var ErrInvalidCharge = errors.New("paysim: invalid charge command")

// ErrDeclined is a charge the provider declined for good (402
// CARD_DECLINED): nothing was charged, and a retry with the same key gets
// the same answer. It wraps the *idemclient.StatusError and is not
// retryable: record the failure.
var ErrDeclined = errors.New("paysim: charge declined")

// ErrBadResponse is a 2xx answer that does not parse (a charge without a
// charge id, a ledger that is not the contract's JSON). After Charge, the
// charge may have happened: repeating the call with the same key returns
// the stored answer.
var ErrBadResponse = errors.New("paysim: malformed response")

// ChargeCommand is one charge. IdempotencyKey is derived from the business operation (for example
// idemclient.Key(orderID, "charge", requestID)), never generated per call.
type ChargeCommand struct {
	IdempotencyKey string
	OrderID        string
	CustomerID     string
	AmountKopecks  int64
}

// ChargeResult is a successful charge.
type ChargeResult struct {
	ChargeID string
	// Replayed is true when the provider answered from its idempotency
	// store: this key had already been charged (by an earlier attempt, or
	// an earlier call before a restart).
	Replayed bool
	// Attempts is how many attempts the call took.
	Attempts int
}

// Client is a typed client of POST /charges: the payment adapter of a
// service that charges through the provider. It is safe for concurrent use.
type Client struct {
	base string
	c    *idemclient.Client
}

// NewClient returns a client of the payment provider at baseURL (for
// example "http://127.0.0.1:8090"), sending through c (nil means
// idemclient defaults over http.DefaultClient).
func NewClient(baseURL string, c *idemclient.Client) (*Client, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("paysim: base URL %q is not an http(s) URL", baseURL)
	}
	if c == nil {
		if c, err = idemclient.New(nil, nil); err != nil {
			return nil, err
		}
	}
	return &Client{base: strings.TrimRight(baseURL, "/"), c: c}, nil
}

// Charge charges cmd.AmountKopecks once, however many attempts it takes:
// every attempt carries cmd.IdempotencyKey. ctx bounds the whole call,
// retries and waits included.
//
// On error, idemclient.IsRetryable tells a definitive failure (the charge
// did not and will not happen with this key: ErrDeclined, 409
// IDEMPOTENCY_KEY_REUSED, 400) from an unknown outcome that the caller
// must retry later with the same key.
func (c *Client) Charge(ctx context.Context, cmd ChargeCommand) (ChargeResult, error) {
	switch {
	case cmd.IdempotencyKey == "":
		return ChargeResult{}, fmt.Errorf("%w: IdempotencyKey is empty", ErrInvalidCharge)
	case cmd.OrderID == "":
		return ChargeResult{}, fmt.Errorf("%w: OrderID is empty", ErrInvalidCharge)
	case cmd.CustomerID == "":
		return ChargeResult{}, fmt.Errorf("%w: CustomerID is empty", ErrInvalidCharge)
	case cmd.AmountKopecks <= 0:
		return ChargeResult{}, fmt.Errorf("%w: AmountKopecks %d is not positive", ErrInvalidCharge, cmd.AmountKopecks)
	}
	if err := idem.ValidateKey(cmd.IdempotencyKey); err != nil {
		return ChargeResult{}, fmt.Errorf("%w: %w", ErrInvalidCharge, err)
	}
	body, err := json.Marshal(chargeRequest{OrderID: cmd.OrderID, CustomerID: cmd.CustomerID, AmountKopecks: cmd.AmountKopecks})
	if err != nil {
		return ChargeResult{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/charges", bytes.NewReader(body))
	if err != nil {
		return ChargeResult{}, fmt.Errorf("paysim: charge: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.c.Do(req, cmd.IdempotencyKey)
	if err != nil {
		var se *idemclient.StatusError
		if errors.As(err, &se) && se.StatusCode == http.StatusPaymentRequired && se.Code == CodeCardDeclined {
			return ChargeResult{}, fmt.Errorf("%w: %w", ErrDeclined, err)
		}
		if errors.As(err, &se) && se.StatusCode == http.StatusInsufficientStorage && se.Code == CodeLedgerFull {
			return ChargeResult{}, fmt.Errorf("%w: %w", ErrLedgerFull, err)
		}
		return ChargeResult{}, fmt.Errorf("paysim: charge: %w", err)
	}
	defer resp.Body.Close()
	var out chargeResponse
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&out); err != nil || out.ChargeID == "" {
		return ChargeResult{}, fmt.Errorf("%w: status %d", ErrBadResponse, resp.StatusCode)
	}
	return ChargeResult{ChargeID: out.ChargeID, Replayed: resp.Replayed, Attempts: resp.Attempts}, nil
}

// chargeRequest is the body of POST /charges (docs/contracts.md).
type chargeRequest struct {
	OrderID       string `json:"order_id"`
	CustomerID    string `json:"customer_id"`
	AmountKopecks int64  `json:"amount_kopecks"`
}

// chargeResponse is the body of a 201 from POST /charges.
type chargeResponse struct {
	ChargeID string `json:"charge_id"`
}

// Ledger returns every charge of the client's principal (GET /ledger,
// page by page), for audits: see Audit. ctx bounds the call, retries
// included.
func (c *Client) Ledger(ctx context.Context) ([]Charge, error) {
	e, err := c.Entries(ctx)
	return e.Charges, err
}

// Entries returns every charge and every decline of the client's principal
// (the Authorization header its http.Client sends, or none), reading GET
// /ledger page by page: every entry settled before the last page was read,
// each once (the ledger only grows, in order). ctx bounds the call,
// retries included.
func (c *Client) Entries(ctx context.Context) (Entries, error) {
	out := Entries{Charges: []Charge{}, Declines: []Decline{}}
	for after := ""; ; {
		page, err := c.page(ctx, after, LedgerPageMax)
		if err != nil {
			return Entries{}, err
		}
		out.Charges = append(out.Charges, page.Charges...)
		out.Declines = append(out.Declines, page.Declines...)
		if page.Next == "" {
			return out, nil
		}
		if page.Next == after {
			return Entries{}, fmt.Errorf("%w: ledger: next page %q does not advance", ErrBadResponse, page.Next)
		}
		after = page.Next
	}
}

func (c *Client) page(ctx context.Context, after string, limit int) (Entries, error) {
	q := url.Values{"limit": {strconv.Itoa(limit)}}
	if after != "" {
		q.Set("after", after)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/ledger?"+q.Encode(), nil)
	if err != nil {
		return Entries{}, fmt.Errorf("paysim: ledger: %w", err)
	}
	resp, err := c.c.Do(req, "")
	if err != nil {
		return Entries{}, fmt.Errorf("paysim: ledger: %w", err)
	}
	defer resp.Body.Close()
	var out Entries
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return Entries{}, fmt.Errorf("%w: ledger: %v", ErrBadResponse, err)
	}
	return out, nil
}
