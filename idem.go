package idem

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// Header names of the protocol.
const (
	// HeaderKey carries the client's key on an unsafe request.
	HeaderKey = "Idempotency-Key"
	// HeaderReplayed is "true" on a response replayed from storage.
	HeaderReplayed = "Idempotent-Replayed"
)

// Message header names: what idem's outbox publishers put on every
// message, on every broker (Kafka record headers, NATS message headers),
// and what its consumers read back. One spelling for every adapter, so that
// a consumer on one client library reads what a publisher on another wrote.
const (
	// HeaderEventID carries the outbox event id: the consumers' dedup key.
	HeaderEventID = "event-id"
	// HeaderEventType carries the outbox event type.
	HeaderEventType = "event-type"
	// HeaderAggregateType carries the aggregate type of the event.
	HeaderAggregateType = "aggregate-type"
	// HeaderAggregateSeq carries the event's sequence number within its
	// aggregate, in decimal.
	HeaderAggregateSeq = "aggregate-seq"
)

// Headers a consumer adds to a dead-lettered copy of a message, besides the
// original headers (the event id among them).
const (
	// HeaderDeadLetterError carries the last handler error, cut to 1 KiB
	// (consume.DeadLetterErrorMaxBytes).
	HeaderDeadLetterError = "dlq-error"
	// HeaderDeadLetterSource says where the original was: Kafka
	// "topic/partition/offset", NATS "stream/sequence".
	HeaderDeadLetterSource = "dlq-source"
	// HeaderDeadLetterAttempts is how many times the handler failed.
	HeaderDeadLetterAttempts = "dlq-attempts"
	// HeaderDeadLetterConsumer is the consumer id that gave up.
	HeaderDeadLetterConsumer = "dlq-consumer"
	// HeaderDeadLetterTruncated is "true" on a reference copy: the
	// original was too large to dead-letter whole, so the copy has no
	// value and only the original's event headers; the original stays in
	// its source (HeaderDeadLetterSource) for as long as the source's
	// retention keeps it. The dead-letter tools read it from there.
	HeaderDeadLetterTruncated = "dlq-truncated"
	// HeaderDeadLetterSize is the original's size in bytes (key, value
	// and headers), on a reference copy.
	HeaderDeadLetterSize = "dlq-size"
	// HeaderDeadLetterRedriveID marks a record republished from a
	// dead-letter topic: the "topic/partition/offset" of the dead-letter
	// record it copies. A redrive skips a record whose id it finds on the
	// destination already, so a redrive restarted after an interruption
	// does not publish twice.
	HeaderDeadLetterRedriveID = "dlq-redrive-id"
)

// IsReservedHeader reports whether name is a message header that idem
// writes itself: the event headers above (which every publisher sets from
// the event's own fields) and any dlq-* header (which consumers and
// redrives set). The match ignores case, so that a bridge that
// canonicalises header names cannot turn a user's Event-ID into idem's.
// The outbox refuses such a name among a message's Headers at enqueue
// (outbox.ErrInvalidMessage), and publishers drop one that reached them
// from an older row, writing their own last.
func IsReservedHeader(name string) bool {
	switch {
	case strings.EqualFold(name, HeaderEventID), strings.EqualFold(name, HeaderEventType),
		strings.EqualFold(name, HeaderAggregateType), strings.EqualFold(name, HeaderAggregateSeq):
		return true
	}
	return len(name) >= 4 && strings.EqualFold(name[:4], "dlq-")
}

// MaxKeyLength is the longest key, in characters (bytes: keys are ASCII).
const MaxKeyLength = 255

// Problem codes: the code member of the application/problem+json bodies
// that idem writes. The first four are the protocol's; the rest belong to
// the idempotency middleware and are documented in docs/contracts.md.
const (
	CodeKeyRequired      = "IDEMPOTENCY_KEY_REQUIRED"      // 400: an unsafe request without a key
	CodeKeyInvalid       = "IDEMPOTENCY_KEY_INVALID"       // 400: a key that breaks the key rule
	CodeKeyReused        = "IDEMPOTENCY_KEY_REUSED"        // 409 (or 422): the key was used for a different request
	CodeKeyInProgress    = "IDEMPOTENCY_KEY_IN_PROGRESS"   // 409 with Retry-After: the first request is still running
	CodeBodyTooLarge     = "REQUEST_BODY_TOO_LARGE"        // 413
	CodeBodyUnreadable   = "REQUEST_BODY_UNREADABLE"       // 400
	CodeBodyTooDeep      = "REQUEST_BODY_TOO_DEEP"         // 400: a JSON body nested deeper than the server allows
	CodeBodyAmbiguous    = "REQUEST_BODY_AMBIGUOUS"        // 400: a JSON object with member names equal ignoring case
	CodeScopeUnknown     = "IDEMPOTENCY_SCOPE_UNKNOWN"     // 401: no principal to scope the key
	CodeStoreUnavailable = "IDEMPOTENCY_STORE_UNAVAILABLE" // 503
	CodeTxAborted        = "IDEMPOTENCY_TX_ABORTED"        // 500: the handler answered success after its transaction failed; nothing committed
)

