package grpcconformance

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/emptypb"
)

// Defaults of Target.
const (
	ConcurrencyDefault   = 10
	CallTimeoutDefault   = 30 * time.Second
	HoldTimeoutDefault   = 3 * time.Second
	SettleTimeoutDefault = 10 * time.Second
)

// ErrInvalidTarget is returned by Run for a Target that cannot be checked;
// the message names the field.
var ErrInvalidTarget = errors.New("grpcconformance: invalid Target")

// Target is the gRPC method under test and what the checks may use.
type Target struct {
	// Conn carries every call. Required.
	Conn grpc.ClientConnInterface
	// Method is the full method name checked ("/pkg.Service/Method").
	// Required.
	Method string
	// Request is a request the method answers with OK. Required.
	Request proto.Message
	// NewResponse returns an empty response message; responses are
	// compared by their deterministic marshal. Defaults to the method's
	// output type as protoregistry.GlobalFiles describes it (generated
	// code registers it), else emptypb.Empty, whose unknown fields keep
	// the bytes as they came: then a response with a map field may differ
	// from its replay in order only, so set NewResponse.
	NewResponse func() proto.Message
	// MismatchRequest is a second valid request, different from Request,
	// for the mismatch check, which also sends Request with each of its
	// fields changed in turn (nested ones, map entries and
	// google.protobuf.Struct members included). Defaults to none: only the
	// variants.
	MismatchRequest proto.Message
	// AltMethod is another guarded method of the service that answers
	// AltRequest with OK: the routes check sends one key to Method and
	// then to AltMethod, two independent operations (a key is scoped by
	// the method). Defaults to none: the routes check is skipped.
	AltMethod string
	// AltRequest is the request sent to AltMethod. Defaults to Request.
	AltRequest proto.Message
	// ErrorRequest is a request the method refuses with a definitive error
	// (InvalidArgument, NotFound, …): the stored-error check expects it to
	// be stored and replayed. Defaults to none: the check is skipped.
	ErrorRequest proto.Message
	// Metadata is sent on every call: the first principal's credentials.
	// Defaults to none.
	Metadata metadata.MD
	// PrincipalB is set over Metadata (each key replaces Metadata's
	// values) to act as a second principal. Defaults to none: the
	// principals check is skipped.
	PrincipalB metadata.MD
	// FaultMetadata, added to a call, makes the method fail with a
	// released code (Unavailable, Internal, …) without executing.
	// Defaults to none: the server-error-released check is skipped.
	FaultMetadata metadata.MD
	// Hold, when set, makes the method's executions block until release
	// is called, so that retry-after sees the in-progress answer for sure.
	// Defaults to none: retry-after races calls and may be skipped.
	Hold func() (release func())
	// Count reads back how many times the method has executed. Defaults
	// to none: executions are inferred from the responses (distinct
	// response bytes count as distinct executions).
	Count func(ctx context.Context) (int64, error)
	// Concurrency is how many calls race on one key. Defaults to 10.
	Concurrency int
	// CallTimeout bounds each call. Defaults to 30s.
	CallTimeout time.Duration
	// HoldTimeout bounds how long retry-after holds the method. Defaults
	// to 3s.
	HoldTimeout time.Duration
	// SettleTimeout bounds the wait for an in-progress key to complete.
	// Defaults to 10s.
	SettleTimeout time.Duration
}

func (t Target) withDefaults() (Target, error) {
	switch {
	case t.Conn == nil:
		return t, fmt.Errorf("%w: Conn is required", ErrInvalidTarget)
	case t.Method == "" || t.Method[0] != '/':
		return t, fmt.Errorf("%w: Method must be a full method name (/pkg.Service/Method), got %q", ErrInvalidTarget, t.Method)
	case t.Request == nil:
		return t, fmt.Errorf("%w: Request is required", ErrInvalidTarget)
	case t.Concurrency < 0:
		return t, fmt.Errorf("%w: Concurrency %d is negative", ErrInvalidTarget, t.Concurrency)
	}
	if t.NewResponse == nil {
		t.NewResponse = registered(t.Method)
	}
	if t.AltRequest == nil {
		t.AltRequest = t.Request
	}
	if t.Concurrency == 0 {
		t.Concurrency = ConcurrencyDefault
	}
	if t.CallTimeout <= 0 {
		t.CallTimeout = CallTimeoutDefault
	}
	if t.HoldTimeout <= 0 {
		t.HoldTimeout = HoldTimeoutDefault
	}
	if t.SettleTimeout <= 0 {
		t.SettleTimeout = SettleTimeoutDefault
	}
	return t, nil
}

