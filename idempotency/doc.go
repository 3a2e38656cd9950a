// Package idempotency makes a retried unsafe HTTP request (POST, PATCH)
// harmless: a net/http middleware that honours the Idempotency-Key header
// over a PostgreSQL (or in-memory) store. The wire contract (header names,
// the key rule, problem codes) is package idem's.
//
// Usage:
//
//	mw, err := idempotency.New(idempotency.NewPostgresStore(pool), &idempotency.Config{
//		Mode:  idempotency.ModeTransactional,
//		Scope: func(r *http.Request) (string, error) { return userOf(r), nil },
//	})
//	_ = mw.Start(ctx) // the retention purge; lifecycle stops it
//	http.Handle("POST /orders", mw.Wrap(createOrder))
//	// in createOrder: tx, _ := idempotency.TxFromContext(r.Context())
//	//                 who, _ := idempotency.PrincipalFromContext(r.Context())
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
//     each entry for at most Config.ReplayCacheTTL (2s) and never past the
//     record's retention, so that an operator's Forget reaches every
//     instance within that TTL;
//   - a key reused with a different request (method, path, canonical body)
//     gets IDEMPOTENCY_KEY_REUSED (409, or 422 by config), even while the
//     first is in progress (in ModeTransactional: once the first has
//     committed, see below);
//   - 5xx, 408, 429, a panic and a client that hung up release the key, so
//     that the retry runs the handler again; so does a refusal the handler
//     marks with DoNotStore (input validation before any effect), whose
//     refusal is then never replayed: in ModeTransactional nothing remains
//     and the key may carry a corrected body; in ModeTwoStep the released
//     key keeps its fingerprint, so the same request runs again and a
//     different one is still IDEMPOTENCY_KEY_REUSED;
//   - a refusal from the headers alone (no key, a bad key, no principal, a
//     declared body over the limit) is answered at once with
//     Connection: close, without waiting for a body that may never come;
//   - a store failure answers 503 and the handler does not run unprotected;
//   - a client never gets two different successes for one key: a run whose
//     completion is fenced out (its lease ran out and a retry took over)
//     answers 409 IDEMPOTENCY_KEY_IN_PROGRESS instead of its own response,
//     and the client's retry gets the stored one.
//
// In ModeTransactional the claim, the handler's writes (through
// TxFromContext) and the stored response commit in one transaction: a crash
// leaves nothing, and the retry is safe at once. The handler's writes run
// under a savepoint, so that a handler whose statement failed (a unique
// violation it answers with 409) still gets its 4xx stored and replayed;
// a success answered after a failed statement commits nothing and answers
// 500 IDEMPOTENCY_TX_ABORTED.
//
// In ModeTwoStep (the default; any Store) the claim commits first. While
// the handler runs, a heartbeat renews the claim's lease in the store
// (Config.Lease, renewed every Lease/3, in database time, fenced by the
// claim's token), so a long handler keeps its key up to
// Config.HandlerTimeout. The handler's context ends before the lease can
// run out: its deadline counts from when the claim was sent, and when no
// renewal gets through (the store is unreachable) the heartbeat ends it,
// cause ErrLeaseLost, Lease/5 before the last lease it knows of would. A
// process that dies mid-handler leaves a claim that a retry takes over
// once the lease has run out, and the fencing token rejects the late
// original's completion.
//
// # The fingerprint
//
// A JSON body (application/json or +json) is fingerprinted in a canonical
// form: members sorted, whitespace and string escapes normalised, numbers
// as written; any other body by its bytes. The canonical form costs time
// and memory linear in the body. Two kinds of JSON body are refused with
// 400 before the handler runs: one nested deeper than Config.MaxBodyDepth
// (REQUEST_BODY_TOO_DEEP), and one with an object whose member names are
// equal ignoring case (REQUEST_BODY_AMBIGUOUS): encoding/json matches names
// to struct fields that way and keeps the last match, so
// {"amount":100,"Amount":5} and {"Amount":5,"amount":100} are different
// requests that no canonical form could tell apart. FingerprintFields
// match names the same way. A body that is not valid JSON in UTF-8 is
// fingerprinted by its bytes.
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
// # Crash windows
//
// Two named failpoints (internal/failpoint) mark where a crash matters,
// and the package's tests kill a real server process in each:
//
//   - failpoint.HTTPHandlerDone, after the handler returned and before its
//     response is stored. ModeTransactional: the transaction dies with the
//     connection; the retry runs the handler once, on a clean slate.
//     ModeTwoStep: the claim stays until its lease runs out; then one retry
//     takes the key over and runs the handler again, so effects outside the
//     store run twice unless they are idempotent themselves.
//   - failpoint.HTTPResponseStored, after the response is stored and before
//     it is sent, in both modes: the retry gets the stored response
//     replayed, and the handler does not run again.
//
// # What it does not guarantee
//
// In ModeTwoStep, side effects the handler makes outside the store (a
// payment provider call, another database) are not rolled back: a takeover
// after a crash runs the handler again, so such effects must be idempotent
// themselves (pass a key downstream, see idemclient). A handler that
// ignores its context may outlive its lease (its heartbeat stops with the
// context); its effects may then overlap a takeover's, although its client
// is told in-progress rather than given a second answer. Keys are hashed
// with SHA-256; a purged key (after retention) is a new key. The response
// is buffered in memory; bodies over Config.MaxResponseBody are delivered
// but replayed empty. MemoryStore is for one process only.
//
// NewSQLStore is PostgresStore over database/sql; in ModeTransactional the
// handler then writes through SQLTxFromContext, a *sql.Tx
// (docs/databasesql.md).
package idempotency
