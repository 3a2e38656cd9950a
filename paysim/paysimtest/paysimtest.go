// Package paysimtest runs a payment-provider simulator for a test, as
// `idem paysim` runs it: paysim.Server.Serve on a loopback TCP port, with
// the Config's timeouts and connection bound, so that what a test sees is
// what the program does.
//
// Usage:
//
//	func TestCharge(t *testing.T) {
//		sim, url := paysimtest.Start(t, &paysim.Config{FailRate: 0.1})
//		// point the code under test at url; read sim.Ledger() after
//	}
package paysimtest

import (
	"context"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/idemkit/idem/paysim"
)

// Start serves a simulator made from cfg (nil: all defaults) on
// 127.0.0.1 and returns it with its base URL ("http://127.0.0.1:PORT").
// The test's cleanup shuts it down gracefully and fails the test when
// in-flight requests do not finish within 10 seconds or Serve ends with
// anything but http.ErrServerClosed.
func Start(t testing.TB, cfg *paysim.Config) (*paysim.Server, string) {
	t.Helper()
	sim, err := paysim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- sim.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := sim.Shutdown(ctx); err != nil {
			t.Errorf("paysimtest: Shutdown: %v", err)
		}
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("paysimtest: Serve: %v", err)
		}
	})
	return sim, "http://" + ln.Addr().String()
}
