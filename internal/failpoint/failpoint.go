// Package failpoint injects faults at named points of idem's code, the
// technique of etcd's and TiDB's failpoints: a chaos run arms some points
// and the process kills itself, fails or pauses exactly in a crash window
// that random SIGKILLs would rarely hit (between publishing and marking, say).
//
// Points are inert unless the process starts with IDEM_FAILPOINTS set, so
// production code pays one atomic load per point. The variable is a comma
// list of name=action[@probability]:
//
//	IDEM_FAILPOINTS=relay-published=kill@0.02,consumer-db-committed=pause(200ms)@0.5
//
// Actions: kill (SIGKILL this process), error (Inject returns ErrInjected),
// pause(DURATION) (sleep, then go on), off. The probability defaults to 1.
// Every action taken is written to stderr as one line,
//
//	idem-failpoint: hit NAME ACTION
//
// before it happens, so that a harness reading the process's output can
// count hits per window even for kills. An unknown name or a malformed
// entry makes the first Inject panic at start-up time: a typo must not
// silently disarm a proof.
package failpoint

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// The crash windows idem's code marks. Each is named after what has
// happened and what has not yet.
const (
	// HTTPHandlerDone: the idempotency middleware's handler returned; its
	// response is not stored yet.
	HTTPHandlerDone = "http-handler-done"
	// HTTPResponseStored: the response is stored; it is not sent yet.
	HTTPResponseStored = "http-response-stored"
	// RelayMidClaim: the relay claimed a batch (two-phase: committed the
	// lease; at-least-once: locked the rows; WAL outbox: decoded it from
	// the slot, position not confirmed); nothing is published yet.
	RelayMidClaim = "relay-mid-claim"
	// RelayPublished: the batch was acknowledged by the broker; it is not
	// marked PUBLISHED yet (WAL outbox: the slot's position is not past
	// it).
	RelayPublished = "relay-published"
	// ConsumerDBCommitted: a record's transaction (processed_event and the
	// handler's effects) committed; its offset is not committed yet.
	ConsumerDBCommitted = "consumer-db-committed"
	// ChargerProviderAnswered: the payment provider answered; the outcome
	// is not committed to the database yet.
	ChargerProviderAnswered = "charger-provider-answered"
	// PurgeMidBatch: a retention purge deleted one batch and not the next.
	PurgeMidBatch = "purge-mid-batch"
)

// Names lists every point, for harnesses that arm them all.
var Names = []string{
	HTTPHandlerDone, HTTPResponseStored, RelayMidClaim, RelayPublished,
	ConsumerDBCommitted, ChargerProviderAnswered, PurgeMidBatch,
}

// EnvVar is the variable read at the first Inject.
const EnvVar = "IDEM_FAILPOINTS"

// ErrInjected is what Inject returns for the error action.
var ErrInjected = errors.New("failpoint: injected error")

type action struct {
	kind  string // kill, error, pause
	pause time.Duration
	p     float64
}

var (
	armed  atomic.Bool
	once   sync.Once
	points map[string]action
	// kill is replaceable by this package's tests.
	kill = func() { _ = syscall.Kill(os.Getpid(), syscall.SIGKILL) }
	out  = os.Stderr
	mu   sync.Mutex
)

func init() {
	armed.Store(os.Getenv(EnvVar) != "")
}

// Inject is a failpoint named name. Off (the default), it returns nil at
// the cost of one atomic load. Armed, it may kill the process, return
// ErrInjected or pause, per IDEM_FAILPOINTS.
func Inject(name string) error {
	if !armed.Load() {
		return nil
	}
	return inject(name)
}

func inject(name string) error {
	once.Do(load)
	a, ok := points[name]
	if !ok || a.kind == "off" {
		return nil
	}
	if a.p < 1 && rand.Float64() >= a.p {
		return nil
	}
	mu.Lock()
	fmt.Fprintf(out, "idem-failpoint: hit %s %s\n", name, a.kind)
	mu.Unlock()
	switch a.kind {
	case "kill":
		_ = out.Sync()
		kill()
		select {} // SIGKILL does not return; never go on past the window
	case "error":
		return fmt.Errorf("%w at %s", ErrInjected, name)
	case "pause":
		time.Sleep(a.pause)
	}
	return nil
}

func load() {
	p, err := parse(os.Getenv(EnvVar))
	if err != nil {
		panic(err)
	}
	points = p
}

// Validate checks an IDEM_FAILPOINTS value, for a harness that builds one.
func Validate(v string) error {
	_, err := parse(v)
	return err
}

func parse(v string) (map[string]action, error) {
	known := map[string]bool{}
	for _, n := range Names {
		known[n] = true
	}
	res := map[string]action{}
	for _, item := range strings.Split(v, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, spec, ok := strings.Cut(item, "=")
		if !ok || !known[name] {
			return nil, fmt.Errorf("failpoint: %s: %q is not name=action with a known name (%s)", EnvVar, item, strings.Join(Names, ", "))
		}
		a := action{p: 1}
		if s, prob, ok := strings.Cut(spec, "@"); ok {
			f, err := strconv.ParseFloat(prob, 64)
			if err != nil || f < 0 || f > 1 {
				return nil, fmt.Errorf("failpoint: %s: %q: probability must be in [0, 1]", EnvVar, item)
			}
			a.p, spec = f, s
		}
		switch {
		case spec == "kill", spec == "error", spec == "off":
			a.kind = spec
		case strings.HasPrefix(spec, "pause(") && strings.HasSuffix(spec, ")"):
			d, err := time.ParseDuration(spec[len("pause(") : len(spec)-1])
			if err != nil || d < 0 {
				return nil, fmt.Errorf("failpoint: %s: %q: bad pause duration", EnvVar, item)
			}
			a.kind, a.pause = "pause", d
		default:
			return nil, fmt.Errorf("failpoint: %s: %q: action must be kill, error, pause(DURATION) or off", EnvVar, item)
		}
		res[name] = a
	}
	return res, nil
}