// variant is the request with one field changed.
type variant struct {
	path string
	req  proto.Message
}

// variants returns req with each scalar leaf changed in turn: fields,
// nested messages, map entries and the first element of lists, so that a
// fingerprint that misses any part of the request is caught.
func variants(req proto.Message) []variant {
	root := proto.Clone(req)
	var out []variant
	emit := func(path string) { out = append(out, variant{path, proto.Clone(root)}) }
	var walk func(m protoreflect.Message, path string)
	walk = func(m protoreflect.Message, path string) {
		var fds []protoreflect.FieldDescriptor
		m.Range(func(fd protoreflect.FieldDescriptor, _ protoreflect.Value) bool {
			fds = append(fds, fd)
			return true
		})
		sort.Slice(fds, func(i, j int) bool { return fds[i].Number() < fds[j].Number() })
		for _, fd := range fds {
			p := path + "." + string(fd.Name())
			switch {
			case fd.IsMap():
				mp := m.Mutable(fd).Map()
				var keys []protoreflect.MapKey
				mp.Range(func(k protoreflect.MapKey, _ protoreflect.Value) bool { keys = append(keys, k); return true })
				sort.Slice(keys, func(i, j int) bool { return keys[i].String() < keys[j].String() })
				for _, k := range keys {
					kp := fmt.Sprintf("%s[%s]", p, k.String())
					if fd.MapValue().Message() != nil {
						walk(mp.Mutable(k).Message(), kp)
						continue
					}
					orig := mp.Get(k)
					mp.Set(k, changed(fd.MapValue(), orig))
					emit(kp)
					mp.Set(k, orig)
				}
			case fd.IsList():
				l := m.Mutable(fd).List()
				if l.Len() == 0 {
					continue
				}
				if fd.Message() != nil {
					walk(l.Get(0).Message(), p+"[0]")
					continue
				}
				orig := l.Get(0)
				l.Set(0, changed(fd, orig))
				emit(p + "[0]")
				l.Set(0, orig)
			case fd.Message() != nil:
				walk(m.Mutable(fd).Message(), p)
			default:
				orig := m.Get(fd)
				m.Set(fd, changed(fd, orig))
				emit(p)
				m.Set(fd, orig)
			}
		}
	}
	walk(root.ProtoReflect(), "")
	return out
}

// changed returns a different value of fd's kind.
func changed(fd protoreflect.FieldDescriptor, v protoreflect.Value) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(!v.Bool())
	case protoreflect.EnumKind:
		return protoreflect.ValueOfEnum(v.Enum() + 1)
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(int32(v.Int()) + 1)
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(v.Int() + 1)
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(uint32(v.Uint()) + 1)
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(v.Uint() + 1)
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(float32(v.Float()) + 1)
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(v.Float() + 1)
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(v.String() + "-idemtest")
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes(append(append([]byte(nil), v.Bytes()...), 'x'))
	}
	return v
}

// registered returns a constructor of fullMethod's output type from the
// protobuf registry, or of emptypb.Empty.
func registered(fullMethod string) func() proto.Message {
	svc, method, _ := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	if d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc)); err == nil {
		if sd, ok := d.(protoreflect.ServiceDescriptor); ok {
			if md := sd.Methods().ByName(protoreflect.Name(method)); md != nil {
				if mt, err := protoregistry.GlobalTypes.FindMessageByName(md.Output().FullName()); err == nil {
					return func() proto.Message { return mt.New().Interface() }
				}
			}
		}
	}
	return func() proto.Message { return &emptypb.Empty{} }
}
