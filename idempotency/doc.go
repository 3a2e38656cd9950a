// Package idempotency makes a retried unsafe HTTP request (POST, PATCH)
// harmless: a net/http middleware that honours the Idempotency-Key header
// over a PostgreSQL (or in-memory) store.
//
// # Guarantee
//
// For one key, scoped by the authenticated principal (Config.Scope), the
// method and the route, the handler runs to a stored outcome at most once
// per retention period (24 hours by default), however many times and however
// concurrently the request is repeated, across every instance sharing the
// store:
//
//   - the claim is atomic and takes one round trip; concurrent requests get
//     409 IDEMPOTENCY_KEY_IN_PROGRESS with Retry-After (or, with
//     Config.Wait, wait and get the replay);
//   - a stored response (2xx and definitive 4xx) is replayed with its status,
//     body and allow-listed headers, plus Idempotent-Replayed: true; repeated
//     replays come from a bounded in-process cache (Config.ReplayCacheBytes),
//     never past the record's retention, as a completed record never changes;
//   - a key reused with a different request (method, path, canonical body)
//     gets IDEMPOTENCY_KEY_REUSED (409, or 422 by config), even while the
//     first is in progress (in ModeTransactional: once the first has
//     committed, see below);
//   - 5xx, 408, 429, a panic and a client that hung up release the key, so
//     that the retry runs the handler again;
//   - a store failure answers 503 and the handler does not run unprotected.
//
// In ModeTransactional the claim, the handler's writes (through
// TxFromContext) and the stored response commit in one transaction: a crash
// leaves nothing, and the retry is safe at once. In ModeTwoStep (the default;
// any Store) the claim commits first: a process that dies mid-handler leaves
// a claim that a retry takes over after the lease (database time), and the
// fencing token rejects the late original's completion.
//
// # Concurrency in transactional mode
//
// A transactional claim writes nothing: BEGIN, pg_try_advisory_xact_lock on
// the key (mixed with the table oid) and a read of the record travel in one
// round trip; the complete record is inserted just before COMMIT, in the same
// round trip. A second request with the same key therefore never blocks on
// the first's open transaction: the try-lock fails and it answers 409
// IDEMPOTENCY_KEY_IN_PROGRESS at once (or polls, with Config.Wait). The cost
// of that choice: while the first is uncommitted, a second request with a
// different body also gets in-progress, not IDEMPOTENCY_KEY_REUSED, because
// the first's fingerprint is not visible yet; once it commits, the mismatch
// is reported. In two-step mode the claim is committed first, so a mismatch
// always wins over in-progress.
//
// # What it does not guarantee
//
// In ModeTwoStep, side effects the handler makes outside the store (a
// payment provider call, another database) are not rolled back: a takeover
// after a crash runs the handler again, so such effects must be idempotent
// themselves (pass a key downstream, see idemclient). A handler that outlives
// its lease has its context cancelled; if it ignores that, its effects may
// overlap a takeover's. Keys are hashed with SHA-256; a purged key (after
// retention) is a new key. The response is buffered in memory; bodies over
// Config.MaxResponseBody are delivered but replayed empty. MemoryStore is for
// one process only.
package idempotency
