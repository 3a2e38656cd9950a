package paysimtest_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemkit/idem/paysim"
	"github.com/idemkit/idem/paysim/paysimtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestStartServesTheBoundedServer: Start serves through paysim.Serve, so
// the Config's connection bound holds (a bare http.Server would serve the
// second connection), and the cleanup leaves nothing running (goleak).
func TestStartServesTheBoundedServer(t *testing.T) {
	t.Parallel()
	sim, url := paysimtest.Start(t, &paysim.Config{MaxConns: 1})
	hold := &http.Transport{}
	defer hold.CloseIdleConnections()
	resp, err := (&http.Client{Transport: hold}).Get(url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close() // the connection stays open, idle, holding the one slot
	other := &http.Transport{DisableKeepAlives: true}
	resp, err = (&http.Client{Transport: other}).Get(url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(resp.Header.Get("Content-Type"), "problem+json") || sim.Stats().Refused != 1 {
		t.Fatalf("second connection over MaxConns 1: %d %v, %d refused", resp.StatusCode, resp.Header, sim.Stats().Refused)
	}
}
