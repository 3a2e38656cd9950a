package idemgrpc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/idemkit/idem"
)

// ErrKeyInvalid is returned by a call whose key (from WithKey or the
// outgoing metadata) breaks idem's key rule; the call is not sent. It is
// also idem.ErrKeyInvalid.
var ErrKeyInvalid = fmt.Errorf("idemgrpc: %w", idem.ErrKeyInvalid)

// ClientConfig configures UnaryClientInterceptor. A nil *ClientConfig means
// all defaults.
type ClientConfig struct {
	// Methods reports whether calls of a full method name get a key.
	// Defaults to every method.
	Methods func(fullMethod string) bool
	// NewKey returns the key of a call whose caller gave none. Defaults to
	// 128 random bits in hex.
	NewKey func() string
}

// WithKey returns ctx carrying key as the idempotency-key of the calls
// made with it, replacing any the outgoing metadata had. A caller that
// retries an operation itself passes the same key (idemclient.Key derives
// one from the operation's data) on every attempt, so the server sees one
// operation.
func WithKey(ctx context.Context, key string) context.Context {
	md, _ := metadata.FromOutgoingContext(ctx)
	md = md.Copy()
	md.Set(MetadataKey, key)
	return metadata.NewOutgoingContext(ctx, md)
}

// UnaryClientInterceptor attaches an idempotency-key to every guarded call:
// the caller's (WithKey, or outgoing metadata that has one) or, without
// one, a fresh key per call. It attaches it before grpc-go's retry logic
// runs, so every attempt of the call that a retry policy (or a transparent
// retry) makes carries the same key, and the server runs the operation
// once. A key from the caller is checked with idem.ValidateKey: an invalid
// one fails the call with ErrKeyInvalid, unsent.
func UnaryClientInterceptor(cfg *ClientConfig) grpc.UnaryClientInterceptor {
	var c ClientConfig
	if cfg != nil {
		c = *cfg
	}
	if c.NewKey == nil {
		c.NewKey = randomKey
	}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if c.Methods != nil && !c.Methods(method) {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		md, _ := metadata.FromOutgoingContext(ctx)
		switch keys := md.Get(MetadataKey); len(keys) {
		case 0:
			ctx = WithKey(ctx, c.NewKey())
		case 1:
			if _, err := idem.ParseKey(keys[0]); err != nil {
				return fmt.Errorf("%w: %w", ErrKeyInvalid, err)
			}
		default:
			return fmt.Errorf("%w: %d keys in the outgoing metadata", ErrKeyInvalid, len(keys))
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
}

func randomKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
