package idemgrpc_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemgrpc"
	"github.com/idemkit/idem/idemgrpc/testsvc"
)

// TestClientOneKeyAcrossRetries: the server fails the first two attempts
// with Unavailable; grpc-go's retry policy retries, and every attempt
// carries the key the client interceptor attached once. The caller's own
// retry with WithKey carries its key. An invalid key is refused unsent.
func TestClientOneKeyAcrossRetries(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var seen []string
	fail := 2
	record := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, md.Get(idemgrpc.MetadataKey)...)
		if fail > 0 {
			fail--
			return nil, status.Error(codes.Unavailable, "try again")
		}
		return h(ctx, req)
	}
	addr, _ := serve(t, &testsvc.Service{}, grpc.ChainUnaryInterceptor(record))
	const retry = `{"methodConfig":[{"name":[{"service":"idem.test.v1.Charges"}],"retryPolicy":{"maxAttempts":4,"initialBackoff":"0.01s","maxBackoff":"0.05s","backoffMultiplier":2,"retryableStatusCodes":["UNAVAILABLE"]}}]}`
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(retry), grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	in := &structpb.Struct{}
	if err := conn.Invoke(t.Context(), testsvc.MethodCharge, in, &structpb.Struct{}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	got := append([]string(nil), seen...)
	seen = nil
	mu.Unlock()
	if len(got) != 3 || got[0] == "" || got[1] != got[0] || got[2] != got[0] {
		t.Fatalf("keys of the attempts: %q, want one key on 3 attempts", got)
	}
	if err := idem.ValidateKey(got[0]); err != nil {
		t.Fatalf("generated key %q: %v", got[0], err)
	}
	ctx := idemgrpc.WithKey(t.Context(), "order-7:charge")
	for range 2 {
		if err := conn.Invoke(ctx, testsvc.MethodCharge, in, &structpb.Struct{}); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	got = seen
	mu.Unlock()
	if len(got) != 2 || got[0] != "order-7:charge" || got[1] != got[0] {
		t.Fatalf("keys of the caller's retries: %q", got)
	}
	long := make([]byte, idem.MaxKeyLength+1)
	for i := range long {
		long[i] = 'k'
	}
	err = conn.Invoke(idemgrpc.WithKey(t.Context(), string(long)), testsvc.MethodCharge, in, &structpb.Struct{})
	if !errors.Is(err, idemgrpc.ErrKeyInvalid) || !errors.Is(err, idem.ErrKeyInvalid) {
		t.Fatalf("invalid key: %v", err)
	}
}
