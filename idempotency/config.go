package idempotency

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Mode selects how the claim relates to the handler's own writes.
type Mode int

const (
	// ModeTwoStep commits the claim first, runs the handler, then stores the
	// response. A process killed in between leaves a claim that a retry takes
	// over once its lease (in database time) has run out; a fencing token
	// stops the late original from overwriting the new owner's result.
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

// Defaults.
const (
	LeaseDefault             = 30 * time.Second
	RetentionDefault         = 24 * time.Hour
	MaxRequestBodyDefault    = 1 << 20
	MaxResponseBodyDefault   = 1 << 20
	CompletionTimeoutDefault = 5 * time.Second
	MismatchStatusDefault    = http.StatusConflict
	PurgeIntervalDefault     = time.Minute
	PurgeBatchDefault        = 500
	ReplayCacheBytesDefault  = 8 << 20
	// HeaderName is the request header carrying the key.
	HeaderName = "Idempotency-Key"
	// ReplayedHeader is set to "true" on every replayed response.
	ReplayedHeader = "Idempotent-Replayed"
)

// MethodsDefault are the methods the middleware guards by default.
var MethodsDefault = []string{http.MethodPost, http.MethodPatch}

// ReplayHeadersDefault is the default allow-list of replayed headers.
var ReplayHeadersDefault = []string{"Content-Type", "Content-Language", "Location"}

// Config configures the middleware. A nil *Config is invalid because Scope
// is required.
type Config struct {
	// Scope returns the authenticated principal of r; every key is scoped
	// by it (and by method and route), so one caller's key never replays
	// another caller's response. An error answers 401 and the handler does
	// not run. Required; there is no default.
	Scope func(r *http.Request) (string, error)

	// Route returns the route of r for scoping. Defaults to r.Pattern (set
	// by net/http.ServeMux and chi) or, when empty, r.URL.Path.
	Route func(r *http.Request) string

	// Methods are the guarded methods; other methods pass through untouched.
	// Defaults to MethodsDefault (POST, PATCH).
	Methods []string

	// Mode is ModeTwoStep or ModeTransactional. Defaults to ModeTwoStep.
	Mode Mode

	// Lease is how long a two-step claim holds its key without a completion
	// before a retry may take it over. The handler's context ends when the
	// lease does (in both modes), so that a handler does not run past its
	// own fence and a transaction is not held open indefinitely. Defaults to
	// LeaseDefault (30s).
	Lease time.Duration

	// Retention is how long a record is kept and replayed; after it the key
	// may be reused. Defaults to RetentionDefault (24h).
	Retention time.Duration

	// MismatchStatus answers a key reused with a different request: 409 (the
	// article's choice) or 422 (the IETF draft's). Defaults to 409.
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

	// FingerprintHeaders are request headers included in the fingerprint.
	// Defaults to none.
	FingerprintHeaders []string

	// FingerprintFields, when set, restricts the fingerprint of a JSON object
	// body to these top-level members. Defaults to the whole body.
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

	// Hook, when set, is called for every event (claim, replay, conflict,
	// mismatch, takeover, release...) for metrics and logs. It must be fast
	// and safe for concurrent use. Events never carry the key. Defaults to
	// nil.
	Hook func(ctx context.Context, e Event)

	// PurgeInterval is the pause between purge rounds after Start. Defaults
	// to PurgeIntervalDefault (1m).
	PurgeInterval time.Duration

	// PurgeBatch is how many expired records one purge statement deletes,
	// small so that it holds no long locks. Defaults to PurgeBatchDefault.
	PurgeBatch int
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

// EventKind names an Event.
type EventKind string

// Event kinds.
const (
	EventClaim      EventKind = "claim"       // the key was claimed; the handler runs
	EventTakeover   EventKind = "takeover"    // an expired lease was taken over; the handler runs
	EventReplay     EventKind = "replay"      // a stored response was replayed
	EventConflict   EventKind = "conflict"    // 409 in progress
	EventMismatch   EventKind = "mismatch"    // key reused with a different request
	EventComplete   EventKind = "complete"    // the response was stored
	EventRelease    EventKind = "release"     // the key was released (5xx, 408, 429, panic, client gone)
	EventFenced     EventKind = "fenced"      // completion rejected: a newer owner holds the key
	EventStoreError EventKind = "store_error" // the store failed; 503 or a lost completion
	EventRejected   EventKind = "rejected"    // bad request: no key, bad key, body too large, no scope
)

// Event is what Hook receives. It never carries the key or the principal.
type Event struct {
	Kind   EventKind
	Method string
	Route  string
	Mode   Mode
	// Status is the response status sent (or stored) when known.
	Status int
	// Fence is the claim's fencing token, when there is one.
	Fence int64
	// Err is the failure behind EventStoreError, EventFenced and
	// EventRejected.
	Err error
}

type config struct {
	Config
	methods           map[string]bool
	replayHeaders     map[string]bool
	fingerprintFields map[string]bool // nil: the whole body
}

func (c *Config) withDefaults() (*config, error) {
	if c == nil {
		return nil, errors.New("idempotency: Config.Scope is required")
	}
	out := &config{Config: *c}
	if err := out.validate(); err != nil {
		return nil, err
	}
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
	if cc.MaxResponseBody == 0 {
		cc.MaxResponseBody = MaxResponseBodyDefault
	}
	if cc.ReplayCacheBytes == 0 {
		cc.ReplayCacheBytes = ReplayCacheBytesDefault
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
	if cc.PurgeBatch == 0 {
		cc.PurgeBatch = PurgeBatchDefault
	}
	out.methods = map[string]bool{}
	for _, m := range cc.Methods {
		out.methods[strings.ToUpper(m)] = true
	}
	if len(cc.FingerprintFields) > 0 {
		out.fingerprintFields = map[string]bool{}
		for _, f := range cc.FingerprintFields {
			out.fingerprintFields[f] = true
		}
	}
	out.replayHeaders = map[string]bool{}
	for _, h := range cc.ReplayHeaders {
		out.replayHeaders[http.CanonicalHeaderKey(h)] = true
	}
	return out, nil
}

func (c *config) validate() error {
	switch {
	case c.Scope == nil:
		return errors.New("idempotency: Config.Scope is required")
	case c.Mode != ModeTwoStep && c.Mode != ModeTransactional:
		return fmt.Errorf("idempotency: Config.Mode %d is unknown", int(c.Mode))
	case c.Lease < 0:
		return errors.New("idempotency: Config.Lease must not be negative")
	case c.Retention < 0:
		return errors.New("idempotency: Config.Retention must not be negative")
	case c.Lease > 0 && c.Retention > 0 && c.Retention < c.Lease:
		return errors.New("idempotency: Config.Retention must not be shorter than Config.Lease")
	case c.MismatchStatus != 0 && c.MismatchStatus != http.StatusConflict && c.MismatchStatus != http.StatusUnprocessableEntity:
		return fmt.Errorf("idempotency: Config.MismatchStatus %d: want 409 or 422", c.MismatchStatus)
	case c.Wait < 0:
		return errors.New("idempotency: Config.Wait must not be negative")
	case c.MaxRequestBody < 0:
		return errors.New("idempotency: Config.MaxRequestBody must not be negative")
	case c.MaxResponseBody < 0:
		return errors.New("idempotency: Config.MaxResponseBody must not be negative")
	case c.CompletionTimeout < 0:
		return errors.New("idempotency: Config.CompletionTimeout must not be negative")
	case c.PurgeInterval < 0:
		return errors.New("idempotency: Config.PurgeInterval must not be negative")
	case c.PurgeBatch < 0:
		return errors.New("idempotency: Config.PurgeBatch must not be negative")
	}
	for _, h := range c.ReplayHeaders {
		if strings.EqualFold(h, "Set-Cookie") {
			return errors.New("idempotency: Config.ReplayHeaders must not list Set-Cookie")
		}
	}
	for _, m := range c.Methods {
		if m == "" {
			return errors.New("idempotency: Config.Methods has an empty method")
		}
	}
	return nil
}

func defaultRoute(r *http.Request) string {
	if r.Pattern != "" {
		return r.Pattern
	}
	return r.URL.Path
}
