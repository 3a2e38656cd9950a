package idempotency

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Mode selects how the claim relates to the handler's own writes.
type Mode int

const (
	// ModeTwoStep commits the claim first, runs the handler, then stores the
	// response. While the handler runs, a heartbeat renews the claim's lease
	// in the store. A process killed in between leaves a claim that a retry
	// takes over once its lease (in database time) has run out; a fencing
	// token stops the late original from overwriting the new owner's result.
	ModeTwoStep Mode = iota
	// ModeTransactional opens one transaction per request: the claim, the
	// handler's writes (through TxFromContext) and the stored response commit
	// together, with one commit. A crash rolls all of it back, so a retry is
	// safe at once. Needs a TxStore.
	ModeTransactional
)

func (m Mode) String() string {
	switch m {
	case ModeTwoStep:
		return "two-step"
	case ModeTransactional:
		return "transactional"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Defaults of Config.
const (
	LeaseDefault             = 30 * time.Second
	RetentionDefault         = 24 * time.Hour
	MaxRequestBodyDefault    = 1 << 20
	MaxBodyDepthDefault      = 64
	MaxResponseBodyDefault   = 1 << 20
	CompletionTimeoutDefault = 5 * time.Second
	MismatchStatusDefault    = http.StatusConflict
	PurgeIntervalDefault     = time.Minute
	PurgeBatchSizeDefault    = 500
	ReplayCacheBytesDefault  = 8 << 20
	// ReplayCacheTTLDefault bounds how long a cached replay is served
	// without asking the store: an operator's Forget reaches every
	// instance within it.
	ReplayCacheTTLDefault = 2 * time.Second
)

// MethodsDefault are the methods the middleware guards by default.
var MethodsDefault = []string{http.MethodPost, http.MethodPatch}

// ReplayHeadersDefault is the default allow-list of replayed headers.
var ReplayHeadersDefault = []string{"Content-Type", "Content-Language", "Location"}

// Config configures the middleware. Scope is required, so a nil *Config is
// an error.
type Config struct {
	// Scope returns the authenticated principal of r; every key is scoped
	// by it (and by method and route), so one caller's key never replays
	// another caller's response. An error answers 401 and the handler does
	// not run. Required: there is no default.
	Scope func(r *http.Request) (string, error)

	// Route returns the route of r for scoping. Defaults to r.Pattern (set
	// by net/http.ServeMux and chi) or, when empty, r.URL.Path.
	Route func(r *http.Request) string

	// Methods are the guarded methods; other methods pass through untouched.
	// Defaults to MethodsDefault (POST, PATCH).
	Methods []string

	// Mode is ModeTwoStep or ModeTransactional. Defaults to ModeTwoStep.
	Mode Mode

	// Lease is how long a two-step claim holds its key without a renewal or
	// a completion, in the store's clock: after a crash, a retry takes the
	// key over once Lease has passed. While the handler runs, a heartbeat
	// renews the lease every Lease/3; if it cannot, the handler's context
	// ends (cause ErrLeaseLost) Lease/5 before the lease could run out. In
	// ModeTransactional nothing is leased (the open transaction holds the
	// key) and Lease only serves as HandlerTimeout's default. Must not be
	// longer than Retention. Defaults to LeaseDefault (30s).
	Lease time.Duration

	// HandlerTimeout bounds the handler's run: its context ends
	// HandlerTimeout after the claim was sent. In ModeTwoStep the lease is
	// renewed until then, so it may be longer than Lease: a long handler
	// keeps its key, while a crashed process loses it within Lease. A
	// handler that goes on past its context is no longer renewed, and a
	// retry may take its key over. In ModeTransactional it bounds how long
	// the request's transaction stays open. Must not be longer than
	// Retention. Defaults to Lease.
	HandlerTimeout time.Duration

	// Retention is how long a record is kept and replayed; after it the key
	// may be reused. Defaults to RetentionDefault (24h).
	Retention time.Duration

	// MismatchStatus answers a key reused with a different request: 409 or
	// 422 (the IETF draft's choice). Defaults to MismatchStatusDefault (409).
	MismatchStatus int

	// Wait, when positive, makes a request whose key is in progress wait up
	// to Wait for the first request and replay its response, instead of an
	// immediate 409 IDEMPOTENCY_KEY_IN_PROGRESS. Defaults to 0 (no wait).
	Wait time.Duration

	// ReplayHeaders is the allow-list of response headers stored and
	// replayed. Set-Cookie is never stored. Defaults to ReplayHeadersDefault.
	ReplayHeaders []string

	// MaxRequestBody caps the request body read for the fingerprint; larger
	// bodies answer 413. Defaults to MaxRequestBodyDefault (1 MiB).
	MaxRequestBody int64

	// MaxBodyDepth caps the nesting of objects and arrays in a JSON body
	// (the outermost counts 1); a deeper body answers 400
	// REQUEST_BODY_TOO_DEEP before the handler runs. At most 10000.
	// Defaults to MaxBodyDepthDefault (64).
	MaxBodyDepth int

	// MaxResponseBody caps the stored response body. A larger response is
	// still delivered, and its status and headers are stored, but its body is
	// not: replays of it have an empty body. Defaults to
	// MaxResponseBodyDefault (1 MiB).
	MaxResponseBody int

	// ReplayCacheBytes bounds an in-process cache of completed records seen
	// on replay, so that repeated retries of a completed key are answered
	// without a store round trip. An entry lives no longer than the record's
	// remaining retention (completed records never change before they
	// expire). Negative disables the cache. Defaults to
	// ReplayCacheBytesDefault (8 MiB).
	ReplayCacheBytes int64

	// ReplayCacheTTL bounds the life of a replay cache entry: after it the
	// store is asked again, and its answer is authoritative. It is how long
	// a key forgotten by an operator (PostgresStore.Forget, `idem keys
	// release --forget`) may still be replayed by an instance that cached
	// it. Defaults to ReplayCacheTTLDefault (2s).
	ReplayCacheTTL time.Duration

	// FingerprintHeaders are request headers included in the fingerprint.
	// Defaults to none.
	FingerprintHeaders []string

	// FingerprintFields, when set, restricts the fingerprint of a JSON object
	// body to these top-level members. A member counts when its name matches
	// a field ignoring case, as encoding/json matches names to struct
	// fields. Defaults to none: the whole body.
	FingerprintFields []string

	// StoreStatus decides from a handler's status whether its response is stored
	// (replayed to retries) or released (a retry runs the handler again).
	// Defaults to DefaultStoreStatus: 2xx and 4xx except 408 and 429.
	StoreStatus func(status int) bool

	// KeepOnClientGone, when false, releases the key when the client hung up
	// before the handler finished, so that its retry runs the handler again.
	// In ModeTransactional the handler's writes roll back with the claim; in
	// ModeTwoStep a storable response the handler already produced is stored
	// anyway, because its effects happened. When true, a hung-up client is
	// treated like any other. Defaults to false (release).
	KeepOnClientGone bool

	// CompletionTimeout bounds storing the response (or releasing), which
	// runs on a context detached from the request. Defaults to
	// CompletionTimeoutDefault (5s).
	CompletionTimeout time.Duration

	// Hook, when set, is called for every Event, for tracing, metrics and
	// logs, synchronously; it must be fast and safe for concurrent use. For
	// EventBegin the context it returns becomes the request's: the
	// handler's and that of every later event of the request (a tracer's
	// span); for other kinds it is ignored. Events never carry the key or
	// the principal. Defaults to nil.
	Hook func(ctx context.Context, e Event) context.Context

	// PurgeInterval is the pause between purge rounds after Start. Defaults
	// to PurgeIntervalDefault (1m).
	PurgeInterval time.Duration

	// PurgeBatchSize is how many expired records one purge statement
	// deletes, small so that it holds no long locks. Defaults to
	// PurgeBatchSizeDefault (500).
	PurgeBatchSize int
}

// DefaultStoreStatus stores 2xx and definitive 4xx responses; 408, 429, 1xx,
// 3xx and 5xx are released so that a retry runs the handler again.
func DefaultStoreStatus(status int) bool {
	switch {
	case status >= 200 && status < 300:
		return true
	case status == http.StatusRequestTimeout, status == http.StatusTooManyRequests:
		return false
	case status >= 400 && status < 500:
		return true
	}
	return false
}

// config is a Config with its defaults filled in and its lists indexed.
type config struct {
	Config
	methods       map[string]bool
	replayHeaders map[string]bool
	fields        map[string]struct{} // folded FingerprintFields; nil: the whole body
}

// newConfig fills in the defaults, then validates the result: a check
// between two fields sees what will be used, defaults included.
func newConfig(c *Config) (*config, error) {
	if c == nil {
		return nil, invalidf("Config.Scope is required (the Config is nil)")
	}
	out := &config{Config: *c}
	cc := &out.Config
	if cc.Route == nil {
		cc.Route = defaultRoute
	}
	if cc.Methods == nil {
		cc.Methods = MethodsDefault
	}
	if cc.Lease == 0 {
		cc.Lease = LeaseDefault
	}
	if cc.HandlerTimeout == 0 {
		cc.HandlerTimeout = cc.Lease
	}
	if cc.Retention == 0 {
		cc.Retention = RetentionDefault
	}
	if cc.MismatchStatus == 0 {
		cc.MismatchStatus = MismatchStatusDefault
	}
	if cc.ReplayHeaders == nil {
		cc.ReplayHeaders = ReplayHeadersDefault
	}
	if cc.MaxRequestBody == 0 {
		cc.MaxRequestBody = MaxRequestBodyDefault
	}
	if cc.MaxBodyDepth == 0 {
		cc.MaxBodyDepth = MaxBodyDepthDefault
	}
	if cc.MaxResponseBody == 0 {
		cc.MaxResponseBody = MaxResponseBodyDefault
	}
	if cc.ReplayCacheBytes == 0 {
		cc.ReplayCacheBytes = ReplayCacheBytesDefault
	}
	if cc.ReplayCacheTTL == 0 {
		cc.ReplayCacheTTL = ReplayCacheTTLDefault
	}
	if cc.StoreStatus == nil {
		cc.StoreStatus = DefaultStoreStatus
	}
	if cc.CompletionTimeout == 0 {
		cc.CompletionTimeout = CompletionTimeoutDefault
	}
	if cc.PurgeInterval == 0 {
		cc.PurgeInterval = PurgeIntervalDefault
	}
	if cc.PurgeBatchSize == 0 {
		cc.PurgeBatchSize = PurgeBatchSizeDefault
	}
	if err := out.validate(); err != nil {
		return nil, err
	}
	out.methods = map[string]bool{}
	for _, m := range cc.Methods {
		out.methods[strings.ToUpper(m)] = true
	}
	out.fields = foldedFields(cc.FingerprintFields)
	out.replayHeaders = map[string]bool{}
	for _, h := range cc.ReplayHeaders {
		out.replayHeaders[http.CanonicalHeaderKey(h)] = true
	}
	return out, nil
}

// validate checks the filled config. The error wraps ErrInvalidConfig and
// names the field.
func (c *config) validate() error {
	switch {
	case c.Scope == nil:
		return invalidf("Config.Scope is required")
	case c.Mode != ModeTwoStep && c.Mode != ModeTransactional:
		return invalidf("Config.Mode %d is unknown", int(c.Mode))
	case c.Lease < 0:
		return invalidf("Config.Lease %s is negative", c.Lease)
	case c.HandlerTimeout < 0:
		return invalidf("Config.HandlerTimeout %s is negative", c.HandlerTimeout)
	case c.Retention < 0:
		return invalidf("Config.Retention %s is negative", c.Retention)
	case c.Lease > c.Retention:
		return invalidf("Config.Lease %s is longer than Config.Retention %s: the record would expire, and a different request take its key, while the claim is live", c.Lease, c.Retention)
	case c.HandlerTimeout > c.Retention:
		return invalidf("Config.HandlerTimeout %s is longer than Config.Retention %s", c.HandlerTimeout, c.Retention)
	case c.MismatchStatus != http.StatusConflict && c.MismatchStatus != http.StatusUnprocessableEntity:
		return invalidf("Config.MismatchStatus %d: want 409 or 422", c.MismatchStatus)
	case c.Wait < 0:
		return invalidf("Config.Wait %s is negative", c.Wait)
	case c.ReplayCacheTTL < 0:
		return invalidf("Config.ReplayCacheTTL %s is negative", c.ReplayCacheTTL)
	case c.MaxRequestBody < 0:
		return invalidf("Config.MaxRequestBody %d is negative", c.MaxRequestBody)
	case c.MaxBodyDepth < 0 || c.MaxBodyDepth > maxBodyDepthLimit:
		return invalidf("Config.MaxBodyDepth %d: want 1 to %d", c.MaxBodyDepth, maxBodyDepthLimit)
	case c.MaxResponseBody < 0:
		return invalidf("Config.MaxResponseBody %d is negative", c.MaxResponseBody)
	case c.CompletionTimeout < 0:
		return invalidf("Config.CompletionTimeout %s is negative", c.CompletionTimeout)
	case c.PurgeInterval < 0:
		return invalidf("Config.PurgeInterval %s is negative", c.PurgeInterval)
	case c.PurgeBatchSize < 0:
		return invalidf("Config.PurgeBatchSize %d is negative", c.PurgeBatchSize)
	}
	for _, h := range c.ReplayHeaders {
		if strings.EqualFold(h, "Set-Cookie") {
			return invalidf("Config.ReplayHeaders must not list Set-Cookie")
		}
	}
	for _, m := range c.Methods {
		if m == "" {
			return invalidf("Config.Methods has an empty method")
		}
	}
	return nil
}

// invalidf is a config error naming what is wrong.
func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
}

func defaultRoute(r *http.Request) string {
	if r.Pattern != "" {
		return r.Pattern
	}
	return r.URL.Path
}
