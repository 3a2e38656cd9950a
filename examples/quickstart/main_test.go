package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// setup runs the quick start in a schema of its own on TEST_DATABASE_URL
// (else the local server) with its in-process kfake, and returns its base
// URL and a pool on the same schema. The service stops, and must stop
// cleanly, when the test ends.
func setup(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	base := os.Getenv("TEST_DATABASE_URL")
	if base == "" {
		base = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	ctx := context.Background()
	admin, err := pgxpool.New(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "quickstart_" + hex.EncodeToString(b)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	q.Set("pool_max_conns", "8")
	u.RawQuery = q.Encode()
	dsn := u.String()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run(runCtx, dsn, "", ln, []os.Signal{}) }()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
		pool.Close()
		if _, err := admin.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Error(err)
		}
		admin.Close()
	})

	addr := "http://" + ln.Addr().String()
	waitFor(t, "ready", func() bool {
		resp, err := http.Get(addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return addr, pool
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 30s", what)
		}
		<-tick.C
	}
}

func post(t *testing.T, addr, key, body string) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, addr+"/orders", strings.NewReader(body))
	if err != nil {
		t.Error(err)
		return 0, nil, nil
	}
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return 0, nil, nil
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Error(err)
	}
	return resp.StatusCode, resp.Header, b
}

func count(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestRetriedPostIsOneOrderOneEventOneShipment(t *testing.T) {
	t.Parallel()
	addr, pool := setup(t)
	body := `{"customer":"c1","total":1000}`

	status1, _, first := post(t, addr, "k-1", body)
	status2, h2, second := post(t, addr, "k-1", body)
	if status1 != http.StatusCreated || status2 != http.StatusCreated {
		t.Fatalf("statuses %d, %d (%s / %s), want 201 twice", status1, status2, first, second)
	}
	if h2.Get("Idempotent-Replayed") != "true" {
		t.Errorf("second answer not marked replayed: %v", h2)
	}
	if !bytes.Equal(first, second) {
		t.Errorf("replay differs:\n%s\n%s", first, second)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE customer = 'c1'`); n != 1 {
		t.Errorf("%d orders, want 1", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM outbox_event WHERE aggregate_type = 'order'`); n != 1 {
		t.Errorf("%d outbox events, want 1", n)
	}
	waitFor(t, "the shipment", func() bool { return count(t, pool, `SELECT count(*) FROM shipments`) > 0 })
	// The event was published and consumed: it is PUBLISHED, marked in the
	// inbox, and made exactly one row.
	waitFor(t, "the event published", func() bool {
		return count(t, pool, `SELECT count(*) FROM outbox_event WHERE status = 'PUBLISHED'`) == 1
	})
	if n := count(t, pool, `SELECT count(*) FROM shipments`); n != 1 {
		t.Errorf("%d shipments, want 1", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM processed_event WHERE consumer_id = 'shipping'`); n != 1 {
		t.Errorf("%d processed events, want 1", n)
	}

	status, _, b := post(t, addr, "k-1", `{"customer":"c1","total":2000}`)
	if status != http.StatusConflict || !bytes.Contains(b, []byte("IDEMPOTENCY_KEY_REUSED")) {
		t.Errorf("another body on the key: %d %s, want 409 IDEMPOTENCY_KEY_REUSED", status, b)
	}
	if n := count(t, pool, `SELECT count(*) FROM orders`); n != 1 {
		t.Errorf("%d orders after the reuse, want 1", n)
	}
}

func TestConcurrentCopiesMakeOneOrder(t *testing.T) {
	t.Parallel()
	addr, pool := setup(t)
	var wg sync.WaitGroup
	statuses := make([]int, 10)
	for i := range statuses {
		wg.Go(func() {
			statuses[i], _, _ = post(t, addr, "k-concurrent", `{"customer":"c2","total":500}`)
		})
	}
	wg.Wait()
	created := 0
	for _, s := range statuses {
		switch s {
		case http.StatusCreated:
			created++
		case http.StatusConflict: // IDEMPOTENCY_KEY_IN_PROGRESS while the first runs
		default:
			t.Errorf("status %d, want 201 or 409 in progress", s)
		}
	}
	if created == 0 {
		t.Error("no copy got 201")
	}
	if n := count(t, pool, `SELECT count(*) FROM orders WHERE customer = 'c2'`); n != 1 {
		t.Errorf("%d orders from ten copies, want 1", n)
	}
	if n := count(t, pool, `SELECT count(*) FROM outbox_event`); n != 1 {
		t.Errorf("%d events from ten copies, want 1", n)
	}
}
