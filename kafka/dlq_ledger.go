package kafka

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem/kafka/internal/dbsqlc"
)

// ErrAuditRequired: a Redrive with a DB but without an Actor or a Reason.
var ErrAuditRequired = errors.New("kafka: a redrive needs an actor and a reason")

// RedriveDB is the database of the redrive ledger (a *pgxpool.Pool): the
// idem_admin_audit and idem_dlq_redrive tables of package migrate.
type RedriveDB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// ledger is one redrive's transaction: it holds the dead-letter topic's
// advisory lock from begin to commit, so a second redrive of the same
// topic waits and then sees what this one moved.
type ledger struct {
	tx      pgx.Tx
	q       *dbsqlc.Queries
	auditID int64
	done    map[string]dbsqlc.RedrivenRecordsRow // by dead-letter record ID
}

// beginLedger opens the ledger of a redrive of o.From: the lock (not for a
// dry run), the audit row, and the records redriven before.
func beginLedger(ctx context.Context, o RedriveOptions) (*ledger, error) {
	tx, err := o.DB.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("kafka: redrive ledger: %w", err)
	}
	l := &ledger{tx: tx, q: dbsqlc.New(tx), done: map[string]dbsqlc.RedrivenRecordsRow{}}
	fail := func(err error) (*ledger, error) {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		if pe, ok := errors.AsType[*pgconn.PgError](err); ok && pe.Code == "42P01" { // undefined_table
			return nil, fmt.Errorf("kafka: redrive ledger: %w (apply idem's migrations: idem migrate up)", err)
		}
		return nil, fmt.Errorf("kafka: redrive ledger: %w", err)
	}
	if !o.DryRun {
		// Step 1 of the serialization: wait out any other redrive of this
		// topic (it commits its rows, or rolls back, before releasing).
		if err := l.q.LockRedrive(ctx, o.From); err != nil {
			return fail(err)
		}
		if l.auditID, err = l.q.InsertRedriveAudit(ctx, dbsqlc.InsertRedriveAuditParams{Subject: o.From, Actor: o.Actor, Reason: o.Reason}); err != nil {
			return fail(err)
		}
	}
	// Step 2: read, under the lock, what earlier redrives moved.
	rows, err := l.q.RedrivenRecords(ctx, o.From)
	if err != nil {
		return fail(err)
	}
	for _, r := range rows {
		l.done[fmt.Sprintf("%s/%d/%d", o.From, r.DlqPartition, r.DlqOffset)] = r
	}
	return l, nil
}

// earlier returns the ledger's record of an earlier redrive of rec to to.
func (l *ledger) earlier(rec *DeadLetterRecord, to string) (dbsqlc.RedrivenRecordsRow, bool) {
	if l == nil {
		return dbsqlc.RedrivenRecordsRow{}, false
	}
	r, ok := l.done[rec.ID()]
	return r, ok && r.Target == to
}

// record notes, in the transaction, that rec was produced to to.
func (l *ledger) record(ctx context.Context, rec *DeadLetterRecord, to string) error {
	if l == nil || l.auditID == 0 {
		return nil
	}
	err := l.q.RecordRedrive(ctx, dbsqlc.RecordRedriveParams{DlqTopic: rec.Topic, DlqPartition: rec.Partition,
		DlqOffset: rec.Offset, Target: to, AuditID: l.auditID})
	if err != nil {
		return fmt.Errorf("kafka: redrive ledger: %w", err)
	}
	return nil
}

// auditDetail is the detail column of a redrive's audit row.
type auditDetail struct {
	From            string           `json:"from"`
	FilterError     string           `json:"filter_error,omitempty"`
	Forced          bool             `json:"forced,omitempty"`
	Moved           []auditedRecord  `json:"moved"`
	AlreadyRedriven int              `json:"already_redriven"`
	Refused         []RedriveRefusal `json:"refused,omitempty"`
	Error           string           `json:"error,omitempty"`
}

type auditedRecord struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
	To        string `json:"to"`
	EventID   string `json:"event_id,omitempty"`
}

// commit writes the audit row's detail and commits. runErr is the
// redrive's own error, recorded in the detail.
func (l *ledger) commit(ctx context.Context, o RedriveOptions, rep *RedriveReport, moved []auditedRecord, runErr error) error {
	if l == nil {
		return nil
	}
	ctx = context.WithoutCancel(ctx) // what was produced must be recorded
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if l.auditID == 0 { // dry run
		return l.tx.Rollback(ctx)
	}
	d := auditDetail{From: o.From, FilterError: o.FilterError, Forced: o.Force, Moved: moved,
		AlreadyRedriven: len(rep.AlreadyRedriven), Refused: rep.Refused}
	if d.Moved == nil {
		d.Moved = []auditedRecord{}
	}
	if runErr != nil {
		d.Error = strings.ToValidUTF8(runErr.Error(), "?")
	}
	b, err := json.Marshal(d)
	if err == nil {
		err = l.q.SetRedriveAuditDetail(ctx, dbsqlc.SetRedriveAuditDetailParams{Detail: b, ID: l.auditID})
	}
	if err == nil {
		err = l.tx.Commit(ctx)
	}
	if err != nil {
		_ = l.tx.Rollback(ctx)
		// The produced records carry their dlq-redrive-id: the next
		// redrive finds them on the destination and skips them.
		return fmt.Errorf("kafka: redrive ledger: %d records were produced but not recorded in the audit trail: %w", len(moved), err)
	}
	rep.AuditID = l.auditID
	return nil
}

func (l *ledger) rollback(ctx context.Context) {
	if l != nil {
		_ = l.tx.Rollback(context.WithoutCancel(ctx))
	}
}
