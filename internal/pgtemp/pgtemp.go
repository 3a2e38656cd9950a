package pgtemp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Sentinel errors.
var (
	// ErrNoBinaries means initdb and postgres were not found.
	ErrNoBinaries = errors.New("pgtemp: no PostgreSQL binaries (initdb, postgres) found")
	// ErrNoUser means the process is root and the user to run PostgreSQL as
	// does not exist.
	ErrNoUser = errors.New("pgtemp: running as root and the PostgreSQL user does not exist")
	// ErrStart means the server did not come up.
	ErrStart = errors.New("pgtemp: server did not start")
)

// Defaults.
const (
	// UserDefault is the user PostgreSQL runs as when the caller is root.
	UserDefault = "postgres"
	// StartTimeoutDefault bounds initdb plus server start.
	StartTimeoutDefault = 60 * time.Second
)

// Config configures Start. A nil Config means all defaults.
type Config struct {
	// BinDir holds initdb and postgres. Defaults to the newest
	// /usr/lib/postgresql/*/bin (Debian, Ubuntu), else the directory of
	// initdb on PATH.
	BinDir string
	// User runs initdb and postgres when the caller is root. Defaults to
	// UserDefault ("postgres"). Ignored when the caller is not root.
	User string
	// Log receives the server's output. Defaults to discarding it.
	Log io.Writer
	// StartTimeout bounds initdb plus server start. Defaults to
	// StartTimeoutDefault (60s).
	StartTimeout time.Duration
	// Settings are extra server settings, "name=value" each, passed to
	// postgres as -c options (wal_level=logical, say). Defaults to none.
	Settings []string
}

// Cluster is a running throwaway server.
type Cluster struct {
	// URL connects as the superuser "postgres" to database "postgres"
	// over TCP, with the cluster's password: print it through cli.Redact,
	// and hand it to a child process in its environment, never on its
	// command line (which every local user can read).
	URL string
	// Dir is the temporary directory (0700, the cluster user's) holding
	// the data directory and the Unix socket: host=Dir in a keyword/value
	// connection string, with the password of URL.
	Dir string
	// Port is the TCP port on 127.0.0.1.
	Port int

	cfg  Config
	cred *syscall.Credential
	data string

	// mu guards cmd and exited, which a Restart replaces, and serializes
	// Restart with Close.
	mu        sync.Mutex
	cmd       *exec.Cmd
	exited    chan struct{}
	closed    bool
	closeOnce sync.Once
	closeErr  error
}

// FindBinDir returns the directory holding initdb and postgres, or
// ErrNoBinaries.
func FindBinDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	// Newest major version first: 17 before 9.6.
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
	if p, err := exec.LookPath("initdb"); err == nil {
		dirs = append(dirs, filepath.Dir(p))
	}
	for _, d := range dirs {
		if isExec(filepath.Join(d, "initdb")) && isExec(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	return "", ErrNoBinaries
}

func versionOf(binDir string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(binDir)), 64)
	return v
}

