package wal

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"github.com/idemkit/idem/internal/owner"
	"github.com/idemkit/idem/outbox"
)

// Errors of this package. Use errors.Is.
var (
	// ErrInvalidConfig is returned by NewRelay (and an Enqueuer) for a bad
	// Config field, connection string or nil dependency; the text names
	// the field. It unwraps to outbox.ErrInvalidConfig.
	ErrInvalidConfig = fmt.Errorf("outbox/wal: invalid config: %w", outbox.ErrInvalidConfig)
	// ErrNotLogical is returned by Start when the server's wal_level is
	// not logical: no slot can decode its WAL. Set wal_level = logical
	// (a restart) or the managed service's equivalent; see the package doc.
	ErrNotLogical = errors.New("outbox/wal: wal_level is not logical")
	// ErrSlotNotFound is returned by GetSlotStatus for a slot that does
	// not exist.
	ErrSlotNotFound = errors.New("outbox/wal: replication slot not found")
	// ErrSlotMismatch is returned by Start and CreateSlot when the slot
	// named Config.Slot exists but cannot carry this relay's events: it
	// belongs to another database (slot names are cluster-wide, and a
	// logical slot decodes only the database it was created in), uses
	// another plugin than pgoutput, or is a physical slot. The text names
	// the slot, its database and plugin, and the relay's database. Give
	// the relay a slot of its own (Config.Slot), or leave Slot empty: the
	// default name includes the database (DefaultSlot).
	ErrSlotMismatch = errors.New("outbox/wal: replication slot belongs to another database or plugin")
)

// Defaults of Config.
const (
	// SlotDefault is the stem of the default slot name (DefaultSlot
	// appends the database), and the default slot name itself before
	// the database was part of it: see Config.Slot.
	SlotDefault            = "idem_outbox"
	PublicationDefault     = "idem_outbox"
	PrefixDefault          = "idem.outbox"
	BatchSizeDefault       = 500
	BatchTimeoutDefault    = 10 * time.Second
	StatusIntervalDefault  = time.Second
	AcquireIntervalDefault = time.Second
	BackoffMinDefault      = 100 * time.Millisecond
	BackoffMaxDefault      = 30 * time.Second
	LagIntervalDefault     = 10 * time.Second
	LagWarnBytesDefault    = 1 << 30
	LagWarnAgeDefault      = 5 * time.Minute
)

// Limits checked by NewRelay.
const (
	BatchSizeMax = 100_000
	OwnerMaxLen  = outbox.OwnerMaxLen
	PrefixMaxLen = 64
)

// identifier is what a slot or publication name may be: PostgreSQL's own
// rule for slot names (lower-case letters, digits, underscore), which
// also needs no quoting as a publication name.
var identifier = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// Config configures a Relay. A nil *Config means all defaults. NewRelay
// fills in the defaults first and then checks the result.
type Config struct {
	// Slot is the logical replication slot (pgoutput) the relay reads,
	// created by Start if missing. One slot is one relay group: one
	// relay reads it at a time, others wait as standbys. 1 to 63 of
	// a-z, 0-9 and _. Slot names are cluster-wide but a logical slot
	// decodes one database: Start refuses a slot of another database or
	// plugin (ErrSlotMismatch). Defaults to DefaultSlot of the connection
	// string's database ("idem_outbox_" and the database name, e.g.
	// idem_outbox_billing), or, for relays upgraded from a release whose
	// default was SlotDefault ("idem_outbox"), to that slot when it exists
	// for this database and the new name does not: its undelivered events
	// are not left behind. Set it explicitly to keep one name.
	Slot string
	// Publication is the publication named to pgoutput, created by Start
	// if missing, for no table: the relay needs only the messages. Same
	// rule as Slot. Defaults to PublicationDefault ("idem_outbox").
	Publication string
	// Prefix is the message prefix the relay decodes (see Enqueuer);
	// messages of other prefixes are passed over. At most PrefixMaxLen
	// bytes. Defaults to PrefixDefault ("idem.outbox").
	Prefix string
	// BatchSize is the most events per batch (one Publish call in the
	// common case), 1 to BatchSizeMax. A batch holds what arrived while
	// the previous one was being published, so it is small at low load.
	// Defaults to BatchSizeDefault (500).
	BatchSize int
	// BatchTimeout bounds one publish attempt of a batch, on
	// context.WithTimeout of the run's work context: the soft stop lets
	// it finish, the hard stop cancels it. Defaults to
	// BatchTimeoutDefault (10s).
	BatchTimeout time.Duration
	// StatusInterval is how often the relay reports its confirmed
	// position to the server when nothing else prompts it; it must be
	// well under the server's wal_sender_timeout (60s by default).
	// Keepalives that ask for a reply are answered at once. Defaults to
	// StatusIntervalDefault (1s).
	StatusInterval time.Duration
	// AcquireInterval is how often a standby retries taking the slot
	// from the relay that reads it. Defaults to AcquireIntervalDefault (1s).
	AcquireInterval time.Duration
	// BackoffMin and BackoffMax bound the wait before retrying a failed
	// publish and before reconnecting (full jitter, doubling from
	// BackoffMin). Defaults to BackoffMinDefault (100ms) and
	// BackoffMaxDefault (30s).
	BackoffMin time.Duration
	BackoffMax time.Duration
	// LagInterval is how often the relay measures the slot's lag (a
	// RelaySlotLag hook event); negative disables it. Defaults to
	// LagIntervalDefault (10s).
	LagInterval time.Duration
	// LagWarnBytes and LagWarnAge: a lag measure past either is also a
	// warning on Logger. Defaults to LagWarnBytesDefault (1 GiB) and
	// LagWarnAgeDefault (5m).
	LagWarnBytes int64
	LagWarnAge   time.Duration
	// Owner names this relay in hook events and in the replication
	// connection's application_name; at most OwnerMaxLen bytes. Defaults
	// to hostname-pid-random.
	Owner string
	// Logger receives warnings. Defaults to slog.Default().
	Logger *slog.Logger
	// Hook observes the relay with outbox.RelayEvent (Mode outbox.WAL):
	// batches as in the table relay, plus RelaySlotAcquired,
	// RelaySlotBusy, RelaySlotLag and RelayStreamFailed. Defaults to nil.
	Hook func(ctx context.Context, e outbox.RelayEvent) context.Context
}

