// Command billing is the reference service of idem: a billing system that
// charges orders and payments through a payment provider, built only on
// idem's public packages (see docs/architecture.md), plus the demo and
// the chaos harness that prove it charges every order exactly once.
//
// Each subcommand lives in its own file and registers itself in init.
package main

import "github.com/idemkit/idem/internal/cli"

var commands []*cli.Command

func register(c *cli.Command) { commands = append(commands, c) }

func main() {
	cli.Main("billing", "reference billing service built on idem", commands)
}
