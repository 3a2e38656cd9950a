package idemtest_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/paysim"
)

// Run against a handler: the payment-provider simulator, served by Run on
// a loopback server.
func ExampleRun() {
	srv, err := paysim.New(nil)
	if err != nil {
		panic(err)
	}
	rep, err := idemtest.Run(context.Background(), idemtest.Target{
		Handler: srv,
		Path:    "/charges",
		Body:    []byte(`{"order_id":"o-1","customer_id":"c-1","amount_kopecks":1000}`),
		Header:  http.Header{"Authorization": {"Bearer alice"}},
	})
	if err != nil {
		panic(err)
	}
	for _, name := range []string{idemtest.CheckBaseline, idemtest.CheckMissingKey, idemtest.CheckReplay, idemtest.CheckMismatch, idemtest.CheckExpiry} {
		res, _ := rep.Result(name)
		fmt.Println(name, res.Status)
	}
	// Output:
	// baseline pass
	// missing-key pass
	// replay pass
	// mismatch pass
	// expiry skip
}

// Check from a service's own test: every check becomes a subtest. The Gate
// inside the middleware lets retry-after hold an execution and observe the
// in-progress answer for sure.
func ExampleCheck() {
	testIdempotency := func(t *testing.T, middleware func(http.Handler) http.Handler, app http.Handler) {
		var gate idemtest.Gate
		idemtest.Check(t, idemtest.Target{
			Handler:    middleware(gate.Wrap(app)),
			Path:       "/payments",
			Body:       []byte(`{"order_id":"o-1","amount_kopecks":1000}`),
			Header:     http.Header{"Authorization": {"Bearer demo-alice"}},
			PrincipalB: http.Header{"Authorization": {"Bearer demo-bob"}},
			Hold:       gate.Hold,
		})
	}
	_ = testIdempotency
}
