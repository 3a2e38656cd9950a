package idemconnect

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/jackc/pgx/v5"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idempotency"
)

// ErrorDomain is the Domain of the ErrorInfo detail of the interceptor's
// own answers; their Reason is one of idem's codes (idem.CodeKeyRequired,
// idem.CodeKeyReused, idem.CodeKeyInProgress, …).
const ErrorDomain = "idem"

// Policy says what a procedure does with a call that has no key.
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
var ErrInvalidConfig = fmt.Errorf("idemconnect: %w", idempotency.ErrInvalidConfig)

// Config configures the interceptor. Scope is required, so a nil *Config
// is an error.
type Config struct {
	// Scope returns the authenticated principal of the call (from its
	// headers, or from what an authentication middleware put in ctx);
	// every key is scoped by it and by the procedure name. An error
	// answers Unauthenticated and the handler does not run. Required:
	// there is no default.
	Scope func(ctx context.Context, req connect.AnyRequest) (string, error)

	// Policy returns the key policy of a procedure. Defaults to PolicyOff
	// for a procedure declared IdempotencyNoSideEffects and PolicyRequired
	// for every other.
	Policy func(spec connect.Spec) Policy

	// StoreCode decides from a handler's error code whether the error is
	// stored (and replayed to every retry) or released (a retry runs the
	// handler again). A nil error is always stored. Defaults to
	// DefaultStoreCode.
	StoreCode func(c connect.Code) bool

	// Fingerprint returns the bytes a request is fingerprinted by, with
	// the procedure: a key reused with a request whose bytes differ is
	// refused with FailedPrecondition. Defaults to the deterministic proto
	// marshal of the whole request message, whatever codec (JSON or
	// binary) carried it.
	Fingerprint func(req proto.Message) ([]byte, error)

	// Idempotency configures the engine: Mode, Lease, HandlerTimeout,
	// Retention, Wait, Hook, CompletionTimeout, KeepOnClientGone, the
	// replay cache and the purge. Its Route, when set, replaces the
	// procedure in the scope (it sees a request whose URL path is the
	// procedure). Its ReplayHeaders are the response headers (of a
	// response, or the metadata of an error) stored and replayed; the
	// protocol's own (Content-Type) are not the handler's and are never
	// stored. Scope, Methods, StoreStatus, FingerprintHeaders,
	// FingerprintFields, MaxRequestBody and MaxResponseBody are the
	// interceptor's own and are ignored: requests and responses are
	// stored whole (Connect's read limit bounds them).
	Idempotency idempotency.Config
}

// DefaultStoreCode stores the definitive errors, which a retry of the same
// request would get again: InvalidArgument, NotFound, AlreadyExists,
// PermissionDenied, FailedPrecondition, OutOfRange and Unimplemented.
// Every other code (Canceled, Unknown, DeadlineExceeded,
// ResourceExhausted, Aborted, Internal, Unavailable, DataLoss,
// Unauthenticated) is released. It is idemgrpc's table.
func DefaultStoreCode(c connect.Code) bool {
	switch c {
	case connect.CodeInvalidArgument, connect.CodeNotFound, connect.CodeAlreadyExists, connect.CodePermissionDenied,
		connect.CodeFailedPrecondition, connect.CodeOutOfRange, connect.CodeUnimplemented:
		return true
	}
	return false
}

// Statuses of the synthetic HTTP exchange the engine sees: a response
// message is stored as 200, a stored error as 422 (a 4xx the engine
// stores), a released error as 503.
const (
	statusMessage  = http.StatusOK
	statusStored   = http.StatusUnprocessableEntity
	statusReleased = http.StatusServiceUnavailable

	contentMessage = "application/x-protobuf; messageType=google.protobuf.Any"
	contentStatus  = "application/x-protobuf; messageType=google.rpc.Status"
)

// Interceptor guards unary Connect procedures with Idempotency-Key. Create
// it with New, install it with connect.WithInterceptors on the handler
// (after the interceptor that authenticates, if Scope reads what it puts
// in the context), and run the retention purge with Start, Stop and
// HardStop. It implements connect.Interceptor; streaming calls pass
// through unguarded.
type Interceptor struct {
	mw     *idempotency.Middleware
	cfg    Config
	replay []string // canonical names of the handler's headers replayed
}

var _ connect.Interceptor = (*Interceptor)(nil)

