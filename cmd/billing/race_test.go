//go:build race

package main

// raceEnabled builds the billing binary with -race when the tests run with
// -race, so that the service's own goroutines are checked in real processes.
const raceEnabled = true
