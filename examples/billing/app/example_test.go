package app_test

import (
	"context"
	"fmt"
	"net"
	"os"

	"github.com/idemkit/idem/examples/billing/adapters/in/httpapi"
	"github.com/idemkit/idem/examples/billing/app"
	"github.com/idemkit/idem/internal/cli"
)

// ExampleRun runs billing with every role against the environment's
// database, Kafka and provider until SIGTERM, then stops in order. (Needs
// PostgreSQL, Kafka and a provider: no Output line.)
func ExampleRun() {
	ctx := context.Background()
	pool, err := cli.Connect(ctx, cli.DatabaseURL())
	if err != nil {
		fmt.Println(err)
		return
	}
	tokens, _ := httpapi.ParseTokens(httpapi.DefaultTokens)
	err = app.Run(ctx, app.Config{
		Pool:        pool,
		Brokers:     []string{os.Getenv("KAFKA_BROKERS")},
		PaymentURL:  os.Getenv("PAYMENT_URL"),
		HTTPAddr:    "127.0.0.1:8080",
		Tokens:      tokens,
		OnListening: func(a net.Addr) { fmt.Println("listening on", a) },
	})
	fmt.Println(err)
}
