package idemconnect_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemconnect"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/internal/testdb"
)

// Procedures of the test service; no codegen: structpb.Struct in and out.
const (
	procCharge = "/test.v1.Payments/Charge"
	procRefund = "/test.v1.Payments/Refund"
	procGet    = "/test.v1.Payments/Get"
)

// principal is the test's Scope: the Authorization header.
func principal(_ context.Context, req connect.AnyRequest) (string, error) {
	if a := req.Header().Get("Authorization"); a != "" {
		return a, nil
	}
	return "", errors.New("no credentials")
}

// service is the test service. Each execution inserts one row of effect
// (through the request's transaction in ModeTransactional) and answers
// {"id": row id}; a request with "fail_code" n then returns Connect code
// n instead, and "panic" true panics after the write. A request with an
// X-Test-Fault header (or while failNext is positive) gets Unavailable
// before the write.
type service struct {
	pool  *pgxpool.Pool
	calls atomic.Int64
	keys  sync.Map // Idempotency-Key seen → executions
	mu    sync.Mutex
	gate  chan struct{} // nil: open
	// failNext answers that many executions Unavailable before the write.
	failNext atomic.Int64
}

// hold makes executions wait (after they start) until release.
func (s *service) hold() (release func()) {
	ch := make(chan struct{})
	s.mu.Lock()
	s.gate = ch
	s.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			s.gate = nil
			s.mu.Unlock()
			close(ch)
		})
	}
}

func (s *service) handle(ctx context.Context, req *connect.Request[structpb.Struct]) (*connect.Response[structpb.Struct], error) {
	s.calls.Add(1)
	n, _ := s.keys.LoadOrStore(req.Header().Get(idem.HeaderKey), new(atomic.Int64))
	n.(*atomic.Int64).Add(1)
	s.mu.Lock()
	gate := s.gate
	s.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, connect.NewError(connect.CodeCanceled, ctx.Err())
		}
	}
	if s.failNext.Add(-1) >= 0 || req.Header().Get("X-Test-Fault") != "" {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("test fault"))
	}
	const insert = "INSERT INTO effect DEFAULT VALUES RETURNING id"
	var id int64
	var err error
	if tx, ok := idemconnect.Tx(ctx); ok {
		err = tx.QueryRow(ctx, insert).Scan(&id)
	} else {
		err = s.pool.QueryRow(ctx, insert).Scan(&id)
	}
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	f := req.Msg.GetFields()
	if f["panic"].GetBoolValue() {
		panic("test panic")
	}
	if c := connect.Code(f["fail_code"].GetNumberValue()); c != 0 {
		ce := connect.NewError(c, fmt.Errorf("failed with %s after row %d", c, id))
		if d, err := connect.NewErrorDetail(&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "fail_code"}}}); err == nil {
			ce.AddDetail(d)
		}
		return nil, ce
	}
	out, _ := structpb.NewStruct(map[string]any{"id": float64(id), "procedure": req.Spec().Procedure})
	resp := connect.NewResponse(out)
	resp.Header().Set("Content-Language", "en")
	return resp, nil
}

type bundle struct {
	pool *pgxpool.Pool
	svc  *service
	srv  *httptest.Server
	mux  *http.ServeMux
	ic   *idemconnect.Interceptor
}

// setup serves the test service behind the interceptor over the local
// PostgreSQL, a panic answered Internal by connect.WithRecover.
func setup(t *testing.T, cfg *idemconnect.Config) *bundle {
	t.Helper()
	return setupStore(t, cfg, func(p *pgxpool.Pool) *idempotency.PostgresStore { return idempotency.NewPostgresStore(p) })
}

