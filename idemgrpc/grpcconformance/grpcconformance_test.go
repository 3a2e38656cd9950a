package grpcconformance_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"slices"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemkit/idem/idemgrpc"
	"github.com/idemkit/idem/idemgrpc/grpcconformance"
	"github.com/idemkit/idem/idemgrpc/testsvc"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/internal/testdb"
)

func principal(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if a := md.Get("authorization"); len(a) == 1 {
		return a[0], nil
	}
	return "", errors.New("no credentials")
}

func serve(t *testing.T, svc *testsvc.Service, opts ...grpc.ServerOption) *grpc.ClientConn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(opts...)
	testsvc.Register(s, svc)
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Serve(ln) }()
	t.Cleanup(func() { s.Stop(); <-done })
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func mustStruct(m map[string]any) *structpb.Struct {
	s, err := structpb.NewStruct(m)
	if err != nil {
		panic(err)
	}
	return s
}

func target(conn *grpc.ClientConn, svc *testsvc.Service) grpcconformance.Target {
	return grpcconformance.Target{
		Conn:          conn,
		Method:        testsvc.MethodCharge,
		AltMethod:     testsvc.MethodRefund,
		Request:       mustStruct(map[string]any{"order_id": "o-1", "amount_kopecks": 1000.0, "card": map[string]any{"last4": "4242"}}),
		ErrorRequest:  mustStruct(map[string]any{"order_id": "o-1", "fail_code": float64(codes.InvalidArgument)}),
		Metadata:      metadata.Pairs("authorization", "Bearer alice"),
		PrincipalB:    metadata.Pairs("authorization", "Bearer bob"),
		FaultMetadata: metadata.Pairs(testsvc.FaultKey, "1"),
		Hold:          svc.Hold,
		Count:         func(context.Context) (int64, error) { return svc.Calls.Load(), nil },
	}
}

// TestInterceptorPasses runs the whole suite against the interceptor over
// the local PostgreSQL in both modes: every check passes, none skipped.
func TestInterceptorPasses(t *testing.T) {
	t.Parallel()
	for _, mode := range []idempotency.Mode{idempotency.ModeTwoStep, idempotency.ModeTransactional} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			db := testdb.New(t)
			ic, err := idemgrpc.New(idempotency.NewPostgresStore(db.Pool), &idemgrpc.Config{Scope: principal, Idempotency: idempotency.Config{Mode: mode}})
			if err != nil {
				t.Fatal(err)
			}
			svc := &testsvc.Service{}
			conn := serve(t, svc, grpc.ChainUnaryInterceptor(ic.Unary))
			rep := grpcconformance.Check(t, target(conn, svc))
			if s := rep.Names(idemtest.Skip); len(s) != 0 {
				t.Fatalf("skipped: %v", s)
			}
		})
	}
}

// dropMarker is a defect: the replay's header metadata loses
// idempotent-replayed on its way out.
func dropMarker(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	return h(grpc.NewContextWithServerTransportStream(ctx, dropStream{grpc.ServerTransportStreamFromContext(ctx)}), req)
}

type dropStream struct{ grpc.ServerTransportStream }

func (d dropStream) SetHeader(md metadata.MD) error {
	md = md.Copy()
	delete(md, idemgrpc.MetadataReplayed)
	return d.ServerTransportStream.SetHeader(md)
}

// TestDefectsFailTheirCheck mirrors idemtest's mutant test: the real
// interceptor, misconfigured the way a defect breaks it, fails exactly its
// check, and the interceptor as configured by default fails none.
func TestDefectsFailTheirCheck(t *testing.T) {
	t.Parallel()
	testCases := []struct {
		name   string
		mutate func(c *idemgrpc.Config)
		outer  []grpc.UnaryServerInterceptor
		want   []string
	}{
		{"correct", func(*idemgrpc.Config) {}, nil, nil},
		// The fingerprint covers the amount only: a key reused with
		// another order (or another card, nested) replays.
		{"amount-only fingerprint", func(c *idemgrpc.Config) {
			c.Fingerprint = func(req proto.Message) ([]byte, error) {
				return proto.Marshal(req.(*structpb.Struct).GetFields()["amount_kopecks"])
			}
		}, nil, []string{idemtest.CheckMismatch}},
		// The replay goes out without idempotent-replayed.
		{"no replay marker", func(*idemgrpc.Config) {}, []grpc.UnaryServerInterceptor{dropMarker}, []string{idemtest.CheckReplay}},
		// Every method is one: a key used on Charge is refused on Refund.
		{"keys not scoped by method", func(c *idemgrpc.Config) {
			c.Idempotency.Route = func(*http.Request) string { return "/" }
		}, nil, []string{idemtest.CheckRoutes}},
	}
	for _, tt := range testCases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := &idemgrpc.Config{Scope: principal}
			tt.mutate(cfg)
			ic, err := idemgrpc.New(idempotency.NewMemoryStore(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			svc := &testsvc.Service{}
			conn := serve(t, svc, grpc.ChainUnaryInterceptor(append(tt.outer, ic.Unary)...))
			rep, err := grpcconformance.Run(t.Context(), target(conn, svc))
			if err != nil {
				t.Fatal(err)
			}
			if s := rep.Names(idemtest.Skip); len(s) != 0 {
				t.Errorf("skipped: %v", s)
			}
			if got := rep.Names(idemtest.Fail); !slices.Equal(got, tt.want) {
				for _, r := range rep.Results {
					t.Log(r)
				}
				t.Fatalf("failed %v, want %v", got, tt.want)
			}
		})
	}
}

// TestInvalidTarget: a Target without Conn, Method or Request is refused.
func TestInvalidTarget(t *testing.T) {
	t.Parallel()
	if _, err := grpcconformance.Run(t.Context(), grpcconformance.Target{}); !errors.Is(err, grpcconformance.ErrInvalidTarget) {
		t.Fatalf("empty Target: %v", err)
	}
}
