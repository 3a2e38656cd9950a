package idemfiber_test

import (
	"testing"

	"go.uber.org/goleak"
)

// fasthttp keeps two goroutines that are not ours to stop: the worker
// pool's cleaner sleeps out its interval (10s) after the server stopped
// before it sees the stop, and the server date updater runs for the life
// of the process once a server started.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
	)
}
