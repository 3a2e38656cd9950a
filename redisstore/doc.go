// Package redisstore is an idempotency.Store in Redis (or Valkey), for the
// middleware's two-step mode (idempotency.ModeTwoStep): services that keep
// no PostgreSQL on the request path, or want replays off the database. It
// is a Go module of its own, so that users of idem's core never download a
// Redis client.
//
//	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
//	store, err := redisstore.New(rdb, nil)
//	...
//	if ws, err := store.CheckServer(ctx); err != nil || len(ws) > 0 { ... }
//	mw, err := idempotency.New(store, &idempotency.Config{Scope: ...})
//
// or, from a URL (what idem's programs take: IDEMPOTENCY_STORE, idem
// paysim --store, idem bench http --store), a store owning its client:
//
//	store, err := redisstore.Open("redis://127.0.0.1:6379/0?prefix={billing}:", nil)
//	defer store.Close()
//
// A URL that does not parse is ErrInvalidURL, before any connection.
//
// # How it works
//
// One hash per key, at Config.Prefix plus the hex of the middleware's
// idempotency.KeyHash (SHA-256 over principal, method, route and key, the
// same hash every store gets: the key and the principal are never stored
// in clear). Each Store method is one Lua script, so it runs alone on the
// server and takes one round trip:
//
//   - Claim creates or reads the record, compares fingerprints (a mismatch
//     wins over in-progress), and leases the key in the server's clock
//     (redis.call('TIME'), microseconds), never the callers'.
//   - The fencing token comes from the store's counter (Prefix+"fence", no
//     expiry): INCR, but never below the server's clock in microseconds
//     nor at or below the record's previous fence. It grows across a key's
//     expiry, and keeps growing when the counter itself was lost.
//   - Renew, Complete and Release compare-and-set on the token. Renew never
//     brings back a lease that ran out, and extends the record's retention
//     to the lease's end.
//   - Retention is the key's expiry (PEXPIREAT, at the retention's end in
//     server time), so Purge has nothing to do.
//   - A call that go-redis re-sends after a lost reply is harmless: a claim
//     carries a random id and gets its own claim back, a completion or
//     release already done by the same token succeeds again.
//
// It implements idempotency.Store, not TxStore: ModeTransactional needs
// the handler's writes in the claim's database transaction, which Redis
// cannot share.
//
// # What it guarantees, and what it does not
//
// Compared with idempotency.PostgresStore, two things are lost whatever
// the settings. There is no transactional mode: the handler's own
// database writes commit apart from the record, so a crash after that
// commit and before Complete lets the retry (after the lease) run the
// handler again, as in any two-step store; a handler whose effect must
// not repeat makes it idempotent itself (billing derives its ids from the
// key and marks the operation in its own transaction). And the records
// live only as long as Redis keeps them: a server restarted without
// persistence has forgotten every key, and each retry of those keys runs
// its handler again (the machine's shared Redis on this project's CI has
// persistence off, on purpose, for tests).
//
// The middleware's guarantee (one handler run to a stored outcome per key
// and retention period, across every instance) holds exactly as long as
// the server keeps what it acknowledged:
//
//	situation                                   outcome
//	------------------------------------------  -------------------------------------------------
//	many instances racing on one key            one claim wins; the others get in-progress
//	instances with skewed clocks                agree: leases and retention are in server time
//	a crashed owner, a retry after the lease    one takeover, with a higher fence; the late
//	                                            owner's completion is fenced out
//	a key expired, then used again              a fresh claim whose fence exceeds the old one
//	a reply lost, the command re-sent           the same claim, completion or release
//	the server's clock steps                    forward: leases end early, and a retry may take
//	                                            over a running handler (fenced out at its
//	                                            completion); backward: leases last longer
//	Redis restart, appendonly yes,              every acknowledged write survives: completed
//	  appendfsync always                        keys replay, claims keep fence and lease end
//	Redis restart, appendfsync everysec         a process crash loses nothing acknowledged
//	                                            (written to the kernel before the reply, unless
//	                                            a stalled fsync held the write back, up to 2 s);
//	                                            a machine crash loses up to about 2 s
//	Redis restart, appendonly no                VOID: everything since the last snapshot is
//	                                            gone (all, with save ""): those requests run
//	                                            again when retried; fences still never repeat
//	failover (Sentinel, Cluster)                VOID for the last writes: replication is
//	                                            asynchronous, so claims and completions the old
//	                                            primary acknowledged but had not sent are lost:
//	                                            a second execution is possible. Fences do not
//	                                            repeat unless the new primary's clock is behind
//	                                            by more than the failover took
//	reads from a replica                        the scripts write, so the store sends them to
//	                                            the primary; a read-only replica refuses them
//	                                            (answered 503), a writable one loses them at its
//	                                            next resync. Never a stale replay or grant, as
//	                                            long as the client is not pointed at a replica
//	memory full, maxmemory-policy noeviction    writes fail with OOM errors: a claim is answered
//	                                            503 (the handler does not run); a refused
//	                                            completion (large ones fail first) leaves its
//	                                            claim until the lease runs out, and the retry
//	                                            then runs the handler again. Nothing stored is
//	                                            lost
//	memory full, any other policy               VOID: records are evicted (every record has an
//	                                            expiry, so volatile-* policies take them too)
//	FLUSHALL, DEL or a key rewritten by hand    VOID for those keys; a key under the prefix
//	                                            that this store did not write is an error
//	                                            (ErrCorruptRecord or the server's), never a
//	                                            replay, and is not overwritten
//	a response over Config.MaxResponseBytes     Complete refuses it (ErrResponseTooLarge); the
//	                                            claim stands until its lease runs out
//
// What the operator must configure, and CheckServer checks (CONFIG GET
// appendonly, appendfsync, save, maxmemory-policy; INFO replication):
//
//   - appendonly yes with appendfsync always (no acknowledged write lost to
//     a crash) or everysec (up to about 2 s lost to a machine crash);
//   - maxmemory-policy noeviction;
//   - the store's client pointed at the primary, never at a replica.
//
// CheckServer logs each setting that voids the guarantee and returns it; a
// server where CONFIG is disabled (managed services rename it or refuse it
// by ACL) gets a warning that it cannot be checked. It cannot see a
// failover coming: a deployment that must not lose a write to one keeps
// the idempotency records in PostgreSQL (idempotency.PostgresStore).
//
// # Compatibility
//
// Redis 5.0 or later (scripts replicate their effects, so a script may
// read TIME and then write), standalone, with Sentinel, or Cluster (the
// default Prefix holds a hash tag, so every key of a store is on one
// shard: the store does not spread over a cluster's shards). Valkey: the
// store uses only commands Valkey has kept from Redis (EVALSHA, EVAL,
// TIME, HMGET, HSET, HDEL, DEL, INCR, SET, PEXPIREAT, CONFIG GET, INFO);
// its tests run against Redis 7.0 on this project's CI, not against
// Valkey.
package redisstore
