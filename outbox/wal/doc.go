// Package wal is idem's table-less outbox: EnqueueTx writes each event
// into the business transaction's own WAL with pg_logical_emit_message,
// and a Relay reads the events from a logical replication slot (the
// pgoutput plugin with messages on, through a publication of no table)
// and publishes them through an outbox.Publisher. It is a mode beside the
// table outbox of package outbox, not a replacement: the two compare
// below, and a program picks one (billing: OUTBOX_MODE=table|wal).
//
// Usage:
//
//	_, err := wal.EnqueueTx(ctx, tx, outbox.Message{Topic: "orders.events", AggregateID: id, Payload: p})
//	relay, err := wal.NewRelay(os.Getenv("DATABASE_URL"), pub, nil) // needs wal_level=logical
//	_ = relay.Start(ctx)
//
// # Guarantees
//
//   - Atomic with the transaction: a message is decoded only when its
//     transaction commits, never after a rollback.
//   - Visible before published: an event is published only once its
//     transaction is visible to a new snapshot on the server, so a
//     consumer that reads what the transaction wrote finds it. The slot
//     can hand a commit over before that (the server flushes the commit
//     record before it takes the transaction out of the running set; a
//     commit waiting for a synchronous standby stays in between), so the
//     relay looks at pg_current_snapshot() on a plain connection of its
//     own before each publish attempt, and waits.
//   - Commit order: the relay receives transactions in commit order and a
//     transaction's events in write order, a total order over the
//     database; it publishes them in that order, per aggregate across
//     topics too (a call holds one topic per aggregate; after an event
//     fails, the later events of its aggregate wait for it).
//   - At least once: the slot's confirmed position moves past a
//     transaction only when all its events, and every event before them,
//     were acknowledged by the publisher. A relay that crashes, or loses
//     its connection, resumes from that position: what it had published
//     after it is published again (consumers deduplicate by event id:
//     package inbox). The failpoints relay-mid-claim (a batch decoded,
//     nothing sent) and relay-published (sent, the position not past it)
//     mark the two crash windows for the chaos harness's kills
//     (TestFailpointKillThenRestart). A clean Stop confirms everything it delivered:
//     stopped inside a transaction (one larger than BatchSize), it first
//     delivers the rest of that transaction, until HardStop.
//   - One slot per database: slot names are cluster-wide, a logical slot
//     decodes one database. Start refuses a slot of another database or
//     plugin (ErrSlotMismatch), and the default slot name includes the
//     database (DefaultSlot; a database that has the former default,
//     SlotDefault, keeps reading it).
//   - One reader per slot: PostgreSQL lets one connection stream a slot.
//     Other relays of the same slot are standbys that retry every
//     AcquireInterval and take over when the reader's connection ends
//     (its process died: the server notices the closed socket; a hung
//     one is cut at wal_sender_timeout).
//
// What it does not give: a per-aggregate sequence number (Event.Seq and
// the aggregate-seq header are 0). Order comes from the commit order
// itself; a consumer that wants a position compares Event.ID, the
// message's WAL position (LSN), only within one transaction, since
// transactions can commit in another order than they wrote. Two
// transactions that enqueue for one aggregate without conflicting on a row
// may commit in either order; lock the aggregate's row (as the state
// change usually does) when that matters. There is no DEAD state: an event
// that keeps failing is retried with backoff for ever, holding the slot's
// position (and so WAL on disk) until it goes through or an operator acts;
// the lag measure below shows it.
//
// Two-phase semantics (a lease per batch, as outbox.TwoPhase) have no
// place here: no transaction spans a publish in the first place, and the
// slot's single reader replaces the lease. The confirmed position is the
// whole of the relay's state, kept by PostgreSQL.
//
// # Encoding
//
// A message's prefix is the relay group's (Config.Prefix, PrefixDefault
// "idem.outbox"); its content is version 1 of a small binary format, the
// version byte first (see encoding.go): event id, event type, topic,
// aggregate type, aggregate id, headers, payload. A relay refuses a
// message of its prefix that it cannot decode (ErrBadMessage) and does not
// skip it.
//
// # Table outbox or WAL outbox
//
// Enqueue cost. The table outbox inserts a row and upserts the aggregate's
// counter row in the business transaction, then updates (and later
// deletes) the row; the WAL outbox writes one WAL record per event and
// nothing else: no index, no dead tuples, no vacuum, no lock. `idem bench
// enqueue` measures both against a plain transaction in the same run.
//
// Relay throughput. The table relay claims, publishes and marks rows, a
// few statements per batch; the WAL relay decodes a stream that
// PostgreSQL pushes and confirms a position, with one read-only
// statement per publish attempt (the visibility look). `idem
// bench wal` reports wal-floor (decoded and confirmed, no publish) and wal
// (commit to Kafka ack) beside the table relay's at-least-once.
//
// Ordering. Table: per aggregate, by a gapless sequence (aggregate-seq),
// and enqueues for one aggregate serialize on its counter row. WAL: commit
// order for the whole database; no counter, no sequence.
//
// Parallelism. Several table relays share the work (SKIP LOCKED). A slot
// has one reader: the WAL relay is one stream per relay group, however
// many standbys wait; split groups by prefix and slot when one stream is
// not enough.
//
// Operability: what the WAL outbox adds to run.
//
//   - The slot retains WAL while its relay is down or stuck: every byte
//     written to the database since the confirmed position, not only the
//     events. That can fill the disk. Set max_slot_wal_keep_size to bound
//     it: past it the server invalidates the slot (wal_status "lost") and
//     the events in the dropped WAL are gone, the one way this mode loses
//     events; without it (the default, -1) the disk is the bound. Watch
//     the lag: the RelaySlotLag hook event (bytes and the age of the
//     oldest undelivered event, a warning on the Logger past LagWarnBytes
//     or LagWarnAge), and `idem outbox status --slot NAME` (bytes,
//     retained bytes, flush lag, wal_status, safe_wal_size; a warning past
//     --lag-warn-bytes). A slot that is no longer used must be dropped
//     (pg_drop_replication_slot), or it retains WAL for ever.
//   - A slot also holds back the catalog xmin: vacuum cannot remove
//     system-catalog rows newer than it while the relay is down.
//   - Failover: on PostgreSQL 15 and 16 logical slots live on the
//     primary only; after a failover to a physical standby the slot does
//     not exist there. Start creates a new one at the new primary's
//     current position, so the events committed on the old primary and
//     not yet confirmed are not delivered: reconcile them (or re-emit from
//     the business tables) after a failover. PostgreSQL 17 can synchronize
//     slots to a standby (failover slots: the slot created with
//     failover = true, sync_replication_slots = on and
//     synchronized_standby_slots on the standby side); this package does
//     not create its slot with the failover option yet, so create the slot
//     yourself that way before the first Start on 17.
//   - Creating a slot waits for the transactions running at that moment
//     to end, and a message written before the slot existed is never
//     decoded: start the relay once before the first EnqueueTx.
//   - The table outbox needs nothing of the server beyond tables; the
//     WAL outbox needs wal_level = logical (ErrNotLogical otherwise, a
//     server restart to change), a role with the REPLICATION attribute (or
//     the managed service's replication role), CREATE on the database for
//     the publication, and a free slot and WAL sender (max_replication_slots,
//     max_wal_senders).
//
// Managed PostgreSQL: the setting that turns on logical decoding.
//
//   - Amazon RDS and Aurora PostgreSQL: rds.logical_replication = 1 in the
//     parameter group (a reboot), and the rds_replication role.
//   - Google Cloud SQL for PostgreSQL: the cloudsql.logical_decoding flag
//     on, and a user with the REPLICATION attribute.
//   - Azure Database for PostgreSQL flexible server: wal_level = LOGICAL
//     (server parameter, a restart), and the user granted REPLICATION.
//   - Most others (Supabase, Neon, Crunchy Bridge, Aiven) expose
//     wal_level = logical as a setting or have it on; check that slots
//     survive the provider's failover, which on PostgreSQL 15 and 16 they
//     generally do not.
package wal
