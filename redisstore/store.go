package redisstore

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/idempotency"
)

// Client is what Store needs from go-redis: scripts (EVALSHA, falling back
// to EVAL), and CONFIG GET and INFO for CheckServer. *redis.Client,
// *redis.ClusterClient and redis.UniversalClient have them.
type Client interface {
	redis.Scripter
	ConfigGet(ctx context.Context, parameter string) *redis.MapStringStringCmd
	Info(ctx context.Context, sections ...string) *redis.StringCmd
}

// Defaults of Config.
const (
	// PrefixDefault holds a hash tag, so that every key of the store (its
	// records and its fence counter) is in one Redis Cluster slot, as a
	// script touching two keys needs.
	PrefixDefault = "{idem}:"
	// MaxResponseBytesDefault leaves room for the headers of a body as
	// large as the middleware stores by default
	// (idempotency.MaxResponseBodyDefault).
	MaxResponseBytesDefault = idempotency.MaxResponseBodyDefault + 64<<10
)

// Config configures a Store. A nil *Config means all defaults.
type Config struct {
	// Prefix starts every key the store writes: a record is Prefix plus
	// the hex of its idempotency.KeyHash, the fence counter is Prefix plus
	// "fence". Stores with different prefixes are independent. On Redis
	// Cluster it must contain a hash tag ("{...}"): a claim touches a
	// record and the counter in one script. Defaults to PrefixDefault
	// ("{idem}:").
	Prefix string

	// MaxResponseBytes caps what Complete stores: the body plus the
	// encoded headers. A larger response is refused with
	// ErrResponseTooLarge and nothing is written; keep the middleware's
	// Config.MaxResponseBody below it (the middleware stores an empty body
	// in place of a larger one). Defaults to MaxResponseBytesDefault
	// (1 MiB + 64 KiB).
	MaxResponseBytes int

	// Logger receives what CheckServer finds wrong with the server's
	// settings. Defaults to slog.Default().
	Logger *slog.Logger
}

// Errors.
var (
	// ErrInvalidConfig is wrapped by every error of New about its Config;
	// the message names the field.
	ErrInvalidConfig = errors.New("redisstore: invalid config")
	// ErrResponseTooLarge is returned by Complete for a response larger
	// than Config.MaxResponseBytes. Nothing is stored: the claim stands
	// until its owner releases it or its lease runs out.
	ErrResponseTooLarge = errors.New("redisstore: response too large to store")
	// ErrCorruptRecord means a record under the store's prefix is not one
	// this store wrote (another program wrote the key).
	ErrCorruptRecord = errors.New("redisstore: corrupt record")
)

//go:embed lua/claim.lua
var claimLua string

//go:embed lua/renew.lua
var renewLua string

//go:embed lua/complete.lua
var completeLua string

//go:embed lua/release.lua
var releaseLua string

var (
	claimScript    = redis.NewScript(claimLua)
	renewScript    = redis.NewScript(renewLua)
	completeScript = redis.NewScript(completeLua)
	releaseScript  = redis.NewScript(releaseLua)
)

// Store is an idempotency.Store (two-step mode) in Redis or Valkey: one
// hash per key, claims, renewals, completions and releases as Lua scripts
// (each atomic, one round trip), leases in the server's clock, retention as
// the key's expiry. See the package doc for what it guarantees.
type Store struct {
	c       Client
	prefix  string
	fence   string
	maxResp int
	log     *slog.Logger
	// closer is the client Open made, closed by Close; nil for New.
	closer interface{ Close() error }
}

var _ idempotency.Store = (*Store)(nil)

