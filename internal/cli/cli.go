// Package cli is the shared machinery of idem's command-line programs:
// subcommand dispatch, flag parsing with one-line errors, and the
// environment defaults of docs/contracts.md.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultDatabaseURL is the local server, used when DATABASE_URL is empty.
const DefaultDatabaseURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// Command is one subcommand.
type Command struct {
	Name    string
	Summary string
	// Run receives the arguments after the subcommand name. It returns a
	// *UsageError for bad input (exit 2) and any other error for a failure
	// (exit 1).
	Run func(ctx context.Context, args []string) error
}

// UsageError is bad command-line input: printed as one line, exit status 2.
type UsageError struct{ Msg string }

func (e *UsageError) Error() string { return e.Msg }

// Usagef builds a UsageError.
func Usagef(format string, args ...any) error {
	return &UsageError{Msg: fmt.Sprintf(format, args...)}
}

// errHelp means --help was asked for and printed.
var errHelp = errors.New("help printed")

// Main dispatches os.Args[1:] to cmds and exits. SIGINT and SIGTERM cancel
// the context passed to the command; commands that need a finer shutdown
// install their own handling.
func Main(prog, summary string, cmds []*Command) {
	os.Exit(Run(prog, summary, cmds, os.Args[1:], os.Stdout, os.Stderr))
}

// Run is Main without the exit, for tests.
func Run(prog, summary string, cmds []*Command, args []string, stdout, stderr io.Writer) int {
	sort.Slice(cmds, func(i, j int) bool { return cmds[i].Name < cmds[j].Name })
	usage := func(w io.Writer) {
		fmt.Fprintf(w, "%s — %s\n\nUsage: %s <command> [flags]\n\nCommands:\n", prog, summary, prog)
		for _, c := range cmds {
			fmt.Fprintf(w, "  %-14s %s\n", c.Name, c.Summary)
		}
		fmt.Fprintf(w, "\nRun '%s <command> --help' for a command's flags.\n", prog)
	}
	if len(args) == 0 {
		fmt.Fprintf(stderr, "%s: missing command (run '%s --help')\n", prog, prog)
		return 2
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stdout)
		return 0
	}
	var cmd *Command
	for _, c := range cmds {
		if c.Name == args[0] {
			cmd = c
		}
	}
	if cmd == nil {
		fmt.Fprintf(stderr, "%s: unknown command %q (run '%s --help')\n", prog, args[0], prog)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := cmd.Run(ctx, args[1:])
	var ue *UsageError
	switch {
	case err == nil, errors.Is(err, errHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "%s %s: %s\n", prog, cmd.Name, oneLine(ue.Msg))
		return 2
	default:
		fmt.Fprintf(stderr, "%s %s: %s\n", prog, cmd.Name, oneLine(err.Error()))
		return 1
	}
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// FlagSet returns a flag set that reports errors instead of printing them,
// and prints its usage (headed by usage) to stdout on --help.
func FlagSet(name, usage string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	// The flag package calls Usage on every parse error too; Parse prints
	// the usage itself, and only for --help.
	fs.Usage = func() {}
	usages.Store(fs, usage)
	return fs
}

var usages sync.Map // *flag.FlagSet → usage text

// PrintUsage writes fs's usage text and flags to w.
func PrintUsage(w io.Writer, fs *flag.FlagSet) {
	u, _ := usages.Load(fs)
	text, _ := u.(string)
	fmt.Fprintf(w, "%s\n\nFlags:\n", strings.TrimSpace(text))
	fs.SetOutput(w)
	fs.PrintDefaults()
	fs.SetOutput(io.Discard)
}

// Parse parses args into fs. --help prints usage and returns an error that
// Run treats as success; any other problem is a UsageError.
func Parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			PrintUsage(os.Stdout, fs)
			return errHelp
		}
		return &UsageError{Msg: err.Error()}
	}
	return nil
}

// Env returns the environment variable key, or def when it is empty.
func Env(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// DatabaseURL is DATABASE_URL or DefaultDatabaseURL.
func DatabaseURL() string { return Env("DATABASE_URL", DefaultDatabaseURL) }

// DurationEnv parses an environment variable as a time.Duration.
func DurationEnv(key string, def time.Duration) (time.Duration, error) {
	v := os.Getenv(key)
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, Usagef("%s=%q is not a positive duration (for example 25s)", key, v)
	}
	return d, nil
}

// Connect opens a pool on rawURL and checks that the server answers within
// 10 seconds. Errors are one line and never contain the password.
func Connect(ctx context.Context, rawURL string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(rawURL)
	if err != nil {
		return nil, Usagef("database URL %s is malformed", Redact(rawURL))
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(pctx, cfg)
	if err == nil {
		if err = pool.Ping(pctx); err != nil {
			pool.Close()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("database %s is unreachable: %v", Redact(rawURL), rootCause(err))
	}
	return pool, nil
}

// rootCause drops pgx's long connection prefix and keeps the reason.
func rootCause(err error) error {
	for {
		u := errors.Unwrap(err)
		if u == nil {
			return err
		}
		err = u
	}
}

// Redact hides the password of a URL; keyword/value strings are shown as
// "(connection string)".
func Redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" {
		return "(connection string)"
	}
	return u.Redacted()
}
