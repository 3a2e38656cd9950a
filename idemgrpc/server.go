package idemgrpc

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempotency"
)

// Metadata keys of the protocol over gRPC (lower case, as gRPC metadata
// keys are).
const (
	// MetadataKey carries the client's key: idem.HeaderKey in lower case.
	MetadataKey = "idempotency-key"
	// MetadataReplayed is "true" in the header metadata of a replayed
	// answer: idem.HeaderReplayed in lower case.
	MetadataReplayed = "idempotent-replayed"
)

// ErrorDomain is the Domain of the ErrorInfo detail of the interceptor's
// own answers; their Reason is one of idem's codes (idem.CodeKeyRequired,
// idem.CodeKeyReused, idem.CodeKeyInProgress, …).
const ErrorDomain = "idem"

// Policy says what a method does with a call that has no key.
type Policy int

const (
	// PolicyRequired refuses a call without a key: InvalidArgument with
	// ErrorInfo reason IDEMPOTENCY_KEY_REQUIRED. The zero Policy.
	PolicyRequired Policy = iota
	// PolicyOptional guards a call that has a key and lets one without a
	// key through unguarded.
	PolicyOptional
	// PolicyOff lets every call through unguarded, key or not (reads).
	PolicyOff
)

func (p Policy) String() string {
	switch p {
	case PolicyRequired:
		return "required"
	case PolicyOptional:
		return "optional"
	case PolicyOff:
		return "off"
	}
	return fmt.Sprintf("Policy(%d)", int(p))
}

// ErrInvalidConfig is wrapped by every error of New about its Config; it
// is also idempotency.ErrInvalidConfig.
var ErrInvalidConfig = fmt.Errorf("idemgrpc: %w", idempotency.ErrInvalidConfig)

// Config configures the interceptor. Scope is required, so a nil *Config
// is an error.
type Config struct {
	// Scope returns the authenticated principal of the call from its
	// context (what an auth interceptor placed before this one put there);
	// every key is scoped by it and by the full method name. An error
	// answers Unauthenticated and the handler does not run. Required:
	// there is no default.
	Scope func(ctx context.Context) (string, error)

	// Policy returns the key policy of a full method name
	// ("/pkg.Service/Method"). Defaults to PolicyRequired for every method.
	Policy func(fullMethod string) Policy

	// StoreCode decides from a handler's error code whether the error is
	// stored (and replayed to every retry) or released (a retry runs the
	// handler again). A nil error is always stored. Defaults to
	// DefaultStoreCode.
	StoreCode func(c codes.Code) bool

	// Fingerprint returns the bytes a request is fingerprinted by, with
	// the full method name: a key reused with a request whose bytes differ
	// is refused with FailedPrecondition. Defaults to the deterministic
	// proto marshal of the whole request.
	Fingerprint func(req proto.Message) ([]byte, error)

	// Idempotency configures the engine: Mode, Lease, HandlerTimeout,
	// Retention, Wait, Hook, CompletionTimeout, KeepOnClientGone, the
	// replay cache and the purge. Its Route, when set, replaces the full
	// method name in the scope (it sees a request whose URL path is the
	// full method name). Scope, Methods, StoreStatus, ReplayHeaders,
	// FingerprintHeaders, FingerprintFields, MaxRequestBody and
	// MaxResponseBody are the interceptor's own and are ignored: requests
	// and responses are stored whole (gRPC's message size limits bound
	// them). Defaults to the engine's defaults.
	Idempotency idempotency.Config
}

// DefaultStoreCode stores the definitive errors, which a retry of the same
// request would get again: InvalidArgument, NotFound, AlreadyExists,
// PermissionDenied, FailedPrecondition, OutOfRange and Unimplemented.
// Every other code (Canceled, Unknown, DeadlineExceeded,
// ResourceExhausted, Aborted, Internal, Unavailable, DataLoss,
// Unauthenticated) is released.
func DefaultStoreCode(c codes.Code) bool {
	switch c {
	case codes.OK, codes.InvalidArgument, codes.NotFound, codes.AlreadyExists, codes.PermissionDenied,
		codes.FailedPrecondition, codes.OutOfRange, codes.Unimplemented:
		return true
	}
	return false
}

// Statuses of the synthetic HTTP exchange the engine sees: a response
// message is stored as 200, a stored error status as 422 (a 4xx the
// engine stores), a released error as 503.
const (
	statusMessage  = http.StatusOK
	statusStored   = http.StatusUnprocessableEntity
	statusReleased = http.StatusServiceUnavailable

	contentMessage = "application/x-protobuf"
	contentStatus  = "application/x-protobuf; messageType=google.rpc.Status"
)

