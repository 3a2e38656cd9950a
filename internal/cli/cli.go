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
	"strconv"
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

// ExitError is a failure with an exit status of its own (billing chaos's
// 3 for an inconclusive run, say); it is printed as one line like any
// other error.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }

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
	var ee *ExitError
	switch {
	case err == nil, errors.Is(err, errHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "%s %s: %s\n", prog, cmd.Name, oneLine(Scrub(ue.Msg, hiddenURLs()...)))
		return 2
	case errors.As(err, &ee):
		fmt.Fprintf(stderr, "%s %s: %s\n", prog, cmd.Name, oneLine(err.Error()))
		return ee.Code
	default:
		fmt.Fprintf(stderr, "%s %s: %s\n", prog, cmd.Name, oneLine(Scrub(err.Error(), hiddenURLs()...)))
		return 1
	}
}

var hidden struct {
	mu   sync.Mutex
	urls []string
}

// HideURL registers a URL (a --database-url or --url flag's value) whose
// secrets Run hides in the error it prints, whatever library produced the
// message. DATABASE_URL is always hidden.
func HideURL(raw string) {
	hidden.mu.Lock()
	defer hidden.mu.Unlock()
	hidden.urls = append(hidden.urls, raw)
}

// SecretURLEnv are the variables whose URLs Run always hides: the
// database, NATS, Redis and the idempotency store's.
var SecretURLEnv = []string{"DATABASE_URL", "NATS_URL", "REDIS_URL", "IDEMPOTENCY_STORE"}

func hiddenURLs() []string {
	hidden.mu.Lock()
	defer hidden.mu.Unlock()
	var out []string
	for _, name := range SecretURLEnv {
		out = append(out, splitURLList(os.Getenv(name))...)
	}
	for _, u := range hidden.urls {
		out = append(out, splitURLList(u)...)
	}
	return out
}

// splitURLList splits a comma list of URLs (NATS_URL may name several
// servers) into its URLs; anything else is returned whole.
func splitURLList(s string) []string {
	if !strings.Contains(s, ",") || !strings.Contains(s, "://") {
		return []string{s}
	}
	return append(strings.Split(s, ","), s)
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

// IntEnv parses an environment variable as a positive integer.
func IntEnv(key string, def int) (int, error) {
	v := os.Getenv(key)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return 0, Usagef("%s=%q is not a positive integer", key, v)
	}
	return n, nil
}

// Connect opens a pool on rawURL and checks that the server answers within
// 10 seconds. Errors are one line and never contain the password.
func Connect(ctx context.Context, rawURL string) (*pgxpool.Pool, error) {
	HideURL(rawURL)
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

// redacted replaces every secret Redact hides.
const redacted = "xxxxx"

// Redact returns a database or HTTP URL fit for a log line or an error: the
// password of the user-info part and the value of every secret query
// parameter (password, sslpassword, or any name containing "pass",
// "secret", "token" or "pwd", in any case) become xxxxx, as does the
// password of a keyword/value connection string ("host=h password=p"). A
// string that parses as neither is never shown: Redact answers
// "(unparseable URL)" or "(connection string)" instead.
func Redact(raw string) string {
	if raw == "" {
		return ""
	}
	if !strings.Contains(raw, "://") {
		kv, ok := parseKeywordValue(raw)
		if !ok {
			return "(connection string)"
		}
		parts := make([]string, len(kv))
		for i, p := range kv {
			v := p.raw
			if secretName(p.key) {
				v = redacted
			}
			parts[i] = p.key + "=" + v
		}
		return strings.Join(parts, " ")
	}
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" {
		return "(unparseable URL)"
	}
	if u.RawQuery != "" {
		pairs := strings.Split(u.RawQuery, "&")
		for i, p := range pairs {
			// The whole pair, not only its name: a value can nest a
			// query of its own (?next=/x?password=...).
			k, _, _ := strings.Cut(p, "=")
			if text, err := url.QueryUnescape(p); err != nil || secretName(text) {
				pairs[i] = k + "=" + redacted
			}
		}
		u.RawQuery = strings.Join(pairs, "&")
	}
	// A fragment is never sent anywhere, and one can hold anything.
	u.Fragment, u.RawFragment = "", ""
	if u.User != nil {
		if _, hasPW := u.User.Password(); !hasPW && tokenScheme(u.Scheme) && u.User.Username() != "" {
			u.User = url.User(redacted) // nats://TOKEN@host: the user is the secret
		}
	}
	return u.Redacted()
}

// tokenScheme is a scheme whose bare user-info is a secret token (NATS).
func tokenScheme(scheme string) bool {
	switch strings.ToLower(scheme) {
	case "nats", "tls", "ws", "wss":
		return true
	}
	return false
}

