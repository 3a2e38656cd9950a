package grpcconformance

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem/idemgrpc"
	"github.com/idemkit/idem/idemtest"
)

// CheckStoredError is the gRPC suite's own check: a definitive error
// (Target.ErrorRequest) is stored and replayed with its code and message.
// The other checks carry idemtest's names (idemtest.CheckReplay, …).
const CheckStoredError = "stored-error"

// Run performs every check against target, one after another, and returns
// the report, in idemtest's shape. ctx bounds the whole run. The error is
// non-nil only for a Target that cannot be checked (ErrInvalidTarget); a
// failing method is a report with failed checks.
func Run(ctx context.Context, target Target) (*idemtest.Report, error) {
	t, err := target.withDefaults()
	if err != nil {
		return nil, err
	}
	r := &runner{t: t}
	rep := &idemtest.Report{Target: "gRPC " + t.Method}
	for _, c := range checks {
		rep.Results = append(rep.Results, r.run(ctx, c))
	}
	return rep, nil
}

// Check runs every check as a subtest of t, named after the check, and
// returns the report.
func Check(t *testing.T, target Target) *idemtest.Report {
	t.Helper()
	tg, err := target.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	r := &runner{t: tg}
	rep := &idemtest.Report{Target: "gRPC " + tg.Method}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			res := r.run(t.Context(), c)
			rep.Results = append(rep.Results, res)
			switch res.Status {
			case idemtest.Fail:
				t.Error(res.String())
			case idemtest.Skip:
				t.Skip(res.String())
			default:
				t.Log(res.String())
			}
		})
	}
	return rep
}

type check struct {
	name, title string
	fn          func(ctx context.Context, r *runner, res *idemtest.Result)
}

type runner struct {
	t          Target
	baselineOK bool
}

func (r *runner) run(ctx context.Context, c check) idemtest.Result {
	res := idemtest.Result{Name: c.name, Title: c.title}
	start := time.Now()
	if c.name != idemtest.CheckBaseline && !r.baselineOK {
		res.Status, res.Reason = idemtest.Skip, "the baseline failed"
	} else {
		c.fn(ctx, r, &res)
	}
	res.DurationMs = float64(time.Since(start).Microseconds()) / 1000
	if c.name == idemtest.CheckBaseline {
		r.baselineOK = res.Status == idemtest.Pass
	}
	return res
}

func newKey(prefix string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "idemtest-" + prefix + "-" + hex.EncodeToString(b[:])
}

// opts is one call.
type opts struct {
	label  string
	keys   []string // sent as they are; none when empty
	method string   // defaults to Target.Method
	req    proto.Message
	md     metadata.MD // set over Target.Metadata
}

// reply is what a call got.
type reply struct {
	code     codes.Code
	msg      string
	reason   string
	delay    time.Duration // RetryInfo, -1 without
	replayed bool
	body     []byte
	err      error
	ms       float64
}

func (p reply) ok() bool { return p.code == codes.OK }

func (p reply) inProgress() bool {
	return p.code == codes.Aborted && p.reason == "IDEMPOTENCY_KEY_IN_PROGRESS"
}

func (p reply) describe() string {
	var b strings.Builder
	b.WriteString(p.code.String())
	if p.reason != "" {
		fmt.Fprintf(&b, " %s", p.reason)
	}
	if p.code != codes.OK && p.msg != "" {
		fmt.Fprintf(&b, " %q", p.msg)
	}
	if p.replayed {
		b.WriteString(" replayed")
	}
	return b.String()
}

func (r *runner) do(ctx context.Context, res *idemtest.Result, o opts) reply {
	start := time.Now()
	p := r.send(ctx, o)
	p.ms = float64(time.Since(start).Microseconds()) / 1000
	res.Evidence = append(res.Evidence, exchange(o.label, o.keys, p))
	return p
}

