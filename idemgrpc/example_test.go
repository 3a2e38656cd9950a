package idemgrpc_test

import (
	"context"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemkit/idem/idemgrpc"
	"github.com/idemkit/idem/idemgrpc/testsvc"
	"github.com/idemkit/idem/idempotency"
)

// A server guarded by the interceptor and a client that keeps one key for
// its two attempts: the second is the replay of the first.
func ExampleNew() {
	ic, err := idemgrpc.New(idempotency.NewMemoryStore(), &idemgrpc.Config{
		Scope: func(context.Context) (string, error) { return "alice", nil }, // from your auth interceptor
	})
	if err != nil {
		panic(err)
	}
	s := grpc.NewServer(grpc.ChainUnaryInterceptor(ic.Unary))
	svc := &testsvc.Service{}
	testsvc.Register(s, svc)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go func() { _ = s.Serve(ln) }()
	defer s.Stop()

	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(idemgrpc.UnaryClientInterceptor(nil)))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	ctx := idemgrpc.WithKey(context.Background(), "order-7:charge")
	for range 2 {
		var hdr metadata.MD
		out := &structpb.Struct{}
		if err := conn.Invoke(ctx, testsvc.MethodCharge, &structpb.Struct{}, out, grpc.Header(&hdr)); err != nil {
			panic(err)
		}
		fmt.Println("id", out.GetFields()["id"].GetNumberValue(), "replayed", hdr.Get(idemgrpc.MetadataReplayed))
	}
	fmt.Println("executions", svc.Calls.Load())
	// Output:
	// id 1 replayed []
	// id 1 replayed [true]
	// executions 1
}