func isExec(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// Start initialises a data directory and starts postgres on a free port. The
// ctx governs the start only; the server runs until Close.
func Start(ctx context.Context, cfg *Config) (*Cluster, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.User == "" {
		c.User = UserDefault
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	if c.StartTimeout == 0 {
		c.StartTimeout = StartTimeoutDefault
	}
	if c.StartTimeout < 0 {
		return nil, fmt.Errorf("pgtemp: Config.StartTimeout %v is negative", c.StartTimeout)
	}
	if c.BinDir == "" {
		d, err := FindBinDir()
		if err != nil {
			return nil, err
		}
		c.BinDir = d
	} else if !isExec(filepath.Join(c.BinDir, "initdb")) || !isExec(filepath.Join(c.BinDir, "postgres")) {
		return nil, fmt.Errorf("%w in Config.BinDir %s", ErrNoBinaries, c.BinDir)
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup(c.User)
		if err != nil {
			return nil, fmt.Errorf("%w: %q: %v", ErrNoUser, c.User, err)
		}
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	ctx, cancel := context.WithTimeout(ctx, c.StartTimeout)
	defer cancel()

	dir, err := os.MkdirTemp("", "pgtemp-")
	if err != nil {
		return nil, fmt.Errorf("pgtemp: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = os.RemoveAll(dir)
		}
	}()
	if cred != nil {
		// MkdirTemp makes the directory 0700 for root: hand it over.
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, fmt.Errorf("pgtemp: chown %s: %w", dir, err)
		}
	}
	password, err := newPassword()
	if err != nil {
		return nil, fmt.Errorf("pgtemp: %w", err)
	}
	data := filepath.Join(dir, "data")
	if err := initCluster(ctx, &c, cred, dir, data, password); err != nil {
		return nil, err
	}

	// A free port can be taken between our probe and postgres's bind: try a
	// few ports.
	var lastErr error
	for range 3 {
		port, err := freePort()
		if err != nil {
			return nil, fmt.Errorf("pgtemp: %w", err)
		}
		cl := &Cluster{
			URL: (&url.URL{
				Scheme: "postgres", User: url.UserPassword("postgres", password),
				Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Path: "/postgres", RawQuery: "sslmode=disable",
			}).String(),
			Dir:  dir,
			Port: port,
			cfg:  c,
			cred: cred,
			data: data,
		}
		err = cl.startServer(ctx)
		if err == nil {
			ok = true
			return cl, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
	}
	return nil, lastErr
}

// newPassword returns the superuser's password: 256 random bits, in hex
// so that it needs no escaping in a URL or a keyword/value string.
func newPassword() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// initCluster runs initdb on data with password authentication
// (scram-sha-256) for every connection, TCP and Unix socket alike: trust
// would make the superuser, and through it a shell as the cluster's OS
// user, anyone's who can reach 127.0.0.1. initdb reads the password from a
// file: a command line is readable by every local user, the file is not
// (0600, in dir, which is 0700), and it is deleted as soon as initdb has
// read it, so that only the cluster's hash of it stays on disk.
func initCluster(ctx context.Context, c *Config, cred *syscall.Credential, dir, data, password string) error {
	pwfile := filepath.Join(dir, "pwfile")
	f, err := os.OpenFile(pwfile, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("pgtemp: %w", err)
	}
	defer os.Remove(pwfile)
	_, err = io.WriteString(f, password+"\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil && cred != nil {
		err = os.Chown(pwfile, int(cred.Uid), int(cred.Gid))
	}
	if err != nil {
		return fmt.Errorf("pgtemp: password file: %w", err)
	}
	initdb := exec.CommandContext(ctx, filepath.Join(c.BinDir, "initdb"),
		"-D", data, "-U", "postgres", "--auth=scram-sha-256", "--pwfile="+pwfile,
		"-E", "UTF8", "--no-sync")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	initdb.Dir = dir
	initdb.Env = append(os.Environ(), "LC_ALL=C", "LANG=C")
	if out, err := initdb.CombinedOutput(); err != nil {
		return fmt.Errorf("%w: initdb: %v: %s", ErrStart, err, lastLine(out))
	}
	return nil
}

// startServer runs postgres on cl's data directory and port and waits until
// it answers. The caller holds cl.mu or owns cl alone.
//
// fsync and full_page_writes are off: they protect against a machine crash
// (and torn pages), which a throwaway cluster need not survive. A crash of
// the server itself (Restart with StopImmediate) loses nothing committed:
// synchronous_commit stays on, so a commit is acknowledged only once its WAL
// is written to the operating system, which outlives the server's processes;
// crash recovery replays it from there.
func (cl *Cluster) startServer(ctx context.Context) error {
	c, cred, dir, data, port := &cl.cfg, cl.cred, cl.Dir, cl.data, cl.Port
	args := []string{"-D", data, "-p", strconv.Itoa(port), "-k", dir,
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_permissions=0700",
		"-c", "fsync=off", "-c", "full_page_writes=off",
		"-c", "max_connections=200"}
	for _, kv := range c.Settings {
		args = append(args, "-c", kv)
	}
	cmd := exec.Command(filepath.Join(c.BinDir, "postgres"), args...)
	// Pdeathsig: if our process dies without Close, the postmaster goes too
	// (its backends follow it), rather than running on an orphaned port.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "LANG=C")
	var out tailBuffer
	cmd.Stdout = io.MultiWriter(c.Log, &out)
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%w: %v", ErrStart, err)
	}
	exited := make(chan struct{})
	cl.cmd, cl.exited = cmd, exited
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(pctx, cl.URL)
		if err == nil {
			err = conn.Ping(pctx)
			_ = conn.Close(context.Background())
		}
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("%w: postgres exited: %s", ErrStart, out.lastLine())
		case <-ctx.Done():
			cl.stop()
			return fmt.Errorf("%w: %v: %s", ErrStart, ctx.Err(), out.lastLine())
		case <-tick.C:
		}
	}
}