// Interceptor guards unary gRPC methods with Idempotency-Key. Create it
// with New, install Unary with grpc.ChainUnaryInterceptor (after the
// interceptor that authenticates, so that Scope can see the principal),
// and run the retention purge with Start, Stop and HardStop.
type Interceptor struct {
	mw    *idempotency.Middleware
	cfg   Config
	types sync.Map // full method → protoreflect.MessageType of its response
}

// New returns an Interceptor over store. ModeTransactional needs a TxStore
// (idempotency.PostgresStore). A bad store or Config is an error wrapping
// ErrInvalidConfig that names the field.
func New(store idempotency.Store, cfg *Config) (*Interceptor, error) {
	if cfg == nil || cfg.Scope == nil {
		return nil, fmt.Errorf("%w: Config.Scope is required", ErrInvalidConfig)
	}
	c := *cfg
	if c.Policy == nil {
		c.Policy = func(string) Policy { return PolicyRequired }
	}
	if c.StoreCode == nil {
		c.StoreCode = DefaultStoreCode
	}
	if c.Fingerprint == nil {
		c.Fingerprint = func(req proto.Message) ([]byte, error) {
			return proto.MarshalOptions{Deterministic: true}.Marshal(req)
		}
	}
	ic := c.Idempotency
	ic.Scope = func(r *http.Request) (string, error) { return c.Scope(r.Context()) }
	if ic.Route == nil {
		ic.Route = func(r *http.Request) string { return r.URL.Path }
	}
	ic.Methods = []string{http.MethodPost}
	ic.StoreStatus = func(s int) bool { return s == statusMessage || s == statusStored }
	ic.ReplayHeaders = []string{"Content-Type"}
	ic.FingerprintHeaders, ic.FingerprintFields = nil, nil
	ic.MaxRequestBody, ic.MaxResponseBody = math.MaxInt32, math.MaxInt32
	mw, err := idempotency.New(store, &ic)
	if err != nil {
		return nil, fmt.Errorf("idemgrpc: %w", err)
	}
	return &Interceptor{mw: mw, cfg: c}, nil
}

// Start starts the engine's retention purge (idempotency.Middleware.Start).
func (i *Interceptor) Start(ctx context.Context) error { return i.mw.Start(ctx) }

// Stop stops the purge softly (idempotency.Middleware.Stop).
func (i *Interceptor) Stop(ctx context.Context) error { return i.mw.Stop(ctx) }

// HardStop stops the purge at once (idempotency.Middleware.HardStop).
func (i *Interceptor) HardStop(ctx context.Context) error { return i.mw.HardStop(ctx) }

// Tx returns the transaction ModeTransactional opened for the call: the
// handler's writes through it commit with the claim and the stored
// outcome, or not at all. ok is false outside ModeTransactional. It is
// idempotency.TxFromContext.
func Tx(ctx context.Context) (tx pgx.Tx, ok bool) { return idempotency.TxFromContext(ctx) }

// Unary is the unary server interceptor.
func (i *Interceptor) Unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	policy := i.cfg.Policy(info.FullMethod)
	if policy == PolicyOff {
		return handler(ctx, req)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	keys := md.Get(MetadataKey)
	if len(keys) == 0 {
		if policy == PolicyOptional {
			return handler(ctx, req)
		}
		return nil, refusal(codes.InvalidArgument, idem.CodeKeyRequired, "this method needs idempotency-key metadata", "")
	}
	msg, ok := req.(proto.Message)
	if !ok {
		return nil, status.Errorf(codes.Internal, "idemgrpc: request %T is not a proto.Message", req)
	}
	fp, err := i.cfg.Fingerprint(msg)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "idemgrpc: the request cannot be fingerprinted: %v", err)
	}
	r := (&http.Request{
		Method:        http.MethodPost,
		URL:           &url.URL{Path: info.FullMethod},
		Proto:         "HTTP/2.0",
		ProtoMajor:    2,
		Header:        http.Header{idem.HeaderKey: keys, "Content-Type": {contentMessage}},
		Body:          io.NopCloser(bytes.NewReader(fp)),
		ContentLength: int64(len(fp)),
		Host:          "grpc",
		RequestURI:    info.FullMethod,
	}).WithContext(ctx)

	var (
		ran       bool
		hres      any
		herr      error
		outcome   []byte
		outStatus int
	)
	guarded := http.HandlerFunc(func(w http.ResponseWriter, gr *http.Request) {
		ran = true
		hres, herr = handler(gr.Context(), req)
		outStatus, outcome = i.encode(info.FullMethod, hres, herr)
		ct := contentMessage
		if outStatus != statusMessage {
			ct = contentStatus
		}
		w.Header().Set("Content-Type", ct)
		w.WriteHeader(outStatus)
		_, _ = w.Write(outcome)
	})
	cw := &capture{header: http.Header{}}
	i.mw.Wrap(guarded).ServeHTTP(cw, r)

	switch {
	case cw.header.Get(idem.HeaderReplayed) == "true":
		// Header metadata goes out with the first response frame, or
		// with the status of an error: either way before the answer.
		_ = grpc.SetHeader(ctx, metadata.Pairs(MetadataReplayed, "true"))
		return i.decode(info.FullMethod, cw.status, cw.body.Bytes())
	case strings.HasPrefix(cw.header.Get("Content-Type"), idem.ProblemContentType):
		return nil, problemStatus(cw)
	case ran && cw.status == outStatus:
		// The handler's own answer, passed through: stored or released.
		return hres, herr
	}
	return nil, status.Errorf(codes.Internal, "idemgrpc: unexpected answer %d from the engine", cw.status)
}

