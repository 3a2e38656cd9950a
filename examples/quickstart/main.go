// Command quickstart is idem in one small service, built only on its public
// API: POST /orders runs under a transactional Idempotency-Key, writes the
// order and its event (outbox.EnqueueTx) in the request's transaction, a
// relay publishes the event to Kafka, and a consumer records one shipment
// per event through the inbox. Migrations run at start; SIGINT or SIGTERM
// stops it in order.
//
//	go run ./examples/quickstart      # DATABASE_URL, else the local server; KAFKA_BROKERS, else an in-process kfake
//	curl -X POST localhost:8080/orders -H 'Idempotency-Key: k-1' -d '{"customer":"c1","total":1000}'
package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"

	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/lifecycle"
	"github.com/idemkit/idem/migrate"
	"github.com/idemkit/idem/outbox"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

const topic = "orders"

const schema = `
CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, customer text NOT NULL, total bigint NOT NULL);
CREATE TABLE IF NOT EXISTS shipments (event_id text PRIMARY KEY, order_id bigint NOT NULL);`

func main() {
	addr := envOr("HTTP_ADDR", "127.0.0.1:8080")
	ln, err := net.Listen("tcp", addr)
	if err == nil {
		slog.Info("quickstart listening", "addr", ln.Addr().String())
		err = run(context.Background(), envOr("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"),
			os.Getenv("KAFKA_BROKERS"), ln, nil)
	}
	if err != nil {
		slog.Error("quickstart", "err", err)
		os.Exit(1)
	}
}

// run serves on ln until a signal (or the end of ctx) and stops in order.
// brokers empty means an in-process kfake; signals nil means SIGINT, SIGTERM.
func run(ctx context.Context, dsn, brokers string, ln net.Listener, signals []os.Signal) error {
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := migrate.Up(ctx, pool); err != nil { // idem's tables
		return err
	}
	if _, err := pool.Exec(ctx, schema); err != nil { // the service's own
		return err
	}

	stopBroker := func() {}
	if brokers == "" {
		fake, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			return err
		}
		brokers, stopBroker = strings.Join(fake.ListenAddrs(), ","), fake.Close
	}
	defer stopBroker()
	seeds := strings.Split(brokers, ",")
	client, err := kgo.NewClient(append(kafka.ProducerOpts(), kgo.SeedBrokers(seeds...))...)
	if err != nil {
		return err
	}
	defer client.Close()
	// A broker may not auto-create topics: create them (an existing one is
	// fine), the consumer's dead-letter topic too (its Start checks it).
	if err := kafka.EnsureTopics(ctx, client, 1, topic, topic+kafka.DeadLetterSuffixDefault); err != nil {
		return err
	}

	mw, err := idempotency.New(idempotency.NewPostgresStore(pool), &idempotency.Config{
		Mode:  idempotency.ModeTransactional,
		Scope: func(r *http.Request) (string, error) { return "demo", nil }, // your caller's principal
	})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Wrap(http.HandlerFunc(createOrder)))

	pub, err := kafka.NewPublisher(client, nil)
	if err != nil {
		return err
	}
	relay, err := outbox.NewRelay(pool, pub, nil)
	if err != nil {
		return err
	}
	consumer, err := kafka.NewConsumer(pool, ship, &kafka.ConsumerConfig{Brokers: seeds, Group: "shipping", Topics: []string{topic}})
	if err != nil {
		return err
	}

	group, err := lifecycle.New(&lifecycle.Config{Signals: signals})
	if err != nil {
		return err
	}
	mux.Handle("GET /readyz", group.ReadyHandler())
	for _, s := range []lifecycle.Stage{ // stop order: HTTP, consumer, relay and purges
		{Name: "http", Components: []lifecycle.Component{lifecycle.NewHTTPServer(&http.Server{Handler: mux}, ln)}},
		{Name: "consumer", Components: []lifecycle.Component{consumer}},
		{Name: "relay", Components: []lifecycle.Component{relay, mw}},
	} {
		if err := group.Add(s); err != nil {
			return err
		}
	}
	return group.Run(ctx)
}

type order struct {
	ID       int64  `json:"id"`
	Customer string `json:"customer"`
	Total    int64  `json:"total"`
}

// createOrder writes the order and its event in the request's transaction:
// both commit with the stored response, or none does.
func createOrder(w http.ResponseWriter, r *http.Request) {
	var o order
	if err := json.NewDecoder(r.Body).Decode(&o); err != nil || o.Customer == "" || o.Total <= 0 {
		idempotency.DoNotStore(w) // a refusal is not replayed under the key
		http.Error(w, `want {"customer": "…", "total": N > 0}`, http.StatusBadRequest)
		return
	}
	tx, _ := idempotency.TxFromContext(r.Context())
	err := tx.QueryRow(r.Context(), `INSERT INTO orders (customer, total) VALUES ($1, $2) RETURNING id`, o.Customer, o.Total).Scan(&o.ID)
	if err == nil {
		body, _ := json.Marshal(o)
		_, err = outbox.EnqueueTx(r.Context(), tx, outbox.Message{Topic: topic, AggregateType: "order",
			AggregateID: strconv.FormatInt(o.ID, 10), EventType: "order.created", Payload: body})
	}
	if err != nil {
		http.Error(w, "database: "+err.Error(), http.StatusServiceUnavailable) // 5xx: the key is released, a retry runs again
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(o)
}

// ship records one shipment per event, in the transaction that also marks
// the event processed: a redelivered event is skipped before it gets here.
func ship(ctx context.Context, tx pgx.Tx, rec *kgo.Record) error {
	var o order
	if err := json.Unmarshal(rec.Value, &o); err != nil {
		return kafka.Permanent(err) // dead-lettered at once
	}
	_, err := tx.Exec(ctx, `INSERT INTO shipments (event_id, order_id) VALUES ($1, $2)`, kafka.RecordEventID(rec), o.ID)
	return err
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
