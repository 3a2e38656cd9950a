package wal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/backoff"
	"github.com/idemkit/idem/internal/startstop"
	"github.com/idemkit/idem/outbox"
)

// Relay publishes the events that EnqueueTx wrote to the WAL: it reads
// them from a logical replication slot (pgoutput, messages only), hands
// them to a Publisher in batches, and confirms a position to the slot
// only once everything before it was delivered. See the package doc for
// the guarantees.
//
// A Relay is a lifecycle.Component and a lifecycle.HardStopper: Start,
// Stop (soft) and HardStop, each safe to call twice, concurrently and
// before Start.
type Relay struct {
	connCfg *pgconn.Config
	// plainCfg is connCfg without replication: the connection that
	// checks that a decoded transaction is visible (visible.go).
	plainCfg   *pgconn.Config
	connString string
	pub        outbox.Publisher
	check      outbox.Checker
	cfg        Config
	log        *slog.Logger
	backoff    backoff.Policy

	svc startstop.Service

	// slot is the slot's name: cfg.Slot, filled with the default by
	// NewRelay and switched to the legacy default by setup when that is
	// the one this database has (see Config.Slot).
	slot atomic.Pointer[string]
	// defaultSlot: cfg.Slot was empty.
	defaultSlot bool

	// mu guards the progress that the reader, the publisher and the lag
	// measure share.
	mu   sync.Mutex
	prog *progress
}

