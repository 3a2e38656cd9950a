package chaos

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/failpoint"
	"github.com/idemkit/idem/internal/testdb"
)

// Each server-side --unsafe layer (BILLING_UNSAFE) switched off in a small
// run that exercises it: the audit must fail with the violation that layer
// exists to prevent, and billing must have said loudly that it ran unsafe.
// (--unsafe=key, a driver-side layer, is TestChaosUnsafeKeyIsCaught.)
func TestChaosUnsafeLayersAreCaught(t *testing.T) {
	t.Parallel()
	testCases := []struct {
		name string
		cfg  Config
		// want: at least one violation of one of these kinds.
		want []string
		// lin: the model-based audit's verdict, when the layer is one it
		// sees (the client-visible answers change).
		lin string
	}{
		{
			// The fingerprint probe reuses a payment's key with another
			// amount: with the body left out of the fingerprint, the first
			// answer is replayed as if the second amount were accepted.
			name: UnsafeFingerprint,
			cfg:  Config{Orders: 4, Payments: 12, Instances: 2, LoadDuration: 2 * time.Second},
			want: []string{"key-reuse-accepted"},
			lin:  "no",
		},
		{
			// Half the POSTs are sent twice at once: with no lease, the
			// duplicate of a payment runs while the first is in flight and
			// creates a second payment, charged on the same order with the
			// same amount.
			name: UnsafeLease,
			cfg:  Config{Orders: 4, Payments: 30, Instances: 2, DuplicateRate: 0.5, LoadDuration: 3 * time.Second},
			want: []string{"double-charge", "orphan-charge"},
		},
		{
			// Redeliveries are what the inbox stops, so the run makes
			// sure of some: kills aimed at the two windows that leave a
			// handled record uncommitted (its transaction committed, or
			// the provider's answer in hand, and the offset not), twice
			// each. Random SIGKILLs alone could all land between records
			// (seen: a run with 4 kills and 0 redeliveries). paysim
			// dropping half its answers keeps charges in hand longer.
			// Each redelivery runs the consumers again, under a new
			// charge key.
			name: UnsafeInbox,
			cfg: Config{Orders: 20, Payments: 40, Instances: 2, Kills: 4, DropRate: 0.5,
				LoadDuration: 8 * time.Second, Failpoints: true, FailpointHits: 2,
				FailpointWindows: []string{failpoint.ConsumerDBCommitted, failpoint.ChargerProviderAnswered}},
			want: []string{"double-charge", "orphan-charge"},
		},
		{
			// The relay of each instance reports its first OrderConfirmed
			// published without producing it: the Kafka audit must name
			// the event lost (its order is never charged either, so the
			// quiescence wait is short).
			name: UnsafePublish,
			cfg:  Config{Orders: 6, Payments: 2, Instances: 2, LoadDuration: 2 * time.Second, Quiescence: 15 * time.Second},
			want: []string{"lost-event"},
		},
	}
	for _, tt := range testCases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t, testdb.Empty())
			var log bytes.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			cfg := tt.cfg
			cfg.IdemBin, cfg.BillingBin, cfg.DatabaseURL = needIdem(t), needBilling(t), db.URL
			cfg.Unsafe, cfg.Seed, cfg.Progress = tt.name, 11, &log
			// A kill that lands while a restarted instance is joining its
			// groups can leave kfake's group rebalancing for a while: not
			// a violation, only a slower quiescence.
			if cfg.Quiescence == 0 {
				cfg.Quiescence = 2 * time.Minute
			}
			rep, err := Run(ctx, &cfg)
			if err != nil {
				t.Fatalf("run: %v\n%s", err, log.String())
			}
			if rep.WorkDir != "" {
				defer os.RemoveAll(rep.WorkDir)
			}
			var out strings.Builder
			rep.WriteText(&out)
			t.Log(out.String())
			if rep.Pass || rep.Unsafe != tt.name {
				t.Fatalf("unsafe=%s run passed (unsafe %q): the audit did not catch it", tt.name, rep.Unsafe)
			}
			found := false
			for _, v := range rep.Violations {
				found = found || slices.Contains(tt.want, v.Kind)
				// A lost event is named: its id and its aggregate.
				if v.Kind == "lost-event" && (!strings.HasPrefix(v.Subject, "event ") || !strings.Contains(v.Detail, "order ord_") || !strings.Contains(v.Detail, "PUBLISHED")) {
					t.Errorf("lost-event does not name the event and its order: %+v", v)
				}
			}
			if !found {
				t.Fatalf("no %v among the violations %+v", tt.want, rep.Violations)
			}
			if tt.lin != "" {
				wantLinearizable(t, rep, tt.lin)
			}
			b, err := os.ReadFile(filepath.Join(rep.WorkDir, "logs", "billing-1.log"))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(b), "UNSAFE MODE: BILLING_UNSAFE="+tt.name) {
				t.Errorf("billing-1.log has no UNSAFE MODE warning for %s", tt.name)
			}
		})
	}
}
