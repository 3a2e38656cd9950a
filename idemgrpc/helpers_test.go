package idemgrpc_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemkit/idem/idemgrpc"
	"github.com/idemkit/idem/idemgrpc/testsvc"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/testdb"
)

// principal is the test's Scope: the authorization metadata.
func principal(ctx context.Context) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if a := md.Get("authorization"); len(a) == 1 {
		return a[0], nil
	}
	return "", errors.New("no credentials")
}

// recovery turns a panic into Internal, as a recovery interceptor placed
// before idemgrpc does.
func recovery(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (res any, err error) {
	defer func() {
		if v := recover(); v != nil {
			res, err = nil, status.Errorf(codes.Internal, "panic: %v", v)
		}
	}()
	return h(ctx, req)
}

type bundle struct {
	pool *pgxpool.Pool
	svc  *testsvc.Service
	conn *grpc.ClientConn
	addr string
}

// setup serves testsvc behind the interceptor over the local PostgreSQL;
// every execution inserts one row of effect (through the request's
// transaction in ModeTransactional).
func setup(t *testing.T, cfg *idemgrpc.Config) *bundle {
	t.Helper()
	db := testdb.New(t)
	if _, err := db.Pool.Exec(t.Context(), "CREATE TABLE effect (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	if cfg.Scope == nil {
		cfg.Scope = principal
	}
	ic, err := idemgrpc.New(idempotency.NewPostgresStore(db.Pool), cfg)
	if err != nil {
		t.Fatal(err)
	}
	b := &bundle{pool: db.Pool, svc: &testsvc.Service{}}
	b.svc.Effect = func(ctx context.Context, _ string, _ *structpb.Struct) (int64, error) {
		const insert = "INSERT INTO effect DEFAULT VALUES RETURNING id"
		var id int64
		var err error
		if tx, ok := idemgrpc.Tx(ctx); ok {
			err = tx.QueryRow(ctx, insert).Scan(&id)
		} else {
			err = db.Pool.QueryRow(ctx, insert).Scan(&id)
		}
		return id, err
	}
	b.addr, b.conn = serve(t, b.svc, grpc.ChainUnaryInterceptor(recovery, ic.Unary))
	return b
}

func serve(t *testing.T, svc *testsvc.Service, opts ...grpc.ServerOption) (string, *grpc.ClientConn) {
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
	return ln.Addr().String(), conn
}

func (b *bundle) effects(t *testing.T) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), "SELECT count(*) FROM effect").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

type answer struct {
	resp     *structpb.Struct
	err      error
	replayed bool
}

// call invokes method with key (none if empty) as alice.
func call(ctx context.Context, conn grpc.ClientConnInterface, method, key string, req map[string]any) answer {
	pairs := []string{"authorization", "alice"}
	if key != "" {
		pairs = append(pairs, idemgrpc.MetadataKey, key)
	}
	ctx = metadata.NewOutgoingContext(ctx, metadata.Pairs(pairs...))
	in, err := structpb.NewStruct(req)
	if err != nil {
		return answer{err: err}
	}
	var hdr metadata.MD
	out := &structpb.Struct{}
	err = conn.Invoke(ctx, method, in, out, grpc.Header(&hdr))
	a := answer{err: err, replayed: len(hdr.Get(idemgrpc.MetadataReplayed)) == 1 && hdr.Get(idemgrpc.MetadataReplayed)[0] == "true"}
	if err == nil {
		a.resp = out
	}
	return a
}

func (a answer) id() float64 { return a.resp.GetFields()["id"].GetNumberValue() }

func (a answer) String() string {
	if a.err != nil {
		return fmt.Sprintf("error %v (replayed=%v)", a.err, a.replayed)
	}
	return fmt.Sprintf("ok id=%v (replayed=%v)", a.id(), a.replayed)
}

// reason returns the ErrorInfo reason and the RetryInfo delay of err.
func reason(err error) (string, float64) {
	var r string
	var d float64 = -1
	for _, x := range status.Convert(err).Details() {
		switch v := x.(type) {
		case *errdetails.ErrorInfo:
			r = v.GetReason()
		case *errdetails.RetryInfo:
			d = v.GetRetryDelay().AsDuration().Seconds()
		}
	}
	return r, d
}

var modes = []idempotency.Mode{idempotency.ModeTwoStep, idempotency.ModeTransactional}
