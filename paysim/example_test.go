package paysim_test

import (
	"context"
	"fmt"
	"net/http/httptest"

	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/paysim"
)

// A charge with one key, derived from the order and the request,
// for every attempt; a repeat is answered from the provider's store.
func ExampleClient_Charge() {
	sim, _ := paysim.New(nil)
	srv := httptest.NewServer(sim)
	defer srv.Close()

	ic, _ := idemclient.New(srv.Client(), nil)
	c, _ := paysim.NewClient(srv.URL, ic)
	cmd := paysim.ChargeCommand{
		IdempotencyKey: idemclient.Key("o-42", "charge", "r-7"),
		OrderID:        "o-42",
		CustomerID:     "c-1",
		AmountKopecks:  1000,
	}
	for range 2 {
		res, err := c.Charge(context.Background(), cmd)
		if err != nil {
			panic(err)
		}
		fmt.Println(res.ChargeID, "replayed:", res.Replayed)
	}
	fmt.Println(paysim.Audit(sim.Ledger().Charges()).Clean(), sim.Ledger().Len(), "row")
	// Output:
	// ch_00000001 replayed: false
	// ch_00000001 replayed: true
	// true 1 row
}
