// Package idemgrpc guards unary gRPC methods with Idempotency-Key: the
// semantics of package idempotency (principal scope, fingerprint, stored
// outcome and replay, in-progress answer, lease takeover, both modes) as a
// grpc.UnaryServerInterceptor, and a client interceptor that keeps one key
// across retries. It is a module of its own, so the core never downloads
// grpc-go.
//
//	ic, err := idemgrpc.New(idempotency.NewPostgresStore(pool), &idemgrpc.Config{
//		Scope:       principalFromContext, // func(ctx) (string, error)
//		Idempotency: idempotency.Config{Mode: idempotency.ModeTransactional},
//	})
//	s := grpc.NewServer(grpc.ChainUnaryInterceptor(recovery, auth, ic.Unary))
//	// in a handler: tx, _ := idemgrpc.Tx(ctx)
//
//	conn, err := grpc.NewClient(addr, grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(nil)))
//	err = conn.Invoke(idemgrpc.WithKey(ctx, "order-7:charge"), method, req, resp)
//
// The key is the idempotency-key metadata, under idem's key rule; the
// scope is Config.Scope's principal and the full method name; the
// fingerprint is the deterministic proto marshal of the request
// (Config.Fingerprint). The conformance suite is package
// idemgrpc/grpcconformance.
//
// # How it works
//
// It does not reimplement the protocol: each guarded call goes through an
// idempotency.Middleware as a synthetic request (POST, the full method as
// its path, the fingerprint bytes as its body), whose engine claims,
// stores, replays, renews the lease and runs the transaction. The handler
// runs as the guarded handler with the engine's context (the request's
// transaction in ModeTransactional); its outcome is stored as the response
// message's bytes or as the google.rpc.Status (code, message, details).
//
// # Outcomes and codes
//
//	handler returns / situation        stored?  a retry with the same key gets
//	a response (OK)                    yes      the same response bytes, idempotent-replayed: true
//	InvalidArgument, NotFound,         yes      the same status (code, message, details), replayed
//	  AlreadyExists, PermissionDenied,
//	  FailedPrecondition, OutOfRange,
//	  Unimplemented (DefaultStoreCode)
//	any other code, a panic            no       a fresh run (transactional: rolled back)
//	still running                      —        Aborted IDEMPOTENCY_KEY_IN_PROGRESS, RetryInfo
//	ran for another request            —        FailedPrecondition IDEMPOTENCY_KEY_REUSED
//	no key (PolicyRequired)            —        InvalidArgument IDEMPOTENCY_KEY_REQUIRED
//	a key breaking the rule, two keys  —        InvalidArgument IDEMPOTENCY_KEY_INVALID
//	Scope fails                        —        Unauthenticated IDEMPOTENCY_SCOPE_UNKNOWN
//	the store fails                    —        Unavailable IDEMPOTENCY_STORE_UNAVAILABLE, RetryInfo
//
// The reason is the Reason of an ErrorInfo detail (Domain ErrorDomain).
// RetryInfo's delay is what is left of the owner's lease, in whole
// seconds, at least 1 (the engine's Retry-After). A panic is re-raised
// after the release, for a recovery interceptor placed before this one.
//
// # What it does not do
//
// Streaming methods are not guarded. Header and trailer metadata that
// the handler sets are delivered on the first run and not stored. A
// replay after a restart decodes the stored bytes into the method's output
// type from protoregistry (generated code registers it); for a method not
// in the registry (a hand-written ServiceDesc) it returns an emptypb.Empty
// that carries them as unknown fields, the same bytes on the wire.
package idemgrpc