// StopMode is how Restart stops the server: pg_ctl's shutdown modes.
type StopMode string

const (
	// StopImmediate: every server process quits at once, without a
	// checkpoint, dropping its connections mid-statement; the next start
	// runs crash recovery. A crash of the database server.
	StopImmediate StopMode = "immediate"
	// StopFast: sessions are rolled back and disconnected, then a
	// checkpoint, then exit. A clean restart.
	StopFast StopMode = "fast"
)

// ErrClosed is returned by Restart on a closed cluster.
var ErrClosed = errors.New("pgtemp: cluster closed")

// Restart stops the server with `pg_ctl stop -m mode` and starts it again
// on the same port and data directory, waiting until it answers. Open
// connections are dropped; new ones work once Restart returns. ctx bounds
// the restart (the stop and the start).
func (c *Cluster) Restart(ctx context.Context, mode StopMode) error {
	if mode != StopImmediate && mode != StopFast {
		return fmt.Errorf("pgtemp: Restart: unknown mode %q", mode)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.StartTimeout)
	defer cancel()
	pgctl := exec.CommandContext(ctx, filepath.Join(c.cfg.BinDir, "pg_ctl"), "stop", "-D", c.data, "-m", string(mode), "-w")
	pgctl.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	pgctl.Dir = c.Dir
	pgctl.Env = append(os.Environ(), "LC_ALL=C", "LANG=C")
	if out, err := pgctl.CombinedOutput(); err != nil {
		return fmt.Errorf("pgtemp: pg_ctl stop -m %s: %v: %s", mode, err, lastLine(out))
	}
	// pg_ctl -w returns once postmaster.pid is gone; the process itself is
	// our child and exits at the same moment.
	select {
	case <-c.exited:
	case <-ctx.Done():
		return fmt.Errorf("pgtemp: postgres did not exit after pg_ctl stop: %w", ctx.Err())
	}
	return c.startServer(ctx)
}

// Close stops the server (fast shutdown: sessions are disconnected) and
// deletes its directory. Safe to call twice, and during a Restart (it waits
// for it).
func (c *Cluster) Close() error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.closed = true
		c.stop()
		c.closeErr = os.RemoveAll(c.Dir)
	})
	return c.closeErr
}

// stop asks for a fast shutdown (SIGINT), and kills after 10 seconds. The
// caller holds c.mu or owns c alone.
func (c *Cluster) stop() {
	select {
	case <-c.exited:
		return // not running (a Restart whose start failed)
	default:
	}
	_ = c.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-c.exited:
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

// tailBuffer keeps the last 4 KiB written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > 4096 {
		t.buf = t.buf[len(t.buf)-4096:]
	}
	return len(p), nil
}

func (t *tailBuffer) lastLine() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return lastLine(t.buf)
}
