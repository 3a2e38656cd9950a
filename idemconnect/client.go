package idemconnect

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"connectrpc.com/connect"

	"github.com/idemkit/idem"
)

// ErrKeyInvalid is returned by a call whose key (from WithKey or the
// request's header) breaks idem's key rule; the call is not sent. It is
// also idem.ErrKeyInvalid.
var ErrKeyInvalid = fmt.Errorf("idemconnect: %w", idem.ErrKeyInvalid)

// ClientConfig configures ClientInterceptor. A nil *ClientConfig means
// all defaults.
type ClientConfig struct {
	// Procedures reports whether calls of a procedure get a key. Defaults
	// to every procedure not declared IdempotencyNoSideEffects.
	Procedures func(spec connect.Spec) bool
	// NewKey returns the key of a call whose caller gave none. Defaults to
	// 128 random bits in hex.
	NewKey func() string
}

type keyCtx struct{}

// WithKey returns ctx carrying key as the Idempotency-Key of the calls
// made with it. A caller that retries an operation (connect-go has no
// retry policy of its own: the caller's loop is the retry) passes the
// same ctx, or the same key (idemclient.Key derives one from the
// operation's data), on every attempt, so the server sees one operation.
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyCtx{}, key)
}

// ClientInterceptor returns a connect.UnaryInterceptorFunc for
// connect.WithInterceptors on a client: it sets the Idempotency-Key header
// of every guarded call to the key of WithKey, or keeps the one the
// request's header already has, or, without either, sets a fresh one. A
// key from the caller is checked with idem.ParseKey: an invalid one fails
// the call with ErrKeyInvalid, unsent.
func ClientInterceptor(cfg *ClientConfig) connect.UnaryInterceptorFunc {
	var c ClientConfig
	if cfg != nil {
		c = *cfg
	}
	if c.NewKey == nil {
		c.NewKey = randomKey
	}
	if c.Procedures == nil {
		c.Procedures = func(s connect.Spec) bool { return s.IdempotencyLevel != connect.IdempotencyNoSideEffects }
	}
	return func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if !req.Spec().IsClient || !c.Procedures(req.Spec()) {
				return next(ctx, req)
			}
			if k, ok := ctx.Value(keyCtx{}).(string); ok {
				req.Header().Set(idem.HeaderKey, k)
			}
			switch keys := req.Header().Values(idem.HeaderKey); len(keys) {
			case 0:
				req.Header().Set(idem.HeaderKey, c.NewKey())
			case 1:
				if _, err := idem.ParseKey(keys[0]); err != nil {
					return nil, fmt.Errorf("%w: %w", ErrKeyInvalid, err)
				}
			default:
				return nil, fmt.Errorf("%w: %d Idempotency-Key headers", ErrKeyInvalid, len(keys))
			}
			return next(ctx, req)
		}
	}
}

func randomKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
