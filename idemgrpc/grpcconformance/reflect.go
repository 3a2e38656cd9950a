package grpcconformance

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

// ErrResolve means a method could not be described by the server's
// reflection service (grpc.reflection.v1): the server does not run it,
// or does not know the method.
var ErrResolve = errors.New("grpcconformance: method not resolved by server reflection")

// Resolve describes fullMethod ("/pkg.Service/Method") by the gRPC server
// reflection service on conn, so that requests and responses can be built
// as dynamicpb messages without the service's generated code. ctx bounds
// the reflection call. Files the server does not send are taken from
// protoregistry.GlobalFiles (the well-known types).
func Resolve(ctx context.Context, conn grpc.ClientConnInterface, fullMethod string) (protoreflect.MethodDescriptor, error) {
	svc, method, ok := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	if !ok || svc == "" || method == "" || !strings.HasPrefix(fullMethod, "/") {
		return nil, fmt.Errorf("%w: %q is not a full method name (/pkg.Service/Method)", ErrResolve, fullMethod)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := rpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrResolve, err)
	}
	req := &rpb.ServerReflectionRequest{MessageRequest: &rpb.ServerReflectionRequest_FileContainingSymbol{FileContainingSymbol: svc}}
	if err := stream.Send(req); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrResolve, err)
	}
	resp, err := stream.Recv()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrResolve, err)
	}
	_ = stream.CloseSend()
	if e := resp.GetErrorResponse(); e != nil {
		return nil, fmt.Errorf("%w: %s: %s", ErrResolve, svc, e.GetErrorMessage())
	}
	set := &descriptorpb.FileDescriptorSet{}
	have := map[string]bool{}
	for _, b := range resp.GetFileDescriptorResponse().GetFileDescriptorProto() {
		fdp := &descriptorpb.FileDescriptorProto{}
		if err := proto.Unmarshal(b, fdp); err != nil {
			return nil, fmt.Errorf("%w: a file descriptor does not parse: %w", ErrResolve, err)
		}
		set.File = append(set.File, fdp)
		have[fdp.GetName()] = true
	}
	for i := 0; i < len(set.File); i++ {
		for _, dep := range set.File[i].GetDependency() {
			if have[dep] {
				continue
			}
			fd, err := protoregistry.GlobalFiles.FindFileByPath(dep)
			if err != nil {
				return nil, fmt.Errorf("%w: the server did not send %s", ErrResolve, dep)
			}
			set.File = append(set.File, protodesc.ToFileDescriptorProto(fd))
			have[dep] = true
		}
	}
	files, err := protodesc.NewFiles(set)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrResolve, err)
	}
	d, err := files.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrResolve, svc, err)
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil, fmt.Errorf("%w: %s is not a service", ErrResolve, svc)
	}
	md := sd.Methods().ByName(protoreflect.Name(method))
	if md == nil {
		return nil, fmt.Errorf("%w: %s has no method %s", ErrResolve, svc, method)
	}
	if md.IsStreamingClient() || md.IsStreamingServer() {
		return nil, fmt.Errorf("%w: %s is a streaming method; only unary methods are checked", ErrResolve, fullMethod)
	}
	return md, nil
}

// RequestFromJSON parses a request of md's input type from its protojson
// form.
func RequestFromJSON(md protoreflect.MethodDescriptor, js []byte) (proto.Message, error) {
	m := dynamicpb.NewMessage(md.Input())
	if err := protojson.Unmarshal(js, m); err != nil {
		return nil, fmt.Errorf("grpcconformance: %s request: %w", md.Input().FullName(), err)
	}
	return m, nil
}

// ResponseOf returns Target.NewResponse for md: a dynamicpb message of its
// output type.
func ResponseOf(md protoreflect.MethodDescriptor) func() proto.Message {
	return func() proto.Message { return dynamicpb.NewMessage(md.Output()) }
}