func (c *Config) withDefaults() Config {
	var out Config
	if c != nil {
		out = *c
	}
	str := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	dur := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	// Slot's default depends on the database: NewRelay fills it.
	str(&out.Publication, PublicationDefault)
	str(&out.Prefix, PrefixDefault)
	if out.BatchSize == 0 {
		out.BatchSize = BatchSizeDefault
	}
	dur(&out.BatchTimeout, BatchTimeoutDefault)
	dur(&out.StatusInterval, StatusIntervalDefault)
	dur(&out.AcquireInterval, AcquireIntervalDefault)
	dur(&out.BackoffMin, BackoffMinDefault)
	dur(&out.BackoffMax, BackoffMaxDefault)
	dur(&out.LagInterval, LagIntervalDefault)
	dur(&out.LagWarnAge, LagWarnAgeDefault)
	if out.LagWarnBytes == 0 {
		out.LagWarnBytes = LagWarnBytesDefault
	}
	if out.Owner == "" {
		out.Owner = owner.Default(OwnerMaxLen)
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out
}

// DefaultSlot is the slot name a relay uses when Config.Slot is empty,
// for a connection to database: SlotDefault, an underscore and the
// database name ("idem_outbox_billing"). A name that does not fit the
// slot name rule as it is (characters other than a-z, 0-9 and _, or too
// long) is lower-cased, its other characters replaced by _, cut, and
// followed by 8 hex digits of its hash, so that two databases do not share
// a default slot. `idem outbox
// status --slot` takes the same name.
func DefaultSlot(database string) string {
	name := SlotDefault + "_" + database
	if identifier.MatchString(name) {
		return name
	}
	clean := []byte(strings.ToLower(database))
	for i, c := range clean {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
			clean[i] = '_'
		}
	}
	sum := sha256.Sum256([]byte(database))
	suffix := "_" + hex.EncodeToString(sum[:4])
	stem := SlotDefault + "_" + string(clean)
	if room := 63 - len(suffix); len(stem) > room {
		stem = stem[:room]
	}
	return stem + suffix
}

func (c *Config) validate() error {
	bad := func(field, why string) error { return fmt.Errorf("%w: %s %s", ErrInvalidConfig, field, why) }
	switch {
	case !identifier.MatchString(c.Slot):
		return bad("Slot", "must be 1..63 of a-z, 0-9 and _")
	case !identifier.MatchString(c.Publication):
		return bad("Publication", "must be 1..63 of a-z, 0-9 and _")
	case c.BatchSize < 1 || c.BatchSize > BatchSizeMax:
		return bad("BatchSize", fmt.Sprintf("must be in 1..%d", BatchSizeMax))
	case c.BatchTimeout < 0:
		return bad("BatchTimeout", "must be positive")
	case c.StatusInterval < 0:
		return bad("StatusInterval", "must be positive")
	case c.AcquireInterval < 0:
		return bad("AcquireInterval", "must be positive")
	case c.BackoffMin < 0:
		return bad("BackoffMin", "must be positive")
	case c.BackoffMax < c.BackoffMin:
		return bad("BackoffMax", fmt.Sprintf("(%v) must be at least BackoffMin (%v)", c.BackoffMax, c.BackoffMin))
	case c.LagWarnBytes < 0:
		return bad("LagWarnBytes", "must be positive")
	case c.LagWarnAge < 0:
		return bad("LagWarnAge", "must be positive")
	case len(c.Owner) > OwnerMaxLen || !storable(c.Owner):
		return bad("Owner", fmt.Sprintf("must be at most %d bytes of UTF-8 without NUL", OwnerMaxLen))
	}
	if err := checkPrefix(c.Prefix); err != nil {
		return err
	}
	return nil
}
