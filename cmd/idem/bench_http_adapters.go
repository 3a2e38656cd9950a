package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"

	"github.com/gin-gonic/gin"
	"github.com/gofiber/fiber/v3"
	fiberidem "github.com/gofiber/fiber/v3/middleware/idempotency"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"github.com/idemkit/idem/idemecho"
	"github.com/idemkit/idem/idemfiber"
	"github.com/idemkit/idem/idemgin"
	"github.com/idemkit/idem/idempotency"
)

// benchAdapterSummary is bench http's help for the adapter variants.
const benchAdapterSummary = "gin-tx, echo-tx, fiber-tx: the framework adapters (idemgin, idemecho,\n" +
	"  idemfiber) over the same ModeTransactional middleware and the same row,\n" +
	"  each with its ratio to transactional (net/http) in the same run; fiber-own:\n" +
	"  Fiber v3's own idempotency middleware (its memory storage and lock), the\n" +
	"  handler writing the same row through the pool, and the ratio fiber-tx/fiber-own."

// benchAdapterVariants are gin-tx, echo-tx, fiber-tx and fiber-own; with
// withFiber also the Fiber side of the http-vs-fiber comparison,
// fiber-plain, fiber-pg, fiber-pg-replay and fiber-tx-replay (in
// fiberCmp). gin and echo
// are served on mux, behind the same server as transactional; Fiber
// (fasthttp) on a listener of its own. stop ends the Fiber server.
func benchAdapterVariants(ctx context.Context, mux *http.ServeMux, pool *pgxpool.Pool, store *idempotency.PostgresStore,
	scope func(*http.Request) (string, error), newKey func() string, clients int, conns *benchConns,
	withFiber bool) (variants, fiberCmp []benchVariant, stop func(), err error) {
	mw, err := idempotency.New(store, &idempotency.Config{Scope: scope, Mode: idempotency.ModeTransactional})
	if err != nil {
		return nil, nil, nil, err
	}
	const insert = `INSERT INTO bench_http_row (body) VALUES ($1) RETURNING id`
	// row writes the handler's row through the request's transaction.
	row := func(ctx context.Context) (int64, error) {
		tx, ok := idempotency.TxFromContext(ctx)
		if !ok {
			return 0, fmt.Errorf("no request transaction")
		}
		var id int64
		err := tx.QueryRow(ctx, insert, benchHTTPBody).Scan(&id)
		return id, err
	}
	answer := func(id int64) string { return `{"id":` + strconv.FormatInt(id, 10) + `,"status":"NEW"}` }

	gin.SetMode(gin.ReleaseMode)
	ge := gin.New()
	ge.Use(gin.Recovery(), idemgin.New(mw))
	ge.POST("/gin/rows", func(c *gin.Context) {
		_, _ = io.Copy(io.Discard, c.Request.Body)
		id, err := row(c.Request.Context())
		if err != nil {
			c.String(http.StatusInternalServerError, err.Error())
			return
		}
		c.Header("Location", "/rows/"+strconv.FormatInt(id, 10))
		c.Data(http.StatusCreated, "application/json", []byte(answer(id)))
	})
	mux.Handle("POST /gin/rows", ge)

	ee := echo.New()
	ee.POST("/echo/rows", func(c echo.Context) error {
		_, _ = io.Copy(io.Discard, c.Request().Body)
		id, err := row(c.Request().Context())
		if err != nil {
			return err
		}
		c.Response().Header().Set("Location", "/rows/"+strconv.FormatInt(id, 10))
		return c.Blob(http.StatusCreated, "application/json", []byte(answer(id)))
	}, idemecho.New(mw))
	mux.Handle("POST /echo/rows", ee)

	guard, err := idemfiber.New(mw, &idemfiber.Config{Scope: func(c fiber.Ctx) (string, error) { return c.Get("X-User"), nil }})
	if err != nil {
		return nil, nil, nil, err
	}
	app := fiber.New()
	app.Post("/fiber/rows", guard, func(c fiber.Ctx) error {
		id, err := row(c.Context())
		if err != nil {
			return err
		}
		c.Set("Location", "/rows/"+strconv.FormatInt(id, 10))
		c.Set("Content-Type", "application/json")
		return c.Status(http.StatusCreated).SendString(answer(id))
	})
	// Fiber's own middleware: its default header and key rule (a UUID)
	// changed to the Idempotency-Key the load generator sends.
	app.Post("/own/rows", fiberidem.New(fiberidem.Config{
		KeyHeader:         "Idempotency-Key",
		KeyHeaderValidate: func(string) error { return nil },
	}), func(c fiber.Ctx) error {
		var id int64
		if err := pool.QueryRow(c.Context(), insert, benchHTTPBody).Scan(&id); err != nil {
			return err
		}
		c.Set("Location", "/rows/"+strconv.FormatInt(id, 10))
		c.Set("Content-Type", "application/json")
		return c.Status(http.StatusCreated).SendString(answer(id))
	})
	if withFiber {
		if err := benchFiberRoutes(ctx, app, pool); err != nil {
			return nil, nil, nil, err
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = app.Listener(ln, fiber.ListenConfig{DisableStartupMessage: true})
	}()
	fconns := newBenchConns(ln.Addr().String(), clients)
	stop = func() {
		fconns.close()
		_ = app.ShutdownWithContext(context.WithoutCancel(ctx))
		<-done
	}
	post := func(c *benchConns, path string) func(context.Context) error {
		return func(ctx context.Context) error { return c.post(ctx, path, newKey(), http.StatusCreated) }
	}
	if withFiber {
		fiberCmp = []benchVariant{
			{name: "fiber-plain", op: post(fconns, "/fiber-plain/rows")},
			{name: "fiber-pg", op: post(fconns, "/fiber-pg/rows")},
			benchReplayVariant("fiber-pg-replay", "/fiber-pg/rows", clients, newKey, fconns),
			// idem's replays on Fiber's HTTP stack (idemfiber, replay
			// cache on): fiber-pg-replay's peer with the server the same.
			benchReplayVariant("fiber-tx-replay", "/fiber/rows", clients, newKey, fconns),
		}
	}
	return []benchVariant{
		{name: "gin-tx", op: post(conns, "/gin/rows")},
		{name: "echo-tx", op: post(conns, "/echo/rows")},
		{name: "fiber-tx", op: post(fconns, "/fiber/rows")},
		{name: "fiber-own", op: post(fconns, "/own/rows")},
	}, fiberCmp, stop, nil
}

// benchAdapterRatios sets each adapter's Ratio to transactional (fiber-own's
// too) and reports them, with fiber-tx over fiber-own.
func benchAdapterRatios(log io.Writer, results []benchResult) {
	by := map[string]int{}
	for i, r := range results {
		by[r.Name] = i
	}
	base, ok := by["transactional"]
	if !ok || results[base].OpsPerSec <= 0 {
		return
	}
	for _, name := range []string{"gin-tx", "echo-tx", "fiber-tx", "fiber-own"} {
		if i, ok := by[name]; ok {
			results[i].Ratio = results[i].OpsPerSec / results[base].OpsPerSec
			fmt.Fprintf(log, "http: %s/transactional: %.3f\n", name, results[i].Ratio)
		}
	}
	ft, ok1 := by["fiber-tx"]
	fo, ok2 := by["fiber-own"]
	if ok1 && ok2 && results[fo].OpsPerSec > 0 {
		fmt.Fprintf(log, "http: fiber-tx/fiber-own (idemfiber over PostgreSQL / Fiber's idempotency over memory): %.3f\n", results[ft].OpsPerSec/results[fo].OpsPerSec)
	}
}
