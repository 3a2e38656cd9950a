// Package idemconnect guards unary Connect (connectrpc.com/connect)
// procedures with Idempotency-Key: the semantics of package idempotency
// (principal scope, fingerprint, stored outcome and replay, in-progress
// answer, lease takeover, both modes) as a connect.Interceptor, with
// Connect errors (codes and details) for idem's refusals, and a client
// interceptor that sets one key across the caller's retries. It is a
// module of its own, so the core never downloads connect-go.
//
//	ic, err := idemconnect.New(idempotency.NewPostgresStore(pool), &idemconnect.Config{
//		Scope:       principal, // func(ctx, connect.AnyRequest) (string, error)
//		Idempotency: idempotency.Config{Mode: idempotency.ModeTransactional},
//	})
//	mux.Handle(procedure, connect.NewUnaryHandler(procedure, charge, connect.WithInterceptors(ic)))
//	// in a handler: tx, _ := idemconnect.Tx(ctx)
//
//	client := connect.NewClient[In, Out](http.DefaultClient, url,
//		connect.WithInterceptors(idemconnect.ClientInterceptor(nil)))
//	resp, err := client.CallUnary(idemconnect.WithKey(ctx, "order-7:charge"), req)
//
// The key is the Idempotency-Key request header, under idem's key rule;
// the scope is Config.Scope's principal and the procedure; the
// fingerprint is the deterministic proto marshal of the request message,
// so a JSON and a binary client send the same request.
//
// # How it works
//
// As idemgrpc, it does not reimplement the protocol: each guarded call
// goes through an idempotency.Middleware as a synthetic request (POST, the
// procedure as its path, the fingerprint bytes as its body), whose engine
// claims, stores, replays, renews the lease and runs the transaction. The
// handler runs as the guarded handler with the engine's context (the
// request's transaction in ModeTransactional); its outcome is stored as
// the response message (a google.protobuf.Any: type name and bytes) or as
// a google.rpc.Status (code, message, details). Because it works on
// messages, not on the HTTP exchange, it guards the Connect, gRPC and
// gRPC-Web protocols alike, and a replay is encoded in the retry's own
// codec and compression.
//
// # Outcomes and codes
//
//	handler returns / situation        stored?  a retry with the same key gets
//	a response                         yes      the same message, Idempotent-Replayed: true
//	InvalidArgument, NotFound,         yes      the same error (code, message, details), replayed
//	  AlreadyExists, PermissionDenied,
//	  FailedPrecondition, OutOfRange,
//	  Unimplemented (DefaultStoreCode)
//	any other code, a panic            no       a fresh run (transactional: rolled back)
//	still running                      —        Aborted IDEMPOTENCY_KEY_IN_PROGRESS, RetryInfo, Retry-After
//	ran for another request            —        FailedPrecondition IDEMPOTENCY_KEY_REUSED
//	no key (PolicyRequired)            —        InvalidArgument IDEMPOTENCY_KEY_REQUIRED
//	a key breaking the rule, two keys  —        InvalidArgument IDEMPOTENCY_KEY_INVALID
//	Scope fails                        —        Unauthenticated IDEMPOTENCY_SCOPE_UNKNOWN
//	the store fails                    —        Unavailable IDEMPOTENCY_STORE_UNAVAILABLE, RetryInfo, Retry-After
//
// The reason is the Reason of an ErrorInfo detail (Domain ErrorDomain).
// Streaming procedures are not guarded. Headers and trailers the handler
// sets go out on the first run only. A replay rebuilds the response from
// the protobuf registry by its stored type name (generated code and the
// well-known types register theirs).
package idemconnect