// New returns an Interceptor over store. ModeTransactional needs a TxStore
// (idempotency.PostgresStore). A bad store or Config is an error wrapping
// ErrInvalidConfig that names the field.
func New(store idempotency.Store, cfg *Config) (*Interceptor, error) {
	if cfg == nil || cfg.Scope == nil {
		return nil, fmt.Errorf("%w: Config.Scope is required", ErrInvalidConfig)
	}
	c := *cfg
	if c.Policy == nil {
		c.Policy = func(s connect.Spec) Policy {
			if s.IdempotencyLevel == connect.IdempotencyNoSideEffects {
				return PolicyOff
			}
			return PolicyRequired
		}
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
	ic.Scope = func(r *http.Request) (string, error) {
		call, _ := r.Context().Value(callKey{}).(*call)
		if call == nil {
			return "", errors.New("idemconnect: no call")
		}
		return c.Scope(r.Context(), call.req)
	}
	if ic.Route == nil {
		ic.Route = func(r *http.Request) string { return r.URL.Path }
	}
	ic.Methods = []string{http.MethodPost}
	ic.StoreStatus = func(s int) bool { return s == statusMessage || s == statusStored }
	replay := ic.ReplayHeaders
	if replay == nil {
		replay = idempotency.ReplayHeadersDefault
	}
	var own []string
	for _, h := range replay {
		if h = http.CanonicalHeaderKey(h); h != "Content-Type" && !slices.Contains(own, h) {
			own = append(own, h)
		}
	}
	ic.ReplayHeaders = append([]string{"Content-Type"}, own...)
	ic.FingerprintHeaders, ic.FingerprintFields = nil, nil
	ic.MaxRequestBody, ic.MaxResponseBody = math.MaxInt32, math.MaxInt32
	mw, err := idempotency.New(store, &ic)
	if err != nil {
		return nil, fmt.Errorf("idemconnect: %w", err)
	}
	return &Interceptor{mw: mw, cfg: c, replay: own}, nil
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

// WrapStreamingClient passes streaming calls through.
func (i *Interceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler passes streaming calls through: they are not
// guarded.
func (i *Interceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

type callKey struct{}

// call is one guarded call on its way through the engine.
type call struct{ req connect.AnyRequest }

// WrapUnary guards a unary handler; on the client side of a connection it
// does nothing.
func (i *Interceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if req.Spec().IsClient {
			return next(ctx, req)
		}
		return i.unary(ctx, req, next)
	}
}

func (i *Interceptor) unary(ctx context.Context, req connect.AnyRequest, next connect.UnaryFunc) (connect.AnyResponse, error) {
	spec := req.Spec()
	policy := i.cfg.Policy(spec)
	if policy == PolicyOff {
		return next(ctx, req)
	}
	keys := req.Header().Values(idem.HeaderKey)
	if len(keys) == 0 {
		if policy == PolicyOptional {
			return next(ctx, req)
		}
		return nil, refusal(connect.CodeInvalidArgument, idem.CodeKeyRequired, "this procedure needs an Idempotency-Key header", "")
	}
	msg, ok := req.Any().(proto.Message)
	if !ok {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("idemconnect: request %T is not a proto.Message", req.Any()))
	}
	fp, err := i.cfg.Fingerprint(msg)
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("idemconnect: the request cannot be fingerprinted: %w", err))
	}
	r := (&http.Request{
		Method:        http.MethodPost,
		URL:           &url.URL{Path: spec.Procedure},
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        http.Header{idem.HeaderKey: keys, "Content-Type": {"application/x-protobuf"}},
		Body:          io.NopCloser(bytes.NewReader(fp)),
		ContentLength: int64(len(fp)),
		Host:          "connect",
		RequestURI:    spec.Procedure,
	}).WithContext(context.WithValue(ctx, callKey{}, &call{req: req}))

	var (
		ran       bool
		hres      connect.AnyResponse
		herr      error
		outStatus int
	)
	guarded := http.HandlerFunc(func(w http.ResponseWriter, gr *http.Request) {
		ran = true
		hres, herr = next(gr.Context(), req)
		var outcome []byte
		outStatus, outcome = i.encode(hres, herr)
		ct := contentMessage
		if outStatus != statusMessage {
			ct = contentStatus
		}
		i.copyHeaders(w.Header(), handlerHeader(hres, herr))
		w.Header().Set("Content-Type", ct)
		w.WriteHeader(outStatus)
		_, _ = w.Write(outcome)
	})
	cw := &capture{header: http.Header{}}
	i.mw.Wrap(guarded).ServeHTTP(cw, r)

	switch {
	case cw.header.Get(idem.HeaderReplayed) == "true":
		res, err := decode(cw.status, cw.body.Bytes())
		i.copyHeaders(handlerHeader(res, err), cw.header)
		return res, err
	case strings.HasPrefix(cw.header.Get("Content-Type"), idem.ProblemContentType):
		return nil, problemError(cw)
	case ran && cw.status == outStatus:
		// The handler's own answer, passed through: stored or released.
		return hres, herr
	}
	return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("idemconnect: unexpected answer %d from the engine", cw.status))
}

