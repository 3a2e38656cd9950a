package main

import (
	"context"
	"database/sql"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemkit/idem/examples/orm/internal/ormtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestGORM(t *testing.T) {
	ormtest.Run(t, func(t *testing.T, sdb *sql.DB) ormtest.Impl {
		db, err := open(sdb)
		if err != nil {
			t.Fatal(err)
		}
		return ormtest.Impl{
			Place: func(ctx context.Context, id string, total int64, fail bool) error {
				return place(ctx, db, Order{ID: id, Total: total}, fail)
			},
			Ship:   ship(db),
			Orders: orders(db),
		}
	})
}