// setupStore is setup with the store newStore makes of the test's pool.
func setupStore(t *testing.T, cfg *idemconnect.Config, newStore func(*pgxpool.Pool) *idempotency.PostgresStore) *bundle {
	t.Helper()
	db := testdb.New(t)
	if _, err := db.Pool.Exec(t.Context(), "CREATE TABLE effect (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	if cfg.Scope == nil {
		cfg.Scope = principal
	}
	ic, err := idemconnect.New(newStore(db.Pool), cfg)
	if err != nil {
		t.Fatal(err)
	}
	b := &bundle{pool: db.Pool, svc: &service{pool: db.Pool}, mux: http.NewServeMux(), ic: ic}
	opts := []connect.HandlerOption{
		connect.WithInterceptors(ic),
		connect.WithRecover(func(_ context.Context, _ connect.Spec, _ http.Header, v any) error {
			return connect.NewError(connect.CodeInternal, fmt.Errorf("panic: %v", v))
		}),
	}
	b.mux.Handle(procCharge, connect.NewUnaryHandler(procCharge, b.svc.handle, opts...))
	b.mux.Handle(procRefund, connect.NewUnaryHandler(procRefund, b.svc.handle, opts...))
	b.mux.Handle(procGet, connect.NewUnaryHandler(procGet, b.svc.handle, append(opts, connect.WithIdempotency(connect.IdempotencyNoSideEffects))...))
	b.srv = httptest.NewServer(b.mux)
	t.Cleanup(b.srv.Close)
	return b
}

func (b *bundle) effects(t *testing.T) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), "SELECT count(*) FROM effect").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// client is a Connect client of procedure; JSON unless binary.
func (b *bundle) client(procedure string, binary bool, opts ...connect.ClientOption) *connect.Client[structpb.Struct, structpb.Struct] {
	if !binary {
		opts = append(opts, connect.WithProtoJSON())
	}
	return connect.NewClient[structpb.Struct, structpb.Struct](b.srv.Client(), b.srv.URL+procedure, opts...)
}

type answer struct {
	resp     *structpb.Struct
	header   http.Header
	err      error
	replayed bool
}

// call calls c with key (none if empty) as alice.
func call(ctx context.Context, c *connect.Client[structpb.Struct, structpb.Struct], key string, msg map[string]any) answer {
	return callAs(ctx, c, "alice", key, msg)
}

// callAs calls c with key (none if empty) as who (no Authorization if
// empty).
func callAs(ctx context.Context, c *connect.Client[structpb.Struct, structpb.Struct], who, key string, msg map[string]any) answer {
	in, err := structpb.NewStruct(msg)
	if err != nil {
		return answer{err: err}
	}
	req := connect.NewRequest(in)
	if who != "" {
		req.Header().Set("Authorization", who)
	}
	if key != "" {
		req.Header().Set(idem.HeaderKey, key)
	}
	resp, err := c.CallUnary(ctx, req)
	if err != nil {
		var ce *connect.Error
		a := answer{err: err}
		if errors.As(err, &ce) {
			a.header = ce.Meta()
			a.replayed = ce.Meta().Get(idem.HeaderReplayed) == "true"
		}
		return a
	}
	return answer{resp: resp.Msg, header: resp.Header(), replayed: resp.Header().Get(idem.HeaderReplayed) == "true"}
}

func (a answer) id() float64 { return a.resp.GetFields()["id"].GetNumberValue() }

func (a answer) String() string {
	if a.err != nil {
		return fmt.Sprintf("error %v (replayed=%v)", a.err, a.replayed)
	}
	return fmt.Sprintf("ok id=%v (replayed=%v)", a.id(), a.replayed)
}

// reason returns the ErrorInfo reason and the RetryInfo delay (-1: none)
// of err.
func reason(err error) (string, float64) {
	var r string
	var d float64 = -1
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return "", d
	}
	for _, x := range ce.Details() {
		v, err := x.Value()
		if err != nil {
			continue
		}
		switch v := v.(type) {
		case *errdetails.ErrorInfo:
			r = v.GetReason()
		case *errdetails.RetryInfo:
			d = v.GetRetryDelay().AsDuration().Seconds()
		}
	}
	return r, d
}

var modes = []idempotency.Mode{idempotency.ModeTwoStep, idempotency.ModeTransactional}