// NewRelay returns a relay that reads the slot on the server connString
// names (a pgx connection string or URL: the relay adds
// replication=database) and publishes through pub. A nil cfg means all
// defaults. Nothing is connected before Start.
func NewRelay(connString string, pub outbox.Publisher, cfg *Config) (*Relay, error) {
	if pub == nil {
		return nil, fmt.Errorf("%w: publisher is nil", ErrInvalidConfig)
	}
	cc, err := pgconn.ParseConfig(connString)
	if err != nil {
		return nil, fmt.Errorf("%w: connection string: %v", ErrInvalidConfig, errors.Unwrap(err))
	}
	c := cfg.withDefaults()
	// PostgreSQL's rule: without a database, the one named like the user.
	database := cc.Database
	if database == "" {
		database = cc.User
	}
	defaultSlot := c.Slot == ""
	if defaultSlot {
		c.Slot = DefaultSlot(database)
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	plain, err := pgconn.ParseConfig(connString)
	if err != nil {
		return nil, fmt.Errorf("%w: connection string: %v", ErrInvalidConfig, errors.Unwrap(err))
	}
	cc.RuntimeParams["replication"] = "database"
	cc.RuntimeParams["application_name"] = "idem-wal-relay " + c.Owner
	plain.RuntimeParams["application_name"] = "idem-wal-relay " + c.Owner
	r := &Relay{
		connCfg: cc, plainCfg: plain, connString: connString, pub: pub, cfg: c, log: c.Logger,
		backoff: backoff.Policy{Min: c.BackoffMin, Max: c.BackoffMax}, defaultSlot: defaultSlot,
	}
	r.slot.Store(&c.Slot)
	r.check, _ = pub.(outbox.Checker)
	return r, nil
}

// Start connects, checks that the server decodes logical WAL
// (ErrNotLogical otherwise), creates the publication and the slot when
// they are missing (a slot of that name that belongs to another database
// or plugin: ErrSlotMismatch), and launches the relay; the relay then
// takes the slot or, while another relay reads it, waits as a standby.
// ctx bounds that first connection and lends its values to the run;
// cancelling it afterwards changes nothing. Start on a running relay is a no-op; Start
// after a stop starts a fresh run.
//
// Events enqueued before the slot first existed are never decoded: start
// a relay once before the first EnqueueTx of a new database.
func (r *Relay) Start(ctx context.Context) error {
	return r.svc.Start(ctx, func(runCtx context.Context, g *startstop.Group) error {
		conn, err := r.connect(ctx)
		if err != nil {
			return err
		}
		g.Go(runCtx, func(ctx context.Context) { r.run(ctx, conn) })
		if r.cfg.LagInterval > 0 {
			g.Go(runCtx, r.lagLoop)
		}
		return nil
	})
}

// Stop is the soft stop: the relay stops reading, the batch in hand is
// published (one attempt, bounded by BatchTimeout), the position it
// reached is confirmed to the slot, and the connection is closed. The
// position can be confirmed only at a transaction's end: when the
// delivered events stop inside a transaction (one larger than
// BatchSize), the rest of that transaction, and nothing after it, is
// delivered first, retried on the work context until it goes through or
// HardStop abandons it (then the next reader sends its delivered part
// again). Stop returns when that is done, or with ctx's error when ctx
// ends first (the relay goes on until HardStop). Events read and not yet
// published are not lost: the slot sends them again to the next reader.
func (r *Relay) Stop(ctx context.Context) error { return r.svc.Stop(ctx) }

// HardStop is the soft stop plus the cancellation of the publish in hand.
// What it had delivered without being confirmed is sent again (at least
// once).
func (r *Relay) HardStop(ctx context.Context) error { return r.svc.HardStop(ctx) }

// Slot is the name of the replication slot the relay reads: Config.Slot,
// or its default (see Config.Slot), which Start settles once it has
// looked at the server.
func (r *Relay) Slot() string { return r.slotName() }

func (r *Relay) slotName() string { return *r.slot.Load() }

func (r *Relay) emit(ctx context.Context, e outbox.RelayEvent) context.Context {
	if r.cfg.Hook == nil {
		return ctx
	}
	e.Mode, e.Owner, e.Slot = outbox.WAL, r.cfg.Owner, r.slotName()
	return idem.CallHook(r.cfg.Hook, ctx, e)
}

// CreateSlot makes sure the slot and the publication of cfg exist on the
// server connString names, creating them if missing, as Relay.Start does;
// ErrNotLogical when the server does not decode logical WAL. A program
// whose instances enqueue without all running a relay calls it at start,
// before the first EnqueueTx: a message written before the slot existed
// is never decoded. ctx bounds the call.
func CreateSlot(ctx context.Context, connString string, cfg *Config) error {
	r, err := NewRelay(connString, nopPublisher{}, cfg)
	if err != nil {
		return err
	}
	conn, err := r.connect(ctx)
	if err != nil {
		return err
	}
	return conn.Close(ctx)
}

type nopPublisher struct{}

func (nopPublisher) Publish(context.Context, []outbox.Event) error { return nil }

// connect opens a replication connection and makes sure the publication
// and the slot exist.
func (r *Relay) connect(ctx context.Context) (*pgconn.PgConn, error) {
	conn, err := pgconn.ConnectConfig(ctx, r.connCfg)
	if err != nil {
		return nil, fmt.Errorf("outbox/wal: connect: %w", err)
	}
	if err := r.setup(ctx, conn); err != nil {
		_ = conn.Close(context.Background())
		return nil, err
	}
	return conn, nil
}

func (r *Relay) setup(ctx context.Context, conn *pgconn.PgConn) error {
	res, err := conn.Exec(ctx, "SHOW wal_level").ReadAll()
	if err != nil {
		return fmt.Errorf("outbox/wal: wal_level: %w", err)
	}
	if len(res) != 1 || len(res[0].Rows) != 1 || string(res[0].Rows[0][0]) != "logical" {
		level := "?"
		if len(res) == 1 && len(res[0].Rows) == 1 {
			level = string(res[0].Rows[0][0])
		}
		return fmt.Errorf("%w (it is %s)", ErrNotLogical, level)
	}
	// Names are checked identifiers (validate): no quoting needed.
	res, err = conn.Exec(ctx, "SELECT 1 FROM pg_publication WHERE pubname = '"+r.cfg.Publication+"'").ReadAll()
	if err != nil {
		return fmt.Errorf("outbox/wal: publication: %w", err)
	}
	if len(res[0].Rows) == 0 {
		// A publication for no table: pgoutput needs one named, and the
		// relay reads only messages. A concurrent Start may win the race.
		if _, err := conn.Exec(ctx, "CREATE PUBLICATION "+r.cfg.Publication).ReadAll(); err != nil && !isCode(err, "42710") {
			return fmt.Errorf("outbox/wal: create publication %s: %w", r.cfg.Publication, err)
		}
	}
	slot := r.slotName()
	found, err := r.checkSlot(ctx, conn, slot)
	if err != nil {
		return err
	}
	if !found && r.defaultSlot && slot != SlotDefault {
		// An upgrade from the default without the database: keep reading
		// the old slot when this database has it, or its undelivered
		// events would never be published.
		legacy, err := r.checkSlot(ctx, conn, SlotDefault)
		if err == nil && legacy {
			r.log.Info("outbox/wal relay: using the slot of the former default name; set Config.Slot to keep it, or drain and drop it to move to the new default",
				"slot", SlotDefault, "new_default", slot)
			r.slot.Store(new(SlotDefault))
			return nil
		}
	}
	if !found {
		// Creating a logical slot waits for the transactions running at
		// that moment to end (it needs a consistent snapshot): say so, as
		// one long transaction anywhere in the cluster stalls the start.
		r.log.Info("creating replication slot: waits for the transactions running now to end", "slot", slot)
		_, err := pglogrepl.CreateReplicationSlot(ctx, conn, slot, "pgoutput", pglogrepl.CreateReplicationSlotOptions{})
		if err != nil && !isCode(err, "42710") {
			return fmt.Errorf("outbox/wal: create slot %s: %w", slot, err)
		}
		if err != nil { // created meanwhile, maybe from another database: look again
			if _, err := r.checkSlot(ctx, conn, slot); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkSlot reports whether slot exists, and ErrSlotMismatch when it does
// but is not a pgoutput slot of the connection's database.
func (r *Relay) checkSlot(ctx context.Context, conn *pgconn.PgConn, slot string) (bool, error) {
	// Names are checked identifiers (validate): no quoting needed.
	res, err := conn.Exec(ctx, `SELECT current_database(), s.database, s.plugin, s.slot_type
		FROM (SELECT 1) AS one LEFT JOIN pg_replication_slots s ON s.slot_name = '`+slot+`'`).ReadAll()
	if err != nil {
		return false, fmt.Errorf("outbox/wal: slot: %w", err)
	}
	if len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) != 4 {
		return false, fmt.Errorf("outbox/wal: slot %s: unexpected answer from pg_replication_slots", slot)
	}
	row := res[0].Rows[0]
	ours, db, plugin, typ := string(row[0]), row[1], row[2], string(row[3])
	if typ == "" {
		return false, nil
	}
	if typ != "logical" || string(db) != ours || string(plugin) != "pgoutput" {
		orNone := func(b []byte) string {
			if b == nil {
				return "(none)"
			}
			return string(b)
		}
		return true, fmt.Errorf("%w: slot %s is a %s slot of database %s with plugin %s; this relay's database is %s: give it a slot of its own (Config.Slot)",
			ErrSlotMismatch, slot, typ, orNone(db), orNone(plugin), ours)
	}
	return true, nil
}

func isCode(err error, code string) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == code
}

// run reads the slot until ctx (the run's) ends, reconnecting after a
// failure and waiting as a standby while another relay reads it.
func (r *Relay) run(ctx context.Context, conn *pgconn.PgConn) {
	failures := 0
	busy := false
	for {
		var err error
		if conn == nil {
			conn, err = r.connect(ctx)
		}
		if err == nil {
			var acquired bool
			acquired, err = r.stream(ctx, conn)
			closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			_ = conn.Close(closeCtx)
			cancel()
			conn = nil
			if acquired {
				failures, busy = 0, false
			}
		}
		if ctx.Err() != nil {
			return
		}
		var wait time.Duration
		switch {
		case isCode(err, "55006"): // object_in_use: another relay reads the slot
			if !busy {
				busy = true
				r.emit(ctx, outbox.RelayEvent{Kind: outbox.RelaySlotBusy, Err: err})
			}
			wait = r.cfg.AcquireInterval
		default:
			failures++
			r.log.WarnContext(ctx, "outbox/wal relay stream", "error", err, "slot", r.slotName(), "owner", r.cfg.Owner)
			r.emit(ctx, outbox.RelayEvent{Kind: outbox.RelayStreamFailed, Err: err})
			wait = r.backoff.Delay(failures)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// pending is one decoded event waiting for its publish.
type pending struct {
	ev outbox.Event
	// end is the end of its transaction's commit record: the position to
	// confirm once it and every event before it are delivered.
	end pglogrepl.LSN
	// last marks the last event of its transaction.
	last bool
	// xid is its transaction's id (32 bits, as pgoutput's Begin gives
	// it): the publisher waits until the transaction is visible.
	xid uint32
}

// progress is what one stream's reader and publisher share, under
// Relay.mu.
type progress struct {
	queue []pending // decoded, not yet taken by the publisher
	// inflight is the batch the publisher holds, with which of its events
	// are delivered.
	inflight  []pending
	delivered []bool
	// acked: everything before it is delivered (or not an event).
	acked pglogrepl.LSN
	// open is the end of the transaction that the delivered events stop
	// inside, 0 when they end at a transaction's end: what a soft stop
	// finishes before it confirms (finishTx).
	open pglogrepl.LSN
	// broken: the reader gave up on the stream; nothing delivered now
	// could be confirmed, so a stop does not finish a transaction.
	broken bool
	// seen: everything before it was received and, when queue and
	// inflight are empty, delivered: the reader sets it only with no
	// transaction open and nothing queued.
	seen  pglogrepl.LSN
	kick  chan struct{} // the reader queued events
	space chan struct{} // the publisher took events
	// serverEnd is the server's WAL end from the last message.
	serverEnd pglogrepl.LSN
	// vis is the publisher's own: no lock.
	vis *visibility
}

// confirmable is the position the relay may confirm: the last delivered
// transaction's end, or what the reader saw when nothing is in flight.
func (p *progress) confirmable() pglogrepl.LSN {
	if len(p.queue) == 0 && len(p.inflight) == 0 && p.seen > p.acked {
		return p.seen
	}
	return p.acked
}

// oldest is the commit time of the oldest event not yet delivered.
func (p *progress) oldest() time.Time {
	for i := range p.inflight {
		if !p.delivered[i] {
			return p.inflight[i].ev.CreatedAt
		}
	}
	if len(p.queue) > 0 {
		return p.queue[0].ev.CreatedAt
	}
	return time.Time{}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// stream reads the slot on conn until ctx ends or the connection fails.
// acquired reports whether it became the slot's reader.
func (r *Relay) stream(ctx context.Context, conn *pgconn.PgConn) (acquired bool, err error) {
	err = pglogrepl.StartReplication(ctx, conn, r.slotName(), 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + r.cfg.Publication + "'", "messages 'true'"},
	})
	if err != nil {
		return false, err
	}
	r.emit(ctx, outbox.RelayEvent{Kind: outbox.RelaySlotAcquired})
	p := &progress{kick: make(chan struct{}, 1), space: make(chan struct{}, 1), vis: &visibility{cfg: r.plainCfg}}
	r.mu.Lock()
	r.prog = p
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.prog = nil
		r.mu.Unlock()
	}()

	// The publisher runs beside the reader so that reading (and answering
	// keepalives) goes on during a publish. It stops with ctx, after the
	// batch in hand and, at a soft stop, the rest of the transaction that
	// batch stops inside (finishTx), or when the reader gives up (stop).
	pubCtx, stopPub := context.WithCancel(ctx)
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		defer p.vis.close()
		r.publishLoop(pubCtx, ctx, p)
	}()

	err = r.read(ctx, conn, p)
	if err != nil {
		r.mu.Lock()
		p.broken = true
		r.mu.Unlock()
	}
	stopPub()
	if err == nil && !conn.IsClosed() {
		// A soft stop: the reader has returned, the publisher may be
		// finishing a transaction. Keep reporting the position meanwhile,
		// so that the server (wal_sender_timeout) keeps the stream and
		// what is delivered is confirmed as it goes.
		t := time.NewTicker(r.cfg.StatusInterval)
	wait:
		for {
			select {
			case <-pubDone:
				break wait
			case <-t.C:
				if serr := r.sendStatus(context.WithoutCancel(ctx), conn, p, false); serr != nil {
					break wait
				}
			}
		}
		t.Stop()
	}
	<-pubDone
	// Confirm what the publisher finished, and end the stream cleanly so
	// that the server has processed the confirmation before it releases
	// the slot (a later reader then resumes right after it).
	if conn.IsClosed() {
		return true, err
	}
	endCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = conn.Conn().SetDeadline(time.Now().Add(5 * time.Second)) // CopyDone reads without a context
	if serr := r.sendStatus(endCtx, conn, p, false); serr == nil {
		_, _ = pglogrepl.SendStandbyCopyDone(endCtx, conn)
	}
	return true, err
}

// read is the stream's reader: it decodes the slot's messages, queues the
// events of committed transactions, and reports the confirmable position.
func (r *Relay) read(ctx context.Context, conn *pgconn.PgConn, p *progress) error {
	maxQueued := 4 * r.cfg.BatchSize
	var (
		tx           []pending // the open transaction's events
		inTx         bool
		txTime       time.Time
		txXid        uint32
		lastStatus   time.Time
		readDeadline time.Time
	)
	// Reads wait on the socket's deadline, set once per status interval,
	// rather than on a context per message (a timer each, a large share
	// of the reader's time at a hundred thousand messages a second). The
	// end of ctx cuts the wait short.
	stopWatch := context.AfterFunc(ctx, func() { _ = conn.Conn().SetReadDeadline(time.Now()) })
	defer stopWatch()
	for {
		if ctx.Err() != nil {
			return nil
		}
		now := time.Now()
		if now.Sub(lastStatus) >= r.cfg.StatusInterval {
			if err := r.sendStatus(ctx, conn, p, false); err != nil {
				return err
			}
			lastStatus = now
		}
		// Back-pressure: with enough queued, wait for the publisher
		// instead of reading, still reporting on time.
		r.mu.Lock()
		full := len(p.queue) >= maxQueued
		r.mu.Unlock()
		if full {
			t := time.NewTimer(r.cfg.StatusInterval)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-p.space:
			case <-t.C:
			}
			t.Stop()
			continue
		}
		if d := lastStatus.Add(r.cfg.StatusInterval); !d.Equal(readDeadline) {
			readDeadline = d
			if err := conn.Conn().SetReadDeadline(d); err != nil {
				return fmt.Errorf("outbox/wal: read deadline: %w", err)
			}
			if ctx.Err() != nil { // the stop may have come before the deadline was set
				return nil
			}
		}
		msg, err := conn.ReceiveMessage(context.Background())
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if pgconn.Timeout(err) {
				continue
			}
			return fmt.Errorf("outbox/wal: receive: %w", err)
		}
		var data []byte
		switch m := msg.(type) {
		case *pgproto3.CopyData:
			data = m.Data
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("outbox/wal: stream: %w", pgconn.ErrorResponseToPgError(m))
		case *pgproto3.CopyDone:
			return errors.New("outbox/wal: the server ended the stream")
		default:
			continue
		}
		if len(data) == 0 {
			continue
		}
		switch data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
			if err != nil {
				return fmt.Errorf("outbox/wal: keepalive: %w", err)
			}
			r.mu.Lock()
			p.serverEnd = ka.ServerWALEnd
			// Everything before the keepalive's position was sent before
			// it: with no transaction open and nothing queued, that
			// position holds no event of ours left to deliver.
			if !inTx && len(p.queue) == 0 && ka.ServerWALEnd > p.seen {
				p.seen = ka.ServerWALEnd
			}
			r.mu.Unlock()
			if ka.ReplyRequested {
				if err := r.sendStatus(ctx, conn, p, false); err != nil {
					return err
				}
				lastStatus = time.Now()
			}
		case pglogrepl.XLogDataByteID:
			xld, err := pglogrepl.ParseXLogData(data[1:])
			if err != nil {
				return fmt.Errorf("outbox/wal: xlogdata: %w", err)
			}
			lm, err := pglogrepl.Parse(xld.WALData)
			if err != nil {
				// A kind this relay does not know (pgoutput of a later
				// server): not one of ours, which are messages.
				continue
			}
			switch m := lm.(type) {
			case *pglogrepl.BeginMessage:
				inTx, txTime, txXid, tx = true, m.CommitTime, m.Xid, tx[:0]
			case *pglogrepl.LogicalDecodingMessage:
				if m.Prefix != r.cfg.Prefix || !m.Transactional {
					continue
				}
				msg, err := decode(bytes.Clone(m.Content))
				if err != nil {
					return fmt.Errorf("%w at %s", err, m.LSN)
				}
				tx = append(tx, pending{ev: outbox.Event{Message: msg, ID: int64(m.LSN), CreatedAt: txTime}, xid: txXid})
			case *pglogrepl.CommitMessage:
				inTx = false
				r.mu.Lock()
				p.serverEnd = max(p.serverEnd, xld.ServerWALEnd)
				if len(tx) > 0 {
					for i := range tx {
						tx[i].end = m.TransactionEndLSN
					}
					tx[len(tx)-1].last = true
					p.queue = append(p.queue, tx...)
					tx = tx[:0]
					r.mu.Unlock()
					signal(p.kick)
				} else {
					if len(p.queue) == 0 && m.TransactionEndLSN > p.seen {
						p.seen = m.TransactionEndLSN
					}
					r.mu.Unlock()
				}
			}
		}
	}
}

func (r *Relay) sendStatus(ctx context.Context, conn *pgconn.PgConn, p *progress, reply bool) error {
	r.mu.Lock()
	pos := p.confirmable()
	r.mu.Unlock()
	err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: pos, WALFlushPosition: pos, WALApplyPosition: pos,
		ClientTime: time.Now(), ReplyRequested: reply,
	})
	if err != nil {
		return fmt.Errorf("outbox/wal: status update: %w", err)
	}
	return nil
}
