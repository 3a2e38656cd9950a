package paysim_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/idemclient"
	"github.com/idemkit/idem/paysim"
)

// bundle is a simulator on a real loopback TCP listener.
type bundle struct {
	sim *paysim.Server
	srv *httptest.Server
	url string
}

func setup(t *testing.T, cfg *paysim.Config) *bundle {
	t.Helper()
	sim, err := paysim.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(sim)
	t.Cleanup(srv.Close)
	return &bundle{sim: sim, srv: srv, url: srv.URL}
}

func newBenchServer(b *testing.B, h http.Handler) string {
	srv := httptest.NewServer(h)
	b.Cleanup(srv.Close)
	return srv.URL
}

// httpClient is a client with its own transport, closed at test end.
func httpClient(t *testing.T, tr *http.Transport) *http.Client {
	t.Helper()
	if tr == nil {
		tr = &http.Transport{}
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// fastIdem retries quickly and often enough that a run with faults at the
// issue's rates practically never exhausts its attempts: an attempt fails
// with probability 0.2 + 0.8·0.3 = 0.44, so 40 failures in a row happen
// with probability 0.44^40 ≈ 5e-15 per call. Retry500 is on because
// paysim's injected failure is a 500 that happens before any charge.
func fastIdem(t *testing.T, hc *http.Client) *idemclient.Client {
	t.Helper()
	c, err := idemclient.New(hc, &idemclient.Config{MaxAttempts: 40, BackoffMin: 200 * time.Microsecond, BackoffMax: 5 * time.Millisecond, Retry500: true})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

type reply struct {
	status  int
	header  http.Header
	body    string
	problem struct {
		Code   string `json:"code"`
		Status int    `json:"status"`
	}
	chargeID string
}

// send posts body to path with the given headers and reads the answer.
func send(t *testing.T, hc *http.Client, method, url, body string, header map[string]string) (*reply, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	r := &reply{status: resp.StatusCode, header: resp.Header, body: string(b)}
	if resp.Header.Get("Content-Type") == "application/problem+json" {
		json.Unmarshal(b, &r.problem)
	} else if resp.StatusCode == http.StatusCreated {
		var c struct {
			ChargeID string `json:"charge_id"`
		}
		json.Unmarshal(b, &c)
		r.chargeID = c.ChargeID
	}
	return r, nil
}

func chargeBody(order, customer string, amount int64) string {
	b, _ := json.Marshal(map[string]any{"order_id": order, "customer_id": customer, "amount_kopecks": amount})
	return string(b)
}

func jsonUnmarshal(s string, v any) error { return json.Unmarshal([]byte(s), v) }
