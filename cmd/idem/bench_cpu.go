package main

import (
	"context"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// cpuMeter reads the CPU time (user and system) of this process and of a
// pool's PostgreSQL backends from /proc, so that a bench can say where a
// variant's time goes: on a machine whose cores are all busy, throughput
// ratios follow CPU per operation. It reads zero where /proc is missing
// (not Linux) and for the backends when PostgreSQL runs on another host
// or as a user whose /proc entries are hidden.
type cpuMeter struct {
	backends []int
	pool     *pgxpool.Pool
}

// newCPUMeter finds the backends of pool by its application_name (set by
// the caller to one unique to the run). An error leaves the backends out.
func newCPUMeter(ctx context.Context, pool *pgxpool.Pool, appName string) *cpuMeter {
	m := &cpuMeter{pool: pool}
	rows, err := pool.Query(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, appName)
	if err != nil {
		return m
	}
	defer rows.Close()
	for rows.Next() {
		var pid int
		if rows.Scan(&pid) == nil {
			m.backends = append(m.backends, pid)
		}
	}
	return m
}

// read returns the CPU time so far of this process and the sum over the
// backends, and the pool's acquires so far and those of them that waited
// for a connection (none idle).
func (m *cpuMeter) read() (self, backends time.Duration, acquires, waited int64) {
	self = procCPU("/proc/self/stat")
	for _, pid := range m.backends {
		backends += procCPU("/proc/" + strconv.Itoa(pid) + "/stat")
	}
	if m.pool != nil {
		st := m.pool.Stat()
		acquires, waited = st.AcquireCount(), st.EmptyAcquireCount()
	}
	return self, backends, acquires, waited
}

// procCPU is utime + stime of a /proc/<pid>/stat file, whose clock ticks
// are USER_HZ, 1/100 s on Linux; zero when it cannot be read.
func procCPU(path string) time.Duration {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	s := string(b)
	// The command name, in parentheses, may hold spaces: fields count
	// from after its closing one (field 3, state, is the first).
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 > len(s) {
		return 0
	}
	f := strings.Fields(s[i+2:])
	if len(f) < 13 {
		return 0
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond
}
