package consume

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/idemkit/idem/internal/testdb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// noDriver is a Driver whose Open fails: New and the config checks never
// reach a broker. (The Consumer's behaviour is tested through real drivers
// by package consumertest.)
type noDriver struct{}

func (noDriver) Open(context.Context) (Session, error) { return nil, errors.New("no broker here") }

func TestNewValidatesAfterDefaults(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	h := func(context.Context, pgx.Tx, *Message) error { return nil }
	ok := func() *Config { return &Config{ConsumerID: "c"} }
	testCases := []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"no consumer id", func(c *Config) { c.ConsumerID = "" }, "ConsumerID"},
		{"negative attempts", func(c *Config) { c.MaxAttempts = -1 }, "MaxAttempts"},
		{"negative backoff", func(c *Config) { c.BackoffMin = -1 }, "BackoffMin"},
		// BackoffMax defaults to 5s: a BackoffMin above it is caught only
		// because the check runs after the defaults (and lifts the default).
		{"max below min", func(c *Config) { c.BackoffMin, c.BackoffMax = time.Minute, time.Second }, "BackoffMax"},
		{"negative dead-letter attempts", func(c *Config) { c.DeadLetterAttempts = -2 }, "DeadLetterAttempts"},
		{"negative dead-letter timeout", func(c *Config) { c.DeadLetterTimeout = -1 }, "DeadLetterTimeout"},
		{"negative ack timeout", func(c *Config) { c.AckTimeout = -1 }, "AckTimeout"},
		{"bad form", func(c *Config) { c.InboxForm = "sideways" }, "InboxForm"},
		{"prepare with batch", func(c *Config) {
			c.Batch = true
			c.Prepare = func(context.Context, *Message) (any, error) { return nil, nil }
		}, "Prepare"},
	}
	for _, tt := range testCases {
		cfg := ok()
		tt.mutate(cfg)
		_, err := New(db.Pool, noDriver{}, h, cfg)
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err = %v, want ErrInvalidConfig naming %s", tt.name, err, tt.want)
		}
	}
	if _, err := New(db.Pool, noDriver{}, h, &Config{ConsumerID: "c", BackoffMin: time.Minute}); err != nil {
		t.Errorf("BackoffMin above the default BackoffMax: %v (the default should follow it)", err)
	}
	for name, f := range map[string]func() error{
		"nil db":      func() error { _, err := New(nil, noDriver{}, h, ok()); return err },
		"nil driver":  func() error { _, err := New(db.Pool, nil, h, ok()); return err },
		"nil handler": func() error { _, err := New(db.Pool, noDriver{}, nil, ok()); return err },
		"nil config":  func() error { _, err := New(db.Pool, noDriver{}, h, nil); return err },
	} {
		if err := f(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: err = %v, want ErrInvalidConfig", name, err)
		}
	}
}

// TestStartOpenFails: a driver that cannot open makes Start fail, and the
// Consumer stays stoppable and startable.
func TestStartOpenFails(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	c, err := New(db.Pool, noDriver{}, func(context.Context, pgx.Tx, *Message) error { return nil }, &Config{ConsumerID: "c"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for range 2 {
		if err := c.Start(ctx); err == nil || !strings.Contains(err.Error(), "no broker here") {
			t.Fatalf("Start = %v, want the driver's error", err)
		}
		if err := c.Stop(ctx); err != nil {
			t.Fatalf("Stop after a failed Start: %v", err)
		}
	}
}

func TestTruncateError(t *testing.T) {
	t.Parallel()
	if s := truncateError("short"); s != "short" {
		t.Fatalf("short error changed: %q", s)
	}
	for _, unit := range []string{"x", "é", "日本", "🙂"} {
		long := strings.Repeat(unit, 3000)
		s := truncateError(long)
		if len(s) > DeadLetterErrorMaxBytes || !utf8.ValidString(s) || !strings.HasSuffix(s, "…") || !strings.HasPrefix(long, strings.TrimSuffix(s, "…")) {
			t.Errorf("%s: %d bytes, valid %v, suffix %q", unit, len(s), utf8.ValidString(s), s[max(0, len(s)-6):])
		}
	}
}

func TestPermanent(t *testing.T) {
	t.Parallel()
	if Permanent(nil) != nil {
		t.Fatal("Permanent(nil) != nil")
	}
	base := errors.New("bad payload")
	err := fmt.Errorf("wrapped: %w", Permanent(base))
	if !IsPermanent(err) || !errors.Is(err, base) || IsPermanent(base) {
		t.Fatal("IsPermanent / Unwrap")
	}
}
