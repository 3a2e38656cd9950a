package wal_test

import (
	"context"
	"errors"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/internal/testkafka"
	"github.com/idemkit/idem/kafka"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/outbox/wal"
)

// newDatabase creates a database of the test's own on the test server and
// returns its URL, its name and a small pool on it. The test's end drops
// the database's slots (retrying while one is still active) and the
// database.
func newDatabase(t *testing.T) (string, string, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	name := "idem_wal_" + randName()
	admin, err := pgx.Connect(ctx, testdb.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(testdb.URL())
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	pc, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		pool.Close()
		admin, err := pgx.Connect(ctx, testdb.URL())
		if err != nil {
			t.Error(err)
			return
		}
		defer admin.Close(ctx)
		deadline := time.Now().Add(30 * time.Second)
		for {
			_, err := admin.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE database = $1", name)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("drop the slots of %s: %v", name, err)
				return
			}
			time.Sleep(50 * time.Millisecond) // a slot stays active a moment after its reader closed
		}
		if _, err := admin.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	return u.String(), name, pool
}

// TestSlotPerDatabase: slot names are cluster-wide, a logical slot
// decodes one database. Two relays with the default config on two
// databases of one cluster each get a slot of their own and deliver their
// own events; a relay given the other database's slot refuses to start
// (ErrSlotMismatch naming the slot and both databases), and so does
// CreateSlot, rather than reading nothing while its events pile up
// undecoded. A database upgraded from the former default keeps its slot.
func TestSlotPerDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	kc := testkafka.New(t)
	kc.CreateTopic(t, "one", 1)
	kc.CreateTopic(t, "two", 1)
	kc.CreateTopic(t, "three", 1)
	pub, err := kafka.NewPublisher(kc.Client(t, kafka.ProducerOpts()...), nil)
	if err != nil {
		t.Fatal(err)
	}
	url1, db1, pool1 := newDatabase(t)
	url2, db2, pool2 := newDatabase(t)
	start := func(dsn string, c *wal.Config) (*wal.Relay, error) {
		c.Logger, c.StatusInterval, c.AcquireInterval = quiet, 50*time.Millisecond, 50*time.Millisecond
		r, err := wal.NewRelay(dsn, pub, c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if err := r.HardStop(ctx); err != nil {
				t.Errorf("hard stop: %v", err)
			}
		})
		return r, r.Start(ctx)
	}
	r1, err := start(url1, &wal.Config{})
	if err != nil {
		t.Fatal(err)
	}
	r2, err := start(url2, &wal.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if r1.Slot() != wal.DefaultSlot(db1) || r2.Slot() != wal.DefaultSlot(db2) || r1.Slot() == r2.Slot() {
		t.Fatalf("default slots %s and %s, want %s and %s", r1.Slot(), r2.Slot(), wal.DefaultSlot(db1), wal.DefaultSlot(db2))
	}
	ev := func(topic, id string) outbox.Message {
		return outbox.Message{Topic: topic, AggregateType: "order", AggregateID: "a", EventID: id, EventType: "E"}
	}
	for i := range 3 {
		if _, err := wal.Enqueue(ctx, pool1, ev("one", "db1-"+string(rune('a'+i)))); err != nil {
			t.Fatal(err)
		}
		if _, err := wal.Enqueue(ctx, pool2, ev("two", "db2-"+string(rune('a'+i)))); err != nil {
			t.Fatal(err)
		}
	}
	if got := ids(kc.ReadAll(t, "one", 3, 60*time.Second)); !slices.Equal(got, []string{"db1-a", "db1-b", "db1-c"}) {
		t.Fatalf("database 1's topic: %v", got)
	}
	if got := ids(kc.ReadAll(t, "two", 3, 60*time.Second)); !slices.Equal(got, []string{"db2-a", "db2-b", "db2-c"}) {
		t.Fatalf("database 2's topic: %v", got)
	}

	// The other database's slot, by name: refused, with what to fix.
	_, err = start(url2, &wal.Config{Slot: r1.Slot()})
	if !errors.Is(err, wal.ErrSlotMismatch) || !strings.Contains(err.Error(), r1.Slot()) ||
		!strings.Contains(err.Error(), db1) || !strings.Contains(err.Error(), db2) {
		t.Fatalf("Start on another database's slot: %v, want ErrSlotMismatch naming %s, %s and %s", err, r1.Slot(), db1, db2)
	}
	if err := wal.CreateSlot(ctx, url2, &wal.Config{Slot: r1.Slot(), Logger: quiet}); !errors.Is(err, wal.ErrSlotMismatch) {
		t.Fatalf("CreateSlot on another database's slot: %v, want ErrSlotMismatch", err)
	}

	// A database whose relays ran with the former default, SlotDefault:
	// its relay keeps reading that slot, so what it decoded before the
	// upgrade is still delivered.
	url3, _, pool3 := newDatabase(t)
	if _, err := pool3.Exec(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", wal.SlotDefault); err != nil {
		t.Fatal(err)
	}
	if _, err := wal.Enqueue(ctx, pool3, ev("three", "db3-before")); err != nil {
		t.Fatal(err)
	}
	r3, err := start(url3, &wal.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if r3.Slot() != wal.SlotDefault {
		t.Fatalf("upgraded database's relay reads %s, want %s", r3.Slot(), wal.SlotDefault)
	}
	if got := ids(kc.ReadAll(t, "three", 1, 60*time.Second)); !slices.Equal(got, []string{"db3-before"}) {
		t.Fatalf("database 3's topic: %v", got)
	}
}

func TestDefaultSlot(t *testing.T) {
	t.Parallel()
	testCases := []struct{ db, want string }{
		{"billing", "idem_outbox_billing"},
		{"test", "idem_outbox_test"},
	}
	for _, tt := range testCases {
		if got := wal.DefaultSlot(tt.db); got != tt.want {
			t.Errorf("DefaultSlot(%q) = %q, want %q", tt.db, got, tt.want)
		}
	}
	seen := map[string]string{}
	for _, db := range []string{"My-DB", "my_db", "my-db", "MY_DB", strings.Repeat("x", 63), strings.Repeat("x", 62) + "y", "база"} {
		s := wal.DefaultSlot(db)
		if len(s) > 63 || strings.Trim(s, "abcdefghijklmnopqrstuvwxyz0123456789_") != "" {
			t.Errorf("DefaultSlot(%q) = %q: not a slot name", db, s)
		}
		if prev, ok := seen[s]; ok {
			t.Errorf("DefaultSlot(%q) = DefaultSlot(%q) = %q", db, prev, s)
		}
		seen[s] = db
	}
	if _, err := wal.NewRelay("postgres://u@127.0.0.1/Some-DB", &flaky{}, nil); err != nil {
		t.Fatalf("a database name that is not a slot name: %v", err)
	}
}