// handlerHeader returns the headers of a response, or the metadata of an
// error (nil for another error).
func handlerHeader(res connect.AnyResponse, err error) http.Header {
	var ce *connect.Error
	switch {
	case err != nil && errors.As(err, &ce):
		return ce.Meta()
	case err == nil && res != nil:
		return res.Header()
	}
	return nil
}

// copyHeaders copies the replayed headers from src to dst.
func (i *Interceptor) copyHeaders(dst, src http.Header) {
	if dst == nil {
		return
	}
	for _, h := range i.replay {
		if v := src.Values(h); len(v) > 0 {
			dst[h] = append([]string(nil), v...)
		}
	}
}

// encode turns a handler's result into the synthetic response the engine
// stores or releases: a response message as a google.protobuf.Any (its
// type name and bytes, so that a replay in another process rebuilds it),
// an error as a google.rpc.Status (code, message, details).
func (i *Interceptor) encode(res connect.AnyResponse, err error) (int, []byte) {
	if err == nil {
		if res == nil {
			return statusReleased, nil
		}
		m, ok := res.Any().(proto.Message)
		if !ok {
			return statusReleased, nil
		}
		a, merr := anypb.New(m)
		if merr != nil {
			return statusReleased, nil
		}
		b, merr := proto.Marshal(a)
		if merr != nil {
			return statusReleased, nil
		}
		return statusMessage, b
	}
	code := connect.CodeOf(err)
	st := &spb.Status{Code: int32(code), Message: err.Error()}
	var ce *connect.Error
	if errors.As(err, &ce) {
		st.Message = ce.Message()
		for _, d := range ce.Details() {
			st.Details = append(st.Details, &anypb.Any{TypeUrl: "type.googleapis.com/" + d.Type(), Value: d.Bytes()})
		}
	}
	b, merr := proto.Marshal(st)
	if merr != nil || !i.cfg.StoreCode(code) {
		return statusReleased, b
	}
	return statusStored, b
}

// decode turns a stored outcome back into the handler's answer, marked
// with Idempotent-Replayed: true.
func decode(st int, body []byte) (connect.AnyResponse, error) {
	if st != statusMessage {
		sp := &spb.Status{}
		if err := proto.Unmarshal(body, sp); err != nil {
			return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("idemconnect: stored status unreadable: %w", err))
		}
		ce := connect.NewError(connect.Code(sp.GetCode()), errors.New(sp.GetMessage()))
		for _, a := range sp.GetDetails() {
			if d, err := connect.NewErrorDetail(a); err == nil {
				ce.AddDetail(d)
			}
		}
		ce.Meta().Set(idem.HeaderReplayed, "true")
		return nil, ce
	}
	a := &anypb.Any{}
	if err := proto.Unmarshal(body, a); err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("idemconnect: stored response unreadable: %w", err))
	}
	m := newMessage(a.MessageName())
	if err := proto.Unmarshal(a.GetValue(), m); err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("idemconnect: stored response unreadable: %w", err))
	}
	resp := connect.NewResponse(m)
	resp.Header().Set(idem.HeaderReplayed, "true")
	return resp, nil
}

// newMessage returns an empty message of the named type, as the protobuf
// registry describes it (generated code and the well-known types register
// theirs), built with dynamicpb so that any codec marshals it like the
// original; for a name the registry does not know, an emptypb.Empty in a
// dynamicpb that keeps the bytes as unknown fields (the same bytes on the
// binary wire; JSON shows {}).
func newMessage(name protoreflect.FullName) *dynamicpb.Message {
	if mt, err := protoregistry.GlobalTypes.FindMessageByName(name); err == nil {
		return dynamicpb.NewMessage(mt.Descriptor())
	}
	return dynamicpb.NewMessage((&emptypb.Empty{}).ProtoReflect().Descriptor())
}

// refusal is one of the interceptor's own answers: code, with an
// ErrorInfo whose reason is reason, and, when retry is set, a RetryInfo
// and a Retry-After header.
func refusal(c connect.Code, reason, msg, retry string) error {
	ce := connect.NewError(c, errors.New(msg))
	if d, err := connect.NewErrorDetail(&errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain}); err == nil {
		ce.AddDetail(d)
	}
	if s, err := strconv.ParseInt(retry, 10, 64); err == nil && s > 0 {
		if d, err := connect.NewErrorDetail(&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Duration(s) * time.Second)}); err == nil {
			ce.AddDetail(d)
		}
		ce.Meta().Set("Retry-After", retry)
	}
	return ce
}

// problemError maps one of the engine's own answers (problem+json with a
// code member) to its Connect error: see the table in the package doc.
func problemError(cw *capture) error {
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
	return refusal(connect.Code(rpc), p.Code, p.Detail, retry)
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
