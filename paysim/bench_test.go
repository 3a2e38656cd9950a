package paysim_test

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/paysim"
)

// BenchmarkCharge compares a charge through paysim.Client (idemclient:
// key header, retry bookkeeping, problem parsing) with the same POST sent
// by a bare http.Client, both against paysim over loopback TCP. The
// difference is the client-side cost of the guarantee; the server side
// (idempotency middleware, ledger) is the same in both.
func BenchmarkCharge(b *testing.B) {
	sim, err := paysim.New(nil)
	if err != nil {
		b.Fatal(err)
	}
	srv := newBenchServer(b, sim)
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}

	b.Run("idemclient", func(b *testing.B) {
		ic, _ := idemclient.New(hc, nil)
		c, _ := paysim.NewClient(srv, ic)
		i := 0
		for b.Loop() {
			i++
			o := fmt.Sprintf("ib-%d", i)
			if _, err := c.Charge(b.Context(), paysim.ChargeCommand{IdempotencyKey: idemclient.Key(o, "charge"), OrderID: o, CustomerID: "c", AmountKopecks: 1}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("bare-http", func(b *testing.B) {
		i := 0
		for b.Loop() {
			i++
			o := fmt.Sprintf("bb-%d", i)
			req, _ := http.NewRequestWithContext(b.Context(), "POST", srv+"/charges",
				bytes.NewReader(fmt.Appendf(nil, `{"order_id":%q,"customer_id":"c","amount_kopecks":1}`, o)))
			req.Header.Set("Idempotency-Key", o+":charge")
			resp, err := hc.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				b.Fatal(resp.Status)
			}
		}
	})
}
