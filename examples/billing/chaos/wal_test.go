package chaos

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/failpoint"
	"github.com/idemkit/idem/internal/testdb"
)

// TestChaosWAL runs billing with OUTBOX_MODE=wal under instance kills (each
// aimed at the instance whose relay reads the slot), a broker restart and a crash of
// its PostgreSQL cluster (which runs with wal_level=logical; a crash sets a
// slot back to its last checkpointed position: events are sent again, none
// lost). Every charge is audited as in table mode, and every event decoded
// from the harness's audit slot must be on its topic, the first copies of
// each aggregate in commit order.
func TestChaosWAL(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, testdb.Empty())
	var log bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	rep, err := Run(ctx, &Config{
		IdemBin: needIdem(t), BillingBin: needBilling(t), DatabaseURL: db.URL,
		OutboxMode: OutboxWAL,
		Quiescence: 4 * time.Minute,
		Orders:     60, Payments: 30, Instances: 3,
		Kills: 3, Terms: 1, BrokerRestarts: 1, PGRestarts: 1,
		DropRate: 0.2, FailRate: 0.1, DeclineRate: 0.05, Seed: 19,
		LoadDuration: 25 * time.Second,
		Progress:     &log,
		// The slot's first reader dies at its first publish, before the
		// slot's position passes it: the batch comes again from the
		// standby that takes over.
		Failpoints: true, FailpointWindows: []string{failpoint.RelayPublished},
		FailpointOdds: map[string]float64{failpoint.RelayPublished: 1},
	})
	if rep != nil {
		var out strings.Builder
		rep.WriteText(&out)
		t.Log(out.String())
	}
	if err != nil {
		t.Fatalf("run: %v\n%s", err, log.String())
	}
	if !rep.Pass {
		t.Fatalf("violations (logs in %s):\n%s", rep.WorkDir, log.String())
	}
	if f := rep.Failpoints; f == nil || f.Hits[failpoint.RelayPublished] != 1 {
		t.Errorf("failpoint relay-published not hit once in the WAL relay: %+v", f)
	}
	if rep.Kills != 3 || rep.PGRestarts != 1 || rep.RelayKills < 2 {
		t.Errorf("chaos not carried out: %d kills (%d of the slot's reader), %d PostgreSQL restarts", rep.Kills, rep.RelayKills, rep.PGRestarts)
	}
	// Each confirmed order emits OrderConfirmed and ChargeRequested, each
	// payment ChargeRequested: the audit slot saw them all.
	if want := 2*rep.ConfirmedOrders + rep.AcceptedPayments; rep.KafkaEvents != want || rep.ConfirmedOrders != 60 {
		t.Errorf("%d events audited, want %d (%d orders, %d payments)", rep.KafkaEvents, want, rep.ConfirmedOrders, rep.AcceptedPayments)
	}
}
