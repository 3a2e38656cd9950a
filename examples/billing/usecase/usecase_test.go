package usecase_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemkit/idem/examples/billing/usecase"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseChargeRequested(t *testing.T) {
	t.Parallel()
	valid := usecase.ChargeRequested{Target: "order", TargetID: "ord_1", OrderID: "ord_1", CustomerID: "c1", AmountKopecks: 5, IdempotencyKey: "e:billing"}
	testCases := []struct {
		name   string
		mutate func(*usecase.ChargeRequested)
		ok     bool
	}{
		{"valid", func(*usecase.ChargeRequested) {}, true},
		{"payment target", func(c *usecase.ChargeRequested) { c.Target = "payment" }, true},
		{"unknown target", func(c *usecase.ChargeRequested) { c.Target = "refund" }, false},
		{"no key", func(c *usecase.ChargeRequested) { c.IdempotencyKey = "" }, false},
		{"zero amount", func(c *usecase.ChargeRequested) { c.AmountKopecks = 0 }, false},
		{"negative amount", func(c *usecase.ChargeRequested) { c.AmountKopecks = -1 }, false},
		{"no customer", func(c *usecase.ChargeRequested) { c.CustomerID = "" }, false},
		{"no target id", func(c *usecase.ChargeRequested) { c.TargetID = "" }, false},
	}
	for _, tt := range testCases {
		c := valid
		tt.mutate(&c)
		b, _ := json.Marshal(c)
		got, err := usecase.ParseChargeRequested(b)
		if tt.ok != (err == nil) {
			t.Errorf("%s: err %v", tt.name, err)
		}
		if err != nil && !errors.Is(err, usecase.ErrBadEvent) {
			t.Errorf("%s: %v is not ErrBadEvent", tt.name, err)
		}
		if tt.ok && got != c {
			t.Errorf("%s: %+v", tt.name, got)
		}
	}
	if _, err := usecase.ParseChargeRequested([]byte(`{"target":`)); !errors.Is(err, usecase.ErrBadEvent) {
		t.Errorf("malformed: %v", err)
	}
}

// TestBadOrderConfirmedTouchesNothing proves that a malformed event is
// rejected before the repository is used (nil here: any use would panic).
func TestBadOrderConfirmedTouchesNothing(t *testing.T) {
	t.Parallel()
	for _, payload := range []string{`{`, `{"order_id":"o"}`, `{"order_id":"o","customer_id":"c","total_kopecks":0}`} {
		if err := usecase.HandleOrderConfirmed(context.Background(), nil, "e1", []byte(payload)); !errors.Is(err, usecase.ErrBadEvent) {
			t.Errorf("%s: %v", payload, err)
		}
	}
	if err := usecase.HandleOrderConfirmed(context.Background(), nil, "", []byte(`{"order_id":"o","customer_id":"c","total_kopecks":1}`)); !errors.Is(err, usecase.ErrBadEvent) {
		t.Errorf("empty event id: %v", err)
	}
}

func FuzzParseChargeRequested(f *testing.F) {
	f.Add([]byte(`{"target":"order","target_id":"o","order_id":"o","customer_id":"c","amount_kopecks":1,"idempotency_key":"k"}`))
	f.Add([]byte(`{"amount_kopecks":-1}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := usecase.ParseChargeRequested(b)
		if err != nil {
			if !errors.Is(err, usecase.ErrBadEvent) {
				t.Fatalf("error %v is not ErrBadEvent", err)
			}
			return
		}
		if c.AmountKopecks <= 0 || c.IdempotencyKey == "" || c.TargetID == "" || (c.Target != "order" && c.Target != "payment") {
			t.Fatalf("accepted an invalid command %+v", c)
		}
	})
}
