package chaos

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/failpoint"
)

// Failpoints (Config.Failpoints) aim kills at the crash windows that
// random SIGKILLs rarely hit. One billing instance, the holder, runs with
// IDEM_FAILPOINTS arming kill at every window that has not yet been hit
// FailpointHits times, each with its probability from KillProbability;
// the others run disarmed and keep serving. When the holder kills itself
// the harness counts the hit (the failpoint package writes
// "idem-failpoint: hit NAME kill" to stderr before the SIGKILL) and starts
// it again within a second, as the chaos lane restarts the instances it
// kills, armed with the windows still missing. Once every window has its
// hits, or the load is over, the holder starts disarmed.
//
// One holder at a time keeps the damage bounded: at most one instance is
// down for a failpoint at any moment, whatever the probabilities.
//
// A window that is never reached (its point not compiled into this build,
// or a code path the run does not take) is armed in every incarnation and
// never fires; the report names it as missed.

// KillProbability is the chance that one pass through a window kills the
// holder (Config.FailpointOdds overrides it per window). Each is picked from how often the window is reached under a chaos
// load, so that an armed holder dies within a few seconds of serving: the
// HTTP windows see every POST routed to the holder; the relay windows one
// per batch; consumer-db-committed every record of both consumer groups;
// purge-mid-batch the boundaries between the batches of a purge, of which
// the seeded expired rows (seedPurge) make several at the holder's start.
var KillProbability = map[string]float64{
	failpoint.HTTPHandlerDone:         0.08,
	failpoint.HTTPResponseStored:      0.08,
	failpoint.RelayMidClaim:           0.20,
	failpoint.RelayPublished:          0.20,
	failpoint.ConsumerDBCommitted:     0.10,
	failpoint.ChargerProviderAnswered: 0.20,
	failpoint.PurgeMidBatch:           0.5,
}

// FailpointHitsDefault is Config.FailpointHits' default.
const FailpointHitsDefault = 1

// purgeJunkRows is how many expired rows seedPurge writes into each of
// processed_event and idempotency_key: three batches of the inbox purge
// (1000 rows) and six of the idempotency purge (500), so that a purge pass
// crosses several batch boundaries.
const purgeJunkRows = 3001

type failpoints struct {
	target  int
	holder  *proc
	odds    map[string]float64
	windows []string // the armed ones

	mu       sync.Mutex
	hits     map[string]int
	kills    int
	arming   bool
	lastSpec string
}

func newFailpoints(target int, holder *proc, windows []string, odds map[string]float64) *failpoints {
	o := make(map[string]float64, len(KillProbability))
	for name, p := range KillProbability {
		o[name] = p
	}
	for name, p := range odds {
		o[name] = p
	}
	var ws []string
	for _, name := range failpoint.Names {
		if len(windows) == 0 || slices.Contains(windows, name) {
			ws = append(ws, name)
		}
	}
	return &failpoints{target: target, holder: holder, odds: o, windows: ws, hits: map[string]int{}, arming: true}
}

// spec is the IDEM_FAILPOINTS value for the holder's next incarnation:
// every window still short of its hits, or "" when there is none (or
// arming is over).
func (f *failpoints) spec() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.arming {
		return ""
	}
	var items []string
	for _, name := range f.windows {
		if f.hits[name] < f.target {
			items = append(items, name+"=kill@"+strconv.FormatFloat(f.odds[name], 'f', -1, 64))
		}
	}
	f.lastSpec = strings.Join(items, ",")
	return f.lastSpec
}

// stopArming makes every later incarnation start disarmed.
func (f *failpoints) stopArming() {
	f.mu.Lock()
	f.arming = false
	f.mu.Unlock()
}

// hit records one "idem-failpoint: hit NAME ACTION" line; it reports
// whether the line was a kill.
func (f *failpoints) hit(line string) bool {
	fields := strings.Fields(strings.TrimPrefix(line, markerPrefix))
	if len(fields) != 3 || fields[0] != "hit" {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hits[fields[1]]++
	if fields[2] == "kill" {
		f.kills++
		return true
	}
	return false
}

// wantsPurge reports whether the holder's next incarnation arms
// purge-mid-batch (and so needs expired rows to purge).
func (f *failpoints) wantsPurge() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.arming && slices.Contains(f.windows, failpoint.PurgeMidBatch) && f.hits[failpoint.PurgeMidBatch] < f.target
}

// FailpointReport is the failpoint part of a Report.
type FailpointReport struct {
	// Hits counts the kills per window, every window of
	// failpoint.Names listed (0 for a window never hit).
	Hits map[string]int `json:"hits"`
	// Armed lists the windows the run armed; Missed those of them hit
	// fewer than Target times.
	Armed  []string `json:"armed"`
	Missed []string `json:"missed"`
	Target int      `json:"target"`
	// Kills is the holder's failpoint deaths.
	Kills int `json:"kills"`
}

func (f *failpoints) report() *FailpointReport {
	f.mu.Lock()
	defer f.mu.Unlock()
	rep := &FailpointReport{Hits: map[string]int{}, Armed: f.windows, Missed: []string{}, Target: f.target, Kills: f.kills}
	for _, name := range failpoint.Names {
		rep.Hits[name] = f.hits[name]
		if slices.Contains(f.windows, name) && f.hits[name] < f.target {
			rep.Missed = append(rep.Missed, name)
		}
	}
	sort.Strings(rep.Missed)
	return rep
}

// seedPurge writes purgeJunkRows long-expired rows into processed_event and
// idempotency_key, under names no real key or event has, so that the
// holder's retention purges (which run at start) have several batches to
// delete and cross the purge-mid-batch window. They are invisible to the
// audits: no consumer has the junk consumer id, no request hashes to a junk
// key.
func seedPurge(ctx context.Context, dbURL string, tag string) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return fmt.Errorf("chaos: seed expired rows: %w", err)
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, `INSERT INTO processed_event (consumer_id, event_id, processed_at)
		SELECT 'chaos-junk', $1 || '-' || g, now() - interval '60 days' FROM generate_series(1, $2::int) g
		ON CONFLICT DO NOTHING`, tag, purgeJunkRows)
	if err != nil {
		return fmt.Errorf("chaos: seed expired processed_event rows: %w", err)
	}
	_, err = conn.Exec(ctx, `INSERT INTO idempotency_key (key_hash, fingerprint, state, response_status, response_headers,
			response_body, created_at, completed_at, expires_at)
		SELECT sha256(convert_to('chaos-junk-' || $1 || '-' || g, 'UTF8')), '\x00'::bytea, 'completed', 200, '{}'::jsonb,
			''::bytea, now() - interval '60 days', now() - interval '60 days', now() - interval '59 days'
		FROM generate_series(1, $2::int) g
		ON CONFLICT DO NOTHING`, tag, purgeJunkRows)
	if err != nil {
		return fmt.Errorf("chaos: seed expired idempotency_key rows: %w", err)
	}
	return nil
}