// New returns a store over c. It does no I/O: call CheckServer at start to
// learn whether the server's settings keep the guarantee.
func New(c Client, cfg *Config) (*Store, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: the client is nil", ErrInvalidConfig)
	}
	var cc Config
	if cfg != nil {
		cc = *cfg
	}
	if cc.Prefix == "" {
		cc.Prefix = PrefixDefault
	}
	if cc.MaxResponseBytes == 0 {
		cc.MaxResponseBytes = MaxResponseBytesDefault
	}
	if cc.Logger == nil {
		cc.Logger = slog.Default()
	}
	switch {
	case cc.MaxResponseBytes < 0:
		return nil, fmt.Errorf("%w: Config.MaxResponseBytes %d is negative", ErrInvalidConfig, cc.MaxResponseBytes)
	case isCluster(c) && !hasHashTag(cc.Prefix):
		return nil, fmt.Errorf("%w: Config.Prefix %q has no hash tag ({...}): on Redis Cluster a record and the fence counter must share a slot", ErrInvalidConfig, cc.Prefix)
	}
	return &Store{c: c, prefix: cc.Prefix, fence: cc.Prefix + "fence", maxResp: cc.MaxResponseBytes, log: cc.Logger}, nil
}

func isCluster(c Client) bool {
	_, ok := c.(*redis.ClusterClient)
	return ok
}

// hasHashTag reports whether key has a hash tag as Redis Cluster reads it:
// the first "{" followed, later, by a "}" with something in between.
func hasHashTag(key string) bool {
	i := strings.IndexByte(key, '{')
	if i < 0 {
		return false
	}
	j := strings.IndexByte(key[i+1:], '}')
	return j > 0
}

// RecordKey returns the Redis key of the record of k, for operators and
// tests (redis-cli HGETALL).
func (s *Store) RecordKey(k idempotency.KeyHash) string {
	return s.prefix + hex.EncodeToString(k[:])
}

// FenceKey returns the Redis key of the store's fence counter.
func (s *Store) FenceKey() string { return s.fence }

// RecordsExpireThemselves reports that records leave by key expiry: Purge
// has nothing to delete (see storetest.SelfExpiring).
func (s *Store) RecordsExpireThemselves() bool { return true }

// micros rounds d up to whole microseconds, never down: a lease shortened
// by the rounding could end before the middleware's reckoning of it.
func micros(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}

// Claim implements idempotency.Store with one script (claim.lua). The
// call carries a random claim id, so that a call re-sent by the client
// after a lost reply gets its own claim back instead of in-progress.
func (s *Store) Claim(ctx context.Context, c idempotency.Claim) (idempotency.ClaimResult, error) {
	if err := ctx.Err(); err != nil {
		return idempotency.ClaimResult{}, err
	}
	var id [16]byte
	_, _ = rand.Read(id[:]) // crypto/rand.Read never fails
	return s.claim(ctx, c, id[:])
}

func (s *Store) claim(ctx context.Context, c idempotency.Claim, id []byte) (idempotency.ClaimResult, error) {
	v, err := claimScript.Run(ctx, s.c, []string{s.RecordKey(c.Key), s.fence},
		c.Fingerprint[:], micros(c.Lease), micros(c.Retention), id).Slice()
	if err != nil {
		return idempotency.ClaimResult{}, fmt.Errorf("redisstore: claim: %w", err)
	}
	return parseClaim(v)
}

