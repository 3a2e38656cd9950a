// Package testsvc is a small gRPC service for the tests and examples of
// idemgrpc and its conformance suite: idem.test.v1.Charges, whose methods
// Charge and Refund take and return a google.protobuf.Struct. Its file
// descriptor is built in Go and registered in protoregistry.GlobalFiles,
// so that no protoc is needed and gRPC server reflection can describe it
// (what `idem conformance --grpc` resolves the request type by).
//
//	s := grpc.NewServer(grpc.ChainUnaryInterceptor(ic.Unary))
//	svc := &testsvc.Service{}
//	testsvc.Register(s, svc)
//
// Each call executes once (Service.Calls counts them) unless its metadata
// has FaultKey (Unavailable, no execution) or its request has a negative
// "amount_kopecks" (InvalidArgument: a definitive refusal, no execution).
// A request member "fail_code" (a gRPC code number) makes an execution
// fail with that code, "panic": true makes it panic, after Effect ran.
package testsvc

import (
	"context"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/structpb"
)

// Names of the service.
const (
	ServiceName  = "idem.test.v1.Charges"
	MethodCharge = "/" + ServiceName + "/Charge"
	MethodRefund = "/" + ServiceName + "/Refund"
	// FaultKey in a call's metadata makes it fail with Unavailable
	// without executing.
	FaultKey = "x-idem-fault"
)

func init() {
	msg := ".google.protobuf.Struct"
	fdp := &descriptorpb.FileDescriptorProto{
		Name:       proto.String("idem/test/v1/charges.proto"),
		Package:    proto.String("idem.test.v1"),
		Dependency: []string{"google/protobuf/struct.proto"},
		Syntax:     proto.String("proto3"),
		Service: []*descriptorpb.ServiceDescriptorProto{{
			Name: proto.String("Charges"),
			Method: []*descriptorpb.MethodDescriptorProto{
				{Name: proto.String("Charge"), InputType: &msg, OutputType: &msg},
				{Name: proto.String("Refund"), InputType: &msg, OutputType: &msg},
			},
		}},
	}
	fd, err := protodesc.NewFile(fdp, protoregistry.GlobalFiles)
	if err != nil {
		panic(err)
	}
	if err := protoregistry.GlobalFiles.RegisterFile(fd); err != nil {
		panic(err)
	}
}

// Service implements Charges. The zero Service is ready.
type Service struct {
	// Effect performs one execution and returns its id. Defaults to the
	// value of Calls after counting the call.
	Effect func(ctx context.Context, method string, req *structpb.Struct) (int64, error)
	// Calls counts executions (calls that reached Effect).
	Calls atomic.Int64

	mu      sync.Mutex
	held    chan struct{}
	waiting atomic.Int64
}

// Waiting is how many calls wait at Hold's gate.
func (s *Service) Waiting() int64 { return s.waiting.Load() }

// Hold makes calls wait before they execute until release is called (or
// their context ends: Canceled, no execution). release is idempotent.
func (s *Service) Hold() (release func()) {
	s.mu.Lock()
	ch := make(chan struct{})
	s.held = ch
	s.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			if s.held == ch {
				s.held = nil
			}
			s.mu.Unlock()
			close(ch)
		})
	}
}

func (s *Service) handle(ctx context.Context, method string, req *structpb.Struct) (*structpb.Struct, error) {
	if md, _ := metadata.FromIncomingContext(ctx); len(md.Get(FaultKey)) > 0 {
		return nil, status.Error(codes.Unavailable, "testsvc: injected fault")
	}
	if v, ok := req.GetFields()["amount_kopecks"]; ok && v.GetNumberValue() < 0 {
		return nil, status.Error(codes.InvalidArgument, "testsvc: negative amount")
	}
	s.mu.Lock()
	held := s.held
	s.mu.Unlock()
	if held != nil {
		s.waiting.Add(1)
		defer s.waiting.Add(-1)
		select {
		case <-held:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	id := s.Calls.Add(1)
	if s.Effect != nil {
		var err error
		if id, err = s.Effect(ctx, method, req); err != nil {
			return nil, err
		}
	}
	if v, ok := req.GetFields()["fail_code"]; ok && v.GetNumberValue() > 0 {
		return nil, status.Error(codes.Code(v.GetNumberValue()), "testsvc: fail_code")
	}
	if req.GetFields()["panic"].GetBoolValue() {
		panic("testsvc: panic requested")
	}
	return structpb.NewStruct(map[string]any{"id": float64(id), "method": method})
}

type handler interface {
	handle(ctx context.Context, method string, req *structpb.Struct) (*structpb.Struct, error)
}

func unary(name string) grpc.MethodDesc {
	full := "/" + ServiceName + "/" + name
	return grpc.MethodDesc{
		MethodName: name,
		Handler: func(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			in := &structpb.Struct{}
			if err := dec(in); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, req any) (any, error) {
				return srv.(handler).handle(ctx, full, req.(*structpb.Struct))
			}
			if ic == nil {
				return h(ctx, in)
			}
			return ic(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: full}, h)
		},
	}
}

// Desc is the service's grpc.ServiceDesc.
var Desc = grpc.ServiceDesc{
	ServiceName: ServiceName,
	HandlerType: (*handler)(nil),
	Methods:     []grpc.MethodDesc{unary("Charge"), unary("Refund")},
	Metadata:    "idem/test/v1/charges.proto",
}

// Register registers s on r.
func Register(r grpc.ServiceRegistrar, s *Service) { r.RegisterService(&Desc, s) }