// RPCCode is the status code that answers the refusal with problem code
// code over an RPC protocol (gRPC, and Connect, which shares gRPC's
// canonical codes), and whether that answer carries the refusal's retry
// delay: InvalidArgument (3) for a missing or invalid key,
// FailedPrecondition (9) for a reused one, Aborted (10, retry) in
// progress, Unauthenticated (16) without a principal, Unavailable (14,
// retry) when the store is down, ResourceExhausted (8) for a body too
// large, and Internal (13) for the rest. Every RPC adapter answers a
// refusal through it, so they answer alike.
func RPCCode(code string) (rpc uint32, retry bool) {
	switch code {
	case CodeKeyRequired, CodeKeyInvalid:
		return 3, false
	case CodeKeyReused:
		return 9, false
	case CodeKeyInProgress:
		return 10, true
	case CodeScopeUnknown:
		return 16, false
	case CodeStoreUnavailable:
		return 14, true
	case CodeBodyTooLarge:
		return 8, false
	}
	return 13, false
}

// ProblemContentType is the media type of RFC 9457 problem details.
const ProblemContentType = "application/problem+json"

// Errors of ParseKey and ValidateKey. Packages wrap them in their own
// sentinels where their callers need a package-specific meaning.
var (
	ErrKeyRequired = errors.New("idem: Idempotency-Key required")
	ErrKeyInvalid  = errors.New("idem: Idempotency-Key invalid")
)

// ParseKey parses an Idempotency-Key header value: a bare token or a
// structured-field string (see the package doc). Spaces and tabs around the
// value are ignored. An empty value is ErrKeyRequired; anything else that
// breaks the rule is ErrKeyInvalid. It never panics and allocates only for
// the quoted form.
func ParseKey(v string) (string, error) {
	v = strings.Trim(v, " \t")
	if v == "" {
		return "", ErrKeyRequired
	}
	if v[0] != '"' {
		if len(v) > MaxKeyLength || !visible(v) {
			return "", ErrKeyInvalid
		}
		return v, nil
	}
	// sf-string: DQUOTE *( unescaped / "\" ( DQUOTE / "\" ) ) DQUOTE
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i >= len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", ErrKeyInvalid
			}
			b.WriteByte(v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", ErrKeyInvalid
			}
			k := b.String()
			if k == "" || len(k) > MaxKeyLength || !visible(k) {
				return "", ErrKeyInvalid
			}
			return k, nil
		case c < 0x21 || c > 0x7e:
			return "", ErrKeyInvalid
		default:
			b.WriteByte(c)
		}
		if b.Len() > MaxKeyLength {
			return "", ErrKeyInvalid
		}
	}
	return "", ErrKeyInvalid // no closing quote
}

// ValidateKey reports whether key, as a client would send it bare, follows
// the key rule. The error wraps ErrKeyInvalid and says what is wrong.
func ValidateKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty", ErrKeyInvalid)
	}
	if len(key) > MaxKeyLength {
		return fmt.Errorf("%w: %d bytes, longer than %d", ErrKeyInvalid, len(key), MaxKeyLength)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c < 0x21 || c > 0x7e {
			return fmt.Errorf("%w: byte %#x at %d is not visible ASCII", ErrKeyInvalid, c, i)
		}
	}
	return nil
}

func visible(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// Hook is the shape of every component's hook (see the package doc).
type Hook[E any] func(ctx context.Context, e E) context.Context

// JoinHooks returns a hook calling each non-nil hook in order, each with
// the ctx the previous one returned, and returning the last ctx: an
// OpenTelemetry hook and a Prometheus hook on one component, say. It
// returns nil when every hook is nil.
func JoinHooks[E any](hooks ...func(context.Context, E) context.Context) func(context.Context, E) context.Context {
	var hs []func(context.Context, E) context.Context
	for _, h := range hooks {
		if h != nil {
			hs = append(hs, h)
		}
	}
	switch len(hs) {
	case 0:
		return nil
	case 1:
		return hs[0]
	}
	return func(ctx context.Context, e E) context.Context {
		for _, h := range hs {
			if next := h(ctx, e); next != nil {
				ctx = next
			}
		}
		return ctx
	}
}

// CallHook calls h if it is set and returns the ctx to use next: h's, or
// ctx when h is nil or returns nil. Components call their hooks through it.
func CallHook[E any](h func(context.Context, E) context.Context, ctx context.Context, e E) context.Context {
	if h == nil {
		return ctx
	}
	if next := h(ctx, e); next != nil {
		return next
	}
	return ctx
}