func exchange(label string, keys []string, p reply) idemtest.Exchange {
	key := ""
	if len(keys) > 0 {
		key = strings.Join(keys, ",")
		if len(key) > 24 {
			key = key[:24] + "…"
		}
	}
	e := idemtest.Exchange{Label: label, Key: key, Status: int(p.code), Code: p.code.String(), Replayed: p.replayed,
		BodyBytes: len(p.body), Ms: p.ms}
	if p.reason != "" {
		e.Code += " " + p.reason
	}
	if p.delay >= 0 {
		e.RetryAfter = p.delay.String()
	}
	if p.code != codes.OK && !strings.HasPrefix(p.reason, "IDEMPOTENCY") {
		e.Error = p.msg
	}
	return e
}

func (r *runner) send(ctx context.Context, o opts) reply {
	ctx, cancel := context.WithTimeout(ctx, r.t.CallTimeout)
	defer cancel()
	md := r.t.Metadata.Copy()
	if md == nil {
		md = metadata.MD{}
	}
	for k, v := range o.md {
		md[k] = v
	}
	if len(o.keys) > 0 {
		md[idemgrpc.MetadataKey] = o.keys
	}
	method, req := o.method, o.req
	if method == "" {
		method = r.t.Method
	}
	if req == nil {
		req = r.t.Request
	}
	var hdr metadata.MD
	out := r.t.NewResponse()
	err := r.t.Conn.Invoke(metadata.NewOutgoingContext(ctx, md), method, req, out, grpc.Header(&hdr))
	p := reply{delay: -1, err: err}
	if v := hdr.Get(idemgrpc.MetadataReplayed); len(v) == 1 && v[0] == "true" {
		p.replayed = true
	}
	if err == nil {
		p.body, _ = proto.MarshalOptions{Deterministic: true}.Marshal(out)
		return p
	}
	st := status.Convert(err)
	p.code, p.msg = st.Code(), st.Message()
	for _, d := range st.Details() {
		switch v := d.(type) {
		case *errdetails.ErrorInfo:
			p.reason = v.GetReason()
		case *errdetails.RetryInfo:
			p.delay = v.GetRetryDelay().AsDuration()
		}
	}
	return p
}

func (p reply) sameAs(q reply) bool {
	return p.code == q.code && p.msg == q.msg && bytes.Equal(p.body, q.body)
}

// counter measures executions over one check.
type counter struct {
	r     *runner
	start int64
	ok    bool
}

func (r *runner) startCount(ctx context.Context) *counter {
	c := &counter{r: r}
	if r.t.Count != nil {
		n, err := r.t.Count(ctx)
		c.start, c.ok = n, err == nil
	}
	return c
}

// executions checks that the check caused want executions: by Count when
// the target has it, else by the distinct OK bodies among ps.
func (v *verdict) executions(ctx context.Context, c *counter, want int64, ps ...reply) {
	if c.r.t.Count != nil {
		if !c.ok {
			v.failf("the count read-back failed")
			return
		}
		n, err := c.r.t.Count(ctx)
		if err != nil {
			v.failf("the count read-back failed: %v", err)
			return
		}
		if n-c.start != want {
			v.failf("%d executions, want %d", n-c.start, want)
		}
		return
	}
	seen := map[string]bool{}
	for _, p := range ps {
		if p.ok() {
			seen[string(p.body)] = true
		}
	}
	if int64(len(seen)) > want {
		v.failf("%d different responses, want at most %d (executions inferred from responses)", len(seen), want)
	}
}

type verdict struct{ reasons []string }

func (v *verdict) failf(format string, args ...any) {
	v.reasons = append(v.reasons, fmt.Sprintf(format, args...))
}

func (v *verdict) set(res *idemtest.Result, pass string) {
	if len(v.reasons) > 0 {
		res.Status, res.Reason = idemtest.Fail, strings.Join(v.reasons, "; ")
		return
	}
	res.Status, res.Reason = idemtest.Pass, pass
}
