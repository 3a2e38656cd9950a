// Package grpcconformance checks a live gRPC method's Idempotency-Key
// behaviour: the checks of package idemtest (the HTTP suite), mapped to
// gRPC codes, plus a stored definitive error, with the report in
// idemtest's shape. It lives in the idemgrpc module and not in idemtest
// because idemtest is in the core module, which must not download grpc-go.
//
//	rep, err := grpcconformance.Run(ctx, grpcconformance.Target{
//		Conn:       conn,
//		Method:     "/shop.v1.Payments/Charge",
//		Request:    req,
//		AltMethod:  "/shop.v1.Payments/Refund",
//		Metadata:   metadata.Pairs("authorization", "Bearer alice"),
//		PrincipalB: metadata.Pairs("authorization", "Bearer bob"),
//	})
//
// In a test, Check runs each check as a subtest. `idem conformance --grpc
// ADDR --method M --request-json JSON` runs it from the command line,
// resolving the request type by server reflection.
//
// # The mapping
//
// missing key → InvalidArgument IDEMPOTENCY_KEY_REQUIRED; bad key →
// InvalidArgument IDEMPOTENCY_KEY_INVALID; reused key → FailedPrecondition
// IDEMPOTENCY_KEY_REUSED; in progress → Aborted IDEMPOTENCY_KEY_IN_PROGRESS
// with a RetryInfo (the reason is the ErrorInfo detail's); a replay
// carries the header metadata idempotent-replayed: true. idemtest's expiry
// check has no counterpart here.
package grpcconformance