// encode turns a handler's result into the synthetic response the engine
// stores or releases.
func (i *Interceptor) encode(fullMethod string, res any, err error) (int, []byte) {
	if err == nil {
		m, ok := res.(proto.Message)
		if !ok {
			return statusReleased, nil
		}
		b, merr := proto.Marshal(m)
		if merr != nil {
			return statusReleased, nil
		}
		i.types.Store(fullMethod, m.ProtoReflect().Type())
		return statusMessage, b
	}
	st := status.Convert(err)
	b, merr := proto.Marshal(st.Proto())
	if merr != nil || !i.cfg.StoreCode(st.Code()) {
		return statusReleased, b
	}
	return statusStored, b
}

// decode turns a stored outcome back into the handler's answer.
func (i *Interceptor) decode(fullMethod string, st int, body []byte) (any, error) {
	if st != statusMessage {
		sp := &spb.Status{}
		if err := proto.Unmarshal(body, sp); err != nil {
			return nil, status.Errorf(codes.Internal, "idemgrpc: stored status unreadable: %v", err)
		}
		return nil, status.ErrorProto(sp)
	}
	m := i.newResponse(fullMethod)
	if err := proto.Unmarshal(body, m); err != nil {
		return nil, status.Errorf(codes.Internal, "idemgrpc: stored response unreadable: %v", err)
	}
	return m, nil
}

// newResponse returns an empty response message of fullMethod: its type as
// an earlier run of the method in this process returned it, else as the
// protobuf registry describes the method (generated code registers it),
// else an emptypb.Empty that carries the stored bytes as unknown fields,
// which marshal back to the very same bytes on the wire.
func (i *Interceptor) newResponse(fullMethod string) proto.Message {
	if t, ok := i.types.Load(fullMethod); ok {
		return t.(protoreflect.MessageType).New().Interface()
	}
	svc, method, ok := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	if ok {
		if d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc)); err == nil {
			if sd, ok := d.(protoreflect.ServiceDescriptor); ok {
				if md := sd.Methods().ByName(protoreflect.Name(method)); md != nil {
					if mt, err := protoregistry.GlobalTypes.FindMessageByName(md.Output().FullName()); err == nil {
						i.types.Store(fullMethod, mt)
						return mt.New().Interface()
					}
				}
			}
		}
	}
	return &emptypb.Empty{}
}

// refusal is one of the interceptor's own answers: code, with an
// ErrorInfo whose reason is reason, and a RetryInfo when retry is set.
func refusal(c codes.Code, reason, msg, retry string) error {
	st := status.New(c, msg)
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain}}
	if s, err := strconv.ParseInt(retry, 10, 64); err == nil && s > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(time.Duration(s) * time.Second)})
	}
	if withD, err := st.WithDetails(details...); err == nil {
		st = withD
	}
	return st.Err()
}

// problemStatus maps one of the engine's own answers (problem+json with a
// code member) to its gRPC status: see the table in the package doc.
func problemStatus(cw *capture) error {
	var p struct {
		Code   string `json:"code"`
		Detail string `json:"detail"`
	}
	_ = json.Unmarshal(cw.body.Bytes(), &p)
	rpc, withRetry := idem.RPCCode(p.Code)
	retry := ""
	if withRetry {
		retry = cw.header.Get("Retry-After")
	}
	if p.Code == "" {
		p.Code = "UNKNOWN"
	}
	return refusal(codes.Code(rpc), p.Code, p.Detail, retry)
}

// capture is the http.ResponseWriter the engine answers into.
type capture struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (c *capture) Header() http.Header { return c.header }

func (c *capture) WriteHeader(s int) {
	if c.status == 0 {
		c.status = s
	}
}

func (c *capture) Write(b []byte) (int, error) {
	c.WriteHeader(http.StatusOK)
	return c.body.Write(b)
}
