package idempotency_test

import (
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/faultproxy"
	"github.com/idemkit/idem/internal/testdb"
)

// partition is a network between a pool and PostgreSQL that can be cut
// off: while partitioned, no byte moves in either direction and every
// connection stays open, as over a dropped route that TCP has not noticed
// (no RST, no FIN); new connections hang too.
type partition struct{ p *faultproxy.Proxy }

// Partition stops every byte until Heal.
func (n partition) Partition() { n.p.Stall(time.Hour) }

// Heal lets the bytes through again.
func (n partition) Heal() { n.p.Resume() }

// poolThrough returns a pool to db's schema whose connections go through
// a fault proxy.
func poolThrough(t *testing.T, db *testdb.DB) (*pgxpool.Pool, partition) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.Listen("127.0.0.1:0", net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	host, port, err := net.SplitHostPort(p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(port)
	cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Fallbacks = host, uint16(n), nil
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, partition{p}
}
