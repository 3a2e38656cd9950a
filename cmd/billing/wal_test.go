package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/idemkit/idem/paysim"
)

// TestFlowChargesEverythingOnceWAL is the flow of
// TestFlowChargesEverythingOnce with OUTBOX_MODE=wal: the events go
// through the WAL and a replication slot instead of the outbox table (which
// stays empty), one instance's relay reads the slot while the other's
// stands by, and every order and payment is charged exactly once.
func TestFlowChargesEverythingOnceWAL(t *testing.T) {
	t.Parallel()
	s := newStack(t, &paysim.Config{FailRate: 0.1, DropRate: 0.1, Seed: 11})
	slot := "billing_" + strings.TrimPrefix(s.db.Schema, "t_")
	t.Cleanup(func() { dropSlotWhenFree(t, s, slot) })
	env := append(s.env, "OUTBOX_MODE=wal", "OUTBOX_SLOT="+slot)
	p := startServe(t, env)
	worker := startServe(t, append(env, "HTTP_ADDR=127.0.0.1:0"), "--roles", "relay,consumer,charger")
	c := newClient(p.Addr, aliceToken)

	const orders, payments = 60, 30
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < orders; i += 6 {
				createConfirm(t, c, i)
			}
			for i := w; i < payments; i += 6 {
				r := c.must(t, "POST", "/orders", fmt.Sprintf("pay-order-%d", i), fmt.Sprintf(`{"customer_id":"c%d","total_kopecks":%d}`, i, 1000+i))
				if r.Status != http.StatusCreated {
					t.Errorf("order for payment %d: %d %s", i, r.Status, r.Body)
					continue
				}
				r = c.must(t, "POST", "/payments", fmt.Sprintf("pay-%d", i), fmt.Sprintf(`{"order_id":%q,"customer_id":"c%d","amount_kopecks":%d}`, r.json(t)["id"], i, 500+i))
				if r.Status != http.StatusCreated {
					t.Errorf("payment %d: %d %s", i, r.Status, r.Body)
				}
			}
		}()
	}
	wg.Wait()
	s.waitCount(t, orders, `SELECT count(*) FROM orders WHERE status = 'CHARGED'`)
	s.waitCount(t, payments, `SELECT count(*) FROM payments WHERE status = 'CHARGED'`)
	s.checkLedger(t, orders, payments)
	if n := s.count(t, `SELECT count(*) FROM outbox_event`); n != 0 {
		t.Fatalf("%d outbox rows in WAL mode", n)
	}
	if n := s.count(t, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1 AND active`, slot); n != 1 {
		t.Fatalf("slot %s: %d active readers, want 1", slot, n)
	}
	worker.signal(syscall.SIGTERM)
	p.signal(syscall.SIGTERM)
	if code := p.wait(); code != 0 {
		t.Fatalf("http instance exit %d; stderr:\n%s", code, p.stderr.String())
	}
	if code := worker.wait(); code != 0 {
		t.Fatalf("worker instance exit %d; stderr:\n%s", code, worker.stderr.String())
	}

	// A bad mode or slot is a usage error.
	for _, e := range []string{"OUTBOX_MODE=disk", "OUTBOX_SLOT=Bad-Slot"} {
		if _, stderr, code := runBilling(t, append(s.env, "OUTBOX_MODE=wal", e), "serve"); code != 2 || !strings.Contains(stderr, strings.Split(e, "=")[0]) {
			t.Errorf("%s: exit %d, stderr %q", e, code, stderr)
		}
	}
}

// dropSlotWhenFree drops slot once its reader has let go of it.
func dropSlotWhenFree(t *testing.T, s *stack, slot string) {
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := s.db.Pool.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", slot)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("drop slot %s: %v", slot, err)
			return
		}
		time.Sleep(50 * time.Millisecond) // polling interval
	}
	if _, err := s.db.Pool.Exec(ctx, "DROP PUBLICATION IF EXISTS "+slot); err != nil {
		t.Errorf("drop publication: %v", err)
	}
}
