package idemtest_test

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/idemtest"
)

// The real middleware, misconfigured the way the proof's mutants break it
// in code: each defect must fail exactly its check, and the middleware as
// configured by default must pass all three.
func TestMiddlewareDefectsFailTheirCheck(t *testing.T) {
	t.Parallel()
	testCases := []struct {
		name   string
		mutate func(c *idempotency.Config)
		want   []string
	}{
		{"correct", func(*idempotency.Config) {}, nil},
		// The fingerprint covers the amount only: a key reused with
		// another order (or another card, nested) replays.
		{"amount-only fingerprint", func(c *idempotency.Config) { c.FingerprintFields = []string{"amount_kopecks"} }, []string{idemtest.CheckMismatch}},
		// No header is stored: the replay has no Content-Type or Location.
		{"replay without headers", func(c *idempotency.Config) { c.ReplayHeaders = []string{} }, []string{idemtest.CheckReplay}},
		// Every route is one: a key used on /charges replays on /refunds.
		{"keys not scoped by route", func(c *idempotency.Config) { c.Route = func(*http.Request) string { return "/" } }, []string{idemtest.CheckRoutes}},
	}
	for _, tt := range testCases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := &idempotency.Config{
				Scope: func(r *http.Request) (string, error) {
					if a := r.Header.Get("Authorization"); a != "" {
						return a, nil
					}
					return "", errors.New("no credentials")
				},
			}
			tt.mutate(cfg)
			mw, err := idempotency.New(idempotency.NewMemoryStore(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			var n atomic.Int64
			app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				id := n.Add(1)
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("Location", fmt.Sprintf("%s/%d", r.URL.Path, id))
				w.WriteHeader(http.StatusCreated)
				fmt.Fprintf(w, `{"id":%d}`, id)
			})
			rep, err := idemtest.Run(t.Context(), idemtest.Target{
				Handler: mw.Wrap(app),
				Path:    "/charges",
				AltPath: "/refunds",
				Body:    []byte(`{"order_id":"o-1","amount_kopecks":1000,"card":{"last4":"4242"}}`),
				Header:  http.Header{"Authorization": {"Bearer alice"}},
			})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, name := range []string{idemtest.CheckReplay, idemtest.CheckMismatch, idemtest.CheckRoutes} {
				res, _ := rep.Result(name)
				switch res.Status {
				case idemtest.Fail:
					got = append(got, name)
				case idemtest.Skip:
					t.Errorf("%s skipped: %s", name, res)
				}
			}
			if !slices.Equal(got, tt.want) {
				for _, r := range rep.Results {
					t.Log(r)
				}
				t.Fatalf("failed %v, want %v", got, tt.want)
			}
		})
	}
}
