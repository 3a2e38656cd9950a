// Package pgtemp starts a throwaway PostgreSQL cluster from the local
// PostgreSQL binaries: a fresh data directory in a temporary directory, a free
// port on 127.0.0.1, stopped and deleted on Close.
//
// It is not open to other local users: every connection, over TCP or the
// Unix socket, authenticates with scram-sha-256 as the superuser
// "postgres" with a random 256-bit password made for the cluster, which
// only Cluster.URL carries (initdb reads it from a 0600 file deleted once
// read). The temporary directory, which holds the Unix socket, and the
// data directory are 0700. The server listens on 127.0.0.1 only. A
// superuser can run programs as the cluster's OS user, so trust
// authentication over TCP would give that to anyone on the machine.
//
// It is the last fallback of idem's embedded defaults (`billing demo`): used
// when DATABASE_URL is empty and no server answers on 127.0.0.1:5432.
//
// PostgreSQL refuses to run as root. When the calling process is root, the
// data directory is given to the "postgres" user (or Config.User) and initdb
// and postgres run under that user's uid and gid.
//
// Restart stops the server in one of pg_ctl's modes and starts it again on
// the same port and data: StopImmediate is a crash of the database server
// (every connection dropped mid-statement, crash recovery at the next
// start), which the chaos harness of examples/billing injects during its
// load. Nothing committed is lost by it: synchronous_commit stays on.
//
// What it does not guarantee: durability across a machine crash. The
// cluster runs with fsync and full_page_writes off, because it lives only as
// long as the process that started it; a machine crash loses it, which is
// its purpose.
package pgtemp
