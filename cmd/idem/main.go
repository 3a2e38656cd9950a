// Command idem is the toolkit CLI: migrations, a development Kafka broker,
// the payment-provider simulator, benchmarks, the conformance suite and the
// outbox status report.
//
// Each subcommand lives in its own file and registers itself in init.
package main

import "github.com/idemkit/idem/internal/cli"

var commands []*cli.Command

func register(c *cli.Command) { commands = append(commands, c) }

func main() {
	cli.Main("idem", "exactly-once-in-effect toolkit for HTTP, PostgreSQL and Kafka", commands)
}
