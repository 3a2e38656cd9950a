package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gofiber/fiber/v3"

	"github.com/idemkit/idem/internal/testdb"
)

// TestBenchFiberStorage: fiber-pg's middleware really keeps its records in
// PostgreSQL. A fresh request leaves a row in fiber_storage; a second Fiber
// app (its own memory lock and middleware, the same table) replays the
// answer without running the handler; with the row deleted, the handler
// runs again; a row past its expiry is not served.
func TestBenchFiberStorage(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, testdb.Empty())
	ctx := context.Background()
	if _, err := db.Pool.Exec(ctx, `CREATE TABLE bench_http_row (
		id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, body text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	newApp := func() *fiber.App {
		app := fiber.New()
		if err := benchFiberRoutes(ctx, app, db.Pool); err != nil {
			t.Fatal(err)
		}
		return app
	}
	post := func(app *fiber.App, key string) (int, string) {
		t.Helper()
		req := httptest.NewRequest(http.MethodPost, "/fiber-pg/rows", strings.NewReader(benchHTTPBody))
		req.Header.Set("Idempotency-Key", key)
		resp, err := app.Test(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(body)
	}
	count := func(q string, args ...any) int {
		t.Helper()
		var n int
		if err := db.Pool.QueryRow(ctx, q, args...).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	rows := func() int { return count(`SELECT count(*) FROM bench_http_row`) }

	first := newApp()
	code, body := post(first, "k1")
	if code != http.StatusCreated || !strings.Contains(body, `"id":1`) || rows() != 1 {
		t.Fatalf("fresh: %d %q, %d rows; want 201, id 1, one row", code, body, rows())
	}
	if n := count(`SELECT count(*) FROM fiber_storage WHERE k = 'k1' AND length(v) > 0 AND e > $1`, time.Now().Unix()); n != 1 {
		t.Fatalf("fiber_storage holds %d live records of k1, want 1", n)
	}

	// Another app, nothing shared but the table: the replay comes from it.
	second := newApp()
	if code, replay := post(second, "k1"); code != http.StatusCreated || replay != body || rows() != 1 {
		t.Fatalf("replay: %d %q, %d rows; want 201 %q and still one row", code, replay, rows(), body)
	}
	if _, err := db.Pool.Exec(ctx, `DELETE FROM fiber_storage WHERE k = 'k1'`); err != nil {
		t.Fatal(err)
	}
	if code, again := post(second, "k1"); code != http.StatusCreated || !strings.Contains(again, `"id":2`) || rows() != 2 {
		t.Fatalf("after the record's delete: %d %q, %d rows; want the handler run again (id 2)", code, again, rows())
	}

	// Expired rows are not served: the handler runs.
	if _, err := db.Pool.Exec(ctx, `UPDATE fiber_storage SET e = $1 WHERE k = 'k1'`, time.Now().Unix()-1); err != nil {
		t.Fatal(err)
	}
	if code, again := post(first, "k1"); code != http.StatusCreated || !strings.Contains(again, `"id":3`) || rows() != 3 {
		t.Fatalf("after the record's expiry: %d %q, %d rows; want the handler run again (id 3)", code, again, rows())
	}

	// The storage's own calls: Set, Get, Delete, Reset.
	s := &benchFiberStorage{db: db.Pool}
	if err := s.Set("k2", []byte("v2"), 0); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Get("k2"); err != nil || string(v) != "v2" {
		t.Fatalf("Get(k2) = %q, %v; want v2", v, err)
	}
	if err := s.Delete("k2"); err != nil {
		t.Fatal(err)
	}
	if v, err := s.Get("k2"); err != nil || v != nil {
		t.Fatalf("Get(k2) after Delete = %q, %v; want nil", v, err)
	}
	if err := s.Reset(); err != nil || count(`SELECT count(*) FROM fiber_storage`) != 0 {
		t.Fatalf("Reset: %v, want an empty table", err)
	}
}
