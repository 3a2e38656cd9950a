package paysimtest_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/paysim"
	"github.com/idemkit/idem/paysim/paysimtest"
)

// A test starts a simulator of its own; the test's end shuts it down.
func ExampleStart() {
	testCharge := func(t *testing.T) { // func TestCharge(t *testing.T)
		sim, url := paysimtest.Start(t, &paysim.Config{FailRate: 0.1})
		_ = url // the payment client under test calls url
		if !paysim.Audit(sim.Ledger().Charges()).Clean() {
			t.Error("a charge was applied twice")
		}
	}
	_ = testCharge
}

// Example does by hand what Start does for a test, as a program (or
// `idem paysim`) serves the simulator: Serve on a loopback port, a charge
// sent twice with one key is applied once, and Shutdown ends Serve with
// http.ErrServerClosed.
func Example() {
	sim, err := paysim.New(nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		return
	}
	served := make(chan error, 1)
	go func() { served <- sim.Serve(ln) }()

	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	ic, _ := idemclient.New(&http.Client{Transport: tr}, nil)
	c, _ := paysim.NewClient("http://"+ln.Addr().String(), ic)
	cmd := paysim.ChargeCommand{IdempotencyKey: idemclient.Key("o-42", "charge"), OrderID: "o-42", CustomerID: "c-1", AmountKopecks: 1000}
	for range 2 {
		res, err := c.Charge(context.Background(), cmd)
		if err != nil {
			fmt.Println(err)
			break
		}
		fmt.Println(res.ChargeID, "replayed:", res.Replayed)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fmt.Println("shutdown:", sim.Shutdown(ctx))
	fmt.Println("served:", errors.Is(<-served, http.ErrServerClosed))
	fmt.Println("charges:", sim.Ledger().Len())
	// Output:
	// ch_00000001 replayed: false
	// ch_00000001 replayed: true
	// shutdown: <nil>
	// served: true
	// charges: 1
}
