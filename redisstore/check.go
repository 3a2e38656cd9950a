package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Warning is one reason why the server's settings void (or may void) the
// store's guarantee, found by CheckServer.
type Warning struct {
	// Setting is the server setting: "appendonly", "appendfsync",
	// "maxmemory-policy", "role"; "CONFIG" or "INFO" when the settings
	// could not be read.
	Setting string
	// Value is what the server has ("" when unknown).
	Value string
	// Why says what can go wrong, and what to set instead.
	Why string
}

func (w Warning) String() string {
	if w.Value == "" {
		return fmt.Sprintf("%s: %s", w.Setting, w.Why)
	}
	return fmt.Sprintf("%s %s: %s", w.Setting, w.Value, w.Why)
}

// CheckServer reads the settings that the store's guarantee depends on
// (CONFIG GET appendonly, appendfsync, save, maxmemory-policy; INFO
// replication) and returns, and logs at warning level through
// Config.Logger, each one that voids it. No warning means the settings are
// as the package doc asks; it cannot see a failover or a client that reads
// from replicas. A server where CONFIG is disabled (renamed, refused by an
// ACL, as managed services do) gets one warning that the settings could not
// be checked. The error is for a server that cannot be reached at all. ctx
// bounds the calls.
//
// Call it at start; a program that must not run without the guarantee
// refuses to start when it returns warnings.
func (s *Store) CheckServer(ctx context.Context) ([]Warning, error) {
	ws, err := s.checkServer(ctx)
	if err != nil {
		return nil, err
	}
	for _, w := range ws {
		s.log.WarnContext(ctx, "redisstore: the server's settings void the idempotency guarantee",
			"setting", w.Setting, "value", w.Value, "why", w.Why)
	}
	return ws, nil
}

func (s *Store) checkServer(ctx context.Context) ([]Warning, error) {
	var ws []Warning
	cfg := map[string]string{}
	for _, name := range []string{"appendonly", "appendfsync", "save", "maxmemory-policy"} {
		m, err := s.c.ConfigGet(ctx, name).Result()
		if err != nil && !isRedisError(err) {
			return nil, fmt.Errorf("redisstore: check server: %w", err)
		}
		v, ok := m[name]
		if err != nil || !ok {
			// CONFIG renamed away or refused by an ACL (a reply, not a
			// dead server), or a server that hides the setting.
			why := fmt.Sprintf("CONFIG GET %s answered no value", name)
			if err != nil {
				why = fmt.Sprintf("CONFIG GET %s: %v", name, err)
			}
			ws = append(ws, Warning{Setting: "CONFIG", Why: "cannot check the server's persistence and eviction settings (" + why +
				"): make sure yourself of appendonly yes, appendfsync always or everysec, and maxmemory-policy noeviction"})
			cfg = nil
			break
		}
		cfg[name] = strings.ToLower(strings.TrimSpace(v))
	}
	if cfg != nil {
		aof, fsync, save, policy := cfg["appendonly"], cfg["appendfsync"], cfg["save"], cfg["maxmemory-policy"]
		switch {
		case aof != "yes" && save == "":
			ws = append(ws, Warning{Setting: "appendonly", Value: aof, Why: "no append-only file and no snapshots: a restart loses every record, so a retry of any completed request runs its handler again; set appendonly yes with appendfsync always or everysec"})
		case aof != "yes":
			ws = append(ws, Warning{Setting: "appendonly", Value: aof, Why: "snapshots only (save " + save + "): a restart loses every record written since the last snapshot, so their retries run the handler again; set appendonly yes with appendfsync always or everysec"})
		case fsync == "no":
			ws = append(ws, Warning{Setting: "appendfsync", Value: fsync, Why: "the kernel decides when the append-only file reaches the disk (about every 30 s): a machine crash loses the records of that time; set appendfsync always, or everysec (about 2 s at most)"})
		}
		if policy != "noeviction" {
			ws = append(ws, Warning{Setting: "maxmemory-policy", Value: policy, Why: "under memory pressure the server deletes keys, and every record has an expiry, so volatile-* policies evict records too: an evicted claim or completion lets its request run again; set maxmemory-policy noeviction (a full server then refuses claims with an error, answered 503)"})
		}
	}
	info, err := s.c.Info(ctx, "replication").Result()
	switch {
	case err != nil && !isRedisError(err):
		return nil, fmt.Errorf("redisstore: check server: %w", err)
	case err != nil:
		ws = append(ws, Warning{Setting: "INFO", Why: fmt.Sprintf("cannot check that the server is a primary (INFO replication: %v)", err)})
	default:
		if role := infoField(info, "role"); role != "master" && role != "primary" {
			ws = append(ws, Warning{Setting: "role", Value: role, Why: "not a primary: a read-only replica refuses every claim, a writable one keeps records only until it resyncs with its primary; point the store at the primary"})
		}
	}
	return ws, nil
}

// isRedisError reports whether err is the server's answer (an error
// reply), not a network or context failure.
func isRedisError(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && !errors.Is(err, redis.Nil)
}

// infoField returns the value of name in an INFO reply.
func infoField(info, name string) string {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}
