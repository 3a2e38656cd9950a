package sqlpgx

import (
	"database/sql"
	"reflect"
	"strings"
)

// OnLibPQ reports whether tx runs on lib/pq's driver (github.com/lib/pq),
// the driver for which a statement with no parameters saves a round trip
// (see DB.Inline), and for which alone that pays: pgx's stdlib driver
// already sends a cached prepared statement in one, and sending it inlined
// instead costs the server a parse and a plan per call (measured: it
// halves sql-enqueue-1 with one client, see docs/benchmarks.md).
//
// database/sql does not say which driver a *sql.Tx is on; the dynamic
// type of its driver transaction (the unexported field txi, lib/pq's
// *pq.conn) does, and reflect reads a type without touching the value. A
// database/sql whose Tx has no such field makes this false: the statement
// then goes with parameters, as on any other driver (slower on lib/pq,
// never wrong); TestEnqueueSQLTxRoundTrips fails then.
func OnLibPQ(tx *sql.Tx) bool {
	if tx == nil {
		return false
	}
	f := reflect.ValueOf(tx).Elem().FieldByName("txi")
	if !f.IsValid() || f.Kind() != reflect.Interface || f.IsNil() {
		return false
	}
	t := f.Elem().Type()
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	p := t.PkgPath()
	return p == "github.com/lib/pq" || strings.HasPrefix(p, "github.com/lib/pq/")
}
