package idemconnect_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemconnect"
	"github.com/idemkit/idem/idempotency"
)

// A procedure guarded by the interceptor and a client that keeps one key
// for its two attempts: the second is the replay of the first.
func ExampleNew() {
	ic, err := idemconnect.New(idempotency.NewMemoryStore(), &idemconnect.Config{
		Scope: func(context.Context, connect.AnyRequest) (string, error) { return "alice", nil }, // from your auth
	})
	if err != nil {
		panic(err)
	}
	const charge = "/shop.v1.Payments/Charge"
	runs := 0
	mux := http.NewServeMux()
	mux.Handle(charge, connect.NewUnaryHandler(charge,
		func(_ context.Context, _ *connect.Request[structpb.Struct]) (*connect.Response[structpb.Struct], error) {
			runs++
			out, _ := structpb.NewStruct(map[string]any{"run": float64(runs)})
			return connect.NewResponse(out), nil
		},
		connect.WithInterceptors(ic)))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	c := connect.NewClient[structpb.Struct, structpb.Struct](srv.Client(), srv.URL+charge,
		connect.WithProtoJSON(), connect.WithInterceptors(idemconnect.ClientInterceptor(nil)))
	ctx := idemconnect.WithKey(context.Background(), "order-7:charge")
	for range 2 {
		resp, err := c.CallUnary(ctx, connect.NewRequest(&structpb.Struct{}))
		if err != nil {
			panic(err)
		}
		fmt.Println("run", resp.Msg.GetFields()["run"].GetNumberValue(), "replayed", resp.Header().Get(idem.HeaderReplayed) == "true")
	}
	fmt.Println("executions", runs)
	// Output:
	// run 1 replayed false
	// run 1 replayed true
	// executions 1
}