// RedactList is Redact over a comma list of URLs (NATS_URL's form).
func RedactList(raw string) string {
	if !strings.Contains(raw, ",") || !strings.Contains(raw, "://") {
		return Redact(raw)
	}
	parts := strings.Split(raw, ",")
	for i, p := range parts {
		parts[i] = Redact(strings.TrimSpace(p))
	}
	return strings.Join(parts, ",")
}

// Scrub returns s with every secret of the URLs raws hidden: each URL as a
// whole is replaced by its Redact form, and each password (in its escaped
// and its decoded form) wherever else it appears, for the error messages of
// libraries that repeat a URL or a part of it. Secrets shorter than four
// bytes are hidden only as part of their URL: replacing them everywhere
// would garble the message.
func Scrub(s string, raws ...string) string {
	for _, raw := range raws {
		if raw == "" {
			continue
		}
		s = strings.ReplaceAll(s, raw, Redact(raw))
		for _, secret := range secretsOf(raw) {
			if len(secret) >= 4 {
				s = strings.ReplaceAll(s, secret, redacted)
			}
		}
	}
	return s
}

// secretsOf lists the secret values of raw, escaped and decoded.
func secretsOf(raw string) []string {
	var out []string
	add := func(escaped string, unescape func(string) (string, error)) {
		out = append(out, escaped)
		if v, err := unescape(escaped); err == nil && v != escaped {
			out = append(out, v)
		}
	}
	if !strings.Contains(raw, "://") {
		kv, _ := parseKeywordValue(raw)
		for _, p := range kv {
			if secretName(p.key) {
				out = append(out, p.value)
			}
		}
		return out
	}
	// By hand, not url.Parse: the URL may be one that does not parse, and
	// its error message then quotes it.
	rest := raw[strings.Index(raw, "://")+3:]
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		if slash := strings.IndexAny(rest, "/?#"); slash < 0 || slash > at {
			if _, pw, ok := strings.Cut(rest[:at], ":"); ok && pw != "" {
				add(pw, url.PathUnescape)
			} else if !ok && rest[:at] != "" && tokenScheme(raw[:strings.Index(raw, "://")]) {
				add(rest[:at], url.PathUnescape)
			}
		}
	}
	if _, q, ok := strings.Cut(raw, "?"); ok {
		q, _, _ = strings.Cut(q, "#")
		for _, p := range strings.Split(q, "&") {
			_, v, _ := strings.Cut(p, "=")
			if text, err := url.QueryUnescape(p); (err != nil || secretName(text)) && v != "" {
				add(v, url.QueryUnescape)
			}
		}
	}
	return out
}

// secretName reports whether a connection parameter holds a secret.
func secretName(name string) bool {
	n := strings.ToLower(name)
	for _, s := range []string{"pass", "secret", "token", "pwd"} {
		if strings.Contains(n, s) {
			return true
		}
	}
	return false
}

// kvPair is one keyword=value of a connection string: raw is the value as
// written (quoted or not), value its decoded text.
type kvPair struct{ key, raw, value string }

// parseKeywordValue parses libpq's keyword/value form: key = value pairs
// separated by spaces, a value bare (backslash escapes) or single-quoted
// (\' and \\ escapes).
func parseKeywordValue(s string) ([]kvPair, bool) {
	var out []kvPair
	i := 0
	skip := func() {
		for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
			i++
		}
	}
	for {
		skip()
		if i == len(s) {
			return out, len(out) > 0
		}
		start := i
		for i < len(s) && s[i] != '=' && s[i] != ' ' && s[i] != '\t' {
			i++
		}
		key := s[start:i]
		skip()
		if key == "" || i == len(s) || s[i] != '=' {
			return nil, false
		}
		i++
		skip()
		var val strings.Builder
		vstart := i
		if i < len(s) && s[i] == '\'' {
			i++
			closed := false
			for i < len(s) {
				c := s[i]
				if c == '\\' && i+1 < len(s) {
					val.WriteByte(s[i+1])
					i += 2
					continue
				}
				i++
				if c == '\'' {
					closed = true
					break
				}
				val.WriteByte(c)
			}
			if !closed {
				return nil, false
			}
		} else {
			for i < len(s) && s[i] != ' ' && s[i] != '\t' && s[i] != '\n' && s[i] != '\r' {
				if s[i] == '\\' && i+1 < len(s) {
					i++
				}
				val.WriteByte(s[i])
				i++
			}
		}
		out = append(out, kvPair{key: key, raw: s[vstart:i], value: val.String()})
	}
}