// parseClaim reads claim.lua's reply, checking every member: a reply that
// is not what the script returns is an error, never a panic or a guess.
func parseClaim(v []any) (idempotency.ClaimResult, error) {
	if len(v) == 0 {
		return idempotency.ClaimResult{}, fmt.Errorf("%w: empty claim reply", ErrCorruptRecord)
	}
	outcome, _ := v[0].(string)
	num := func(i int) (int64, error) {
		if i >= len(v) {
			return 0, fmt.Errorf("%w: claim reply %q has %d members", ErrCorruptRecord, outcome, len(v))
		}
		n, ok := v[i].(int64)
		if !ok {
			return 0, fmt.Errorf("%w: claim reply member %d is %T", ErrCorruptRecord, i, v[i])
		}
		return n, nil
	}
	switch outcome {
	case "claimed", "took_over":
		f, err := num(1)
		if err != nil {
			return idempotency.ClaimResult{}, err
		}
		if f <= 0 {
			return idempotency.ClaimResult{}, fmt.Errorf("%w: fence %d", ErrCorruptRecord, f)
		}
		o := idempotency.OutcomeClaimed
		if outcome == "took_over" {
			o = idempotency.OutcomeTookOver
		}
		return idempotency.ClaimResult{Outcome: o, Fence: f}, nil
	case "in_progress":
		us, err := num(2)
		if err != nil {
			return idempotency.ClaimResult{}, err
		}
		ra := time.Duration(us) * time.Microsecond
		if ra <= 0 {
			ra = time.Microsecond
		}
		return idempotency.ClaimResult{Outcome: idempotency.OutcomeInProgress, RetryAfter: ra}, nil
	case "mismatch":
		return idempotency.ClaimResult{Outcome: idempotency.OutcomeMismatch}, nil
	case "completed":
		us, err := num(3)
		if err != nil {
			return idempotency.ClaimResult{}, err
		}
		if len(v) != 7 {
			return idempotency.ClaimResult{}, fmt.Errorf("%w: completed reply has %d members", ErrCorruptRecord, len(v))
		}
		status, _ := v[4].(string)
		hdr, _ := v[5].(string)
		body, ok := v[6].(string)
		st, err := strconv.Atoi(status)
		if err != nil || st < 100 || st > 999 || !ok {
			return idempotency.ClaimResult{}, fmt.Errorf("%w: completed record without a status or body", ErrCorruptRecord)
		}
		resp := &idempotency.Response{Status: st, Header: http.Header{}, Body: []byte(body)}
		if hdr != "" {
			if err := json.Unmarshal([]byte(hdr), &resp.Header); err != nil {
				return idempotency.ClaimResult{}, fmt.Errorf("%w: stored headers: %w", ErrCorruptRecord, err)
			}
		}
		return idempotency.ClaimResult{Outcome: idempotency.OutcomeCompleted, Response: resp, ExpiresIn: time.Duration(us) * time.Microsecond}, nil
	}
	return idempotency.ClaimResult{}, fmt.Errorf("%w: unknown claim outcome %q", ErrCorruptRecord, outcome)
}

// fenced turns a script's 1/0 into nil/ErrFenced.
func fenced(op string, n int64, err error) error {
	if err != nil {
		return fmt.Errorf("redisstore: %s: %w", op, err)
	}
	if n != 1 {
		return idempotency.ErrFenced
	}
	return nil
}

// Renew implements idempotency.Store (renew.lua).
func (s *Store) Renew(ctx context.Context, key idempotency.KeyHash, fence int64, lease time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	n, err := renewScript.Run(ctx, s.c, []string{s.RecordKey(key)}, fence, micros(lease)).Int64()
	return fenced("renew", n, err)
}

// Complete implements idempotency.Store (complete.lua). A response larger
// than Config.MaxResponseBytes is refused with ErrResponseTooLarge before
// anything is sent.
func (s *Store) Complete(ctx context.Context, key idempotency.KeyHash, fence int64, resp *idempotency.Response, retention time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if resp == nil {
		return errors.New("redisstore: complete: nil response")
	}
	hdr, err := json.Marshal(resp.Header)
	if err != nil {
		return fmt.Errorf("redisstore: encode headers: %w", err)
	}
	if n := len(hdr) + len(resp.Body); n > s.maxResp {
		return fmt.Errorf("%w: %d bytes of body and headers, the limit is %d (Config.MaxResponseBytes)", ErrResponseTooLarge, n, s.maxResp)
	}
	body := resp.Body
	if body == nil {
		body = []byte{}
	}
	n, err := completeScript.Run(ctx, s.c, []string{s.RecordKey(key)},
		fence, resp.Status, hdr, body, micros(retention)).Int64()
	return fenced("complete", n, err)
}

// Release implements idempotency.Store (release.lua).
func (s *Store) Release(ctx context.Context, key idempotency.KeyHash, fence int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	n, err := releaseScript.Run(ctx, s.c, []string{s.RecordKey(key)}, fence).Int64()
	return fenced("release", n, err)
}

// Purge implements idempotency.Store. Redis deletes a record itself when
// its retention ends (the key's expiry), so there is nothing left to
// delete: Purge returns 0 without a round trip. The middleware's purge
// loop may run; it costs nothing.
func (s *Store) Purge(ctx context.Context, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	return 0, nil
}
