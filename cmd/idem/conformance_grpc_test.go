package main

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemkit/idem/idemgrpc"
	"github.com/idemkit/idem/idemgrpc/testsvc"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/idemtest"
)

// serveGRPC serves testsvc behind idemgrpc's interceptor (configured by
// cfg, scope = authorization metadata) with server reflection, on a
// loopback port; it returns the address.
func serveGRPC(t *testing.T, cfg *idemgrpc.Config) string {
	t.Helper()
	cfg.Scope = func(ctx context.Context) (string, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		if a := md.Get("authorization"); len(a) == 1 {
			return a[0], nil
		}
		return "", errors.New("no credentials")
	}
	ic, err := idemgrpc.New(idempotency.NewMemoryStore(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.ChainUnaryInterceptor(ic.Unary))
	testsvc.Register(s, &testsvc.Service{})
	reflection.Register(s)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Serve(ln) }()
	t.Cleanup(func() { s.Stop(); <-done })
	return ln.Addr().String()
}

const grpcRequest = `{"order_id":"o-1","amount_kopecks":1000,"card":{"last4":"4242"}}`

// TestConformanceCLIGRPC runs the built binary with --grpc against a real
// gRPC server: the request type is resolved by server reflection, every
// check passes (retry-after may skip: it races without a hold), exit 0.
func TestConformanceCLIGRPC(t *testing.T) {
	t.Parallel()
	addr := serveGRPC(t, &idemgrpc.Config{})
	stdout, stderr, code := runIdem(t, nil, "conformance", "--json",
		"--grpc", addr, "--method", testsvc.MethodCharge, "--request-json", grpcRequest,
		"--alt-method", testsvc.MethodRefund,
		"--error-request-json", `{"amount_kopecks":-1}`,
		"--header", "authorization: Bearer alice",
		"--principal-b-header", "authorization: Bearer bob",
		"--fault-header", testsvc.FaultKey+": 1")
	if code != 0 || stderr != "" {
		t.Fatalf("exit %d, stderr %q\n%s", code, stderr, stdout)
	}
	var rep idemtest.Report
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("--json output is not a report: %v\n%s", err, stdout)
	}
	if len(rep.Results) != 12 {
		t.Fatalf("%d checks, want 12\n%s", len(rep.Results), stdout)
	}
	for _, r := range rep.Results {
		if r.Status != idemtest.Pass && (r.Name != idemtest.CheckRetryAfter || r.Status != idemtest.Skip) {
			t.Errorf("%s: %s %s", r.Name, r.Status, r.Reason)
		}
	}
}

// TestConformanceCLIGRPCDefect: an interceptor whose fingerprint covers
// the amount only fails mismatch, exit 1; a method the server does not
// have is an error, and a missing --request-json is bad usage (exit 2).
func TestConformanceCLIGRPCDefect(t *testing.T) {
	t.Parallel()
	addr := serveGRPC(t, &idemgrpc.Config{Fingerprint: func(req proto.Message) ([]byte, error) {
		return proto.Marshal(req.(*structpb.Struct).GetFields()["amount_kopecks"])
	}})
	stdout, stderr, code := runIdem(t, nil, "conformance", "--grpc", addr, "--method", testsvc.MethodCharge,
		"--request-json", grpcRequest, "--header", "authorization: Bearer alice")
	if code != 1 || !strings.Contains(stderr, "checks failed: mismatch") || !strings.Contains(stdout, "changed .fields[order_id]") {
		t.Fatalf("exit %d, stderr %q, want 1 naming mismatch\n%s", code, stderr, stdout)
	}
	if _, stderr, code := runIdem(t, nil, "conformance", "--grpc", addr, "--method", "/idem.test.v1.Charges/Nope", "--request-json", "{}"); code != 1 || !strings.Contains(stderr, "has no method Nope") {
		t.Fatalf("unknown method: exit %d, stderr %q", code, stderr)
	}
	if _, stderr, code := runIdem(t, nil, "conformance", "--grpc", addr, "--method", testsvc.MethodCharge); code != 2 || !strings.Contains(stderr, "--request-json") {
		t.Fatalf("no request: exit %d, stderr %q", code, stderr)
	}
}
