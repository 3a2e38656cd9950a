package idemtest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
)

// Run performs every check against target, one after another, and returns
// the report. ctx bounds the whole run; a cancelled ctx fails the checks in
// flight. The error is non-nil only for a Target that cannot be checked
// (ErrNoTarget, ErrTwoTargets, ErrInvalidTarget); a failing endpoint is a
// report with failed checks, never an error.
func Run(ctx context.Context, target Target) (*Report, error) {
	r, err := newRunner(target)
	if err != nil {
		return nil, err
	}
	defer r.close()
	rep := &Report{Target: r.t.Method + " " + r.url}
	for _, c := range checks {
		rep.Results = append(rep.Results, r.run(ctx, c))
	}
	return rep, nil
}

// Check runs every check against target as a subtest of t, named after the
// check: a failed check fails its subtest with the evidence, a skipped one
// is skipped with the reason. It returns the report.
func Check(t *testing.T, target Target) *Report {
	t.Helper()
	r, err := newRunner(target)
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	rep := &Report{Target: r.t.Method + " " + r.url}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			res := r.run(t.Context(), c)
			rep.Results = append(rep.Results, res)
			switch res.Status {
			case Fail:
				t.Error(res.String())
			case Skip:
				t.Skip(res.String())
			default:
				t.Log(res.String())
			}
		})
	}
	return rep
}

type check struct {
	name  string
	title string
	fn    func(ctx context.Context, r *runner, res *Result)
}

type runner struct {
	t      Target
	url    string
	altURL string // "" without AltURL or AltPath
	client *http.Client
	close  func()
	// baselineFailed makes every later check skip.
	baselineFailed bool
}

func newRunner(target Target) (*runner, error) {
	t, err := target.withDefaults()
	if err != nil {
		return nil, err
	}
	r := &runner{t: t, url: t.URL, altURL: t.AltURL, client: t.Client, close: func() {}}
	var srv *httptest.Server
	if t.Handler != nil {
		srv = httptest.NewServer(t.Handler)
		r.url = srv.URL + "/" + strings.TrimPrefix(t.Path, "/")
		if t.AltPath != "" {
			r.altURL = srv.URL + "/" + strings.TrimPrefix(t.AltPath, "/")
		}
	}
	var own *http.Transport
	if r.client == nil {
		own = http.DefaultTransport.(*http.Transport).Clone()
		// Every racing request gets its own connection, so that they
		// really arrive together.
		own.MaxIdleConnsPerHost = t.Concurrency + 2
		r.client = &http.Client{
			Transport: own,
			// A redirect is an answer to judge, not to follow: following
			// it would turn the POST into a GET elsewhere.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	r.close = func() {
		if own != nil {
			own.CloseIdleConnections()
		}
		if srv != nil {
			srv.Close()
		}
	}
	return r, nil
}

func (r *runner) run(ctx context.Context, c check) Result {
	res := Result{Name: c.name, Title: c.title}
	start := time.Now()
	if r.baselineFailed {
		res.Status, res.Reason = Skip, "baseline failed: nothing else can be judged"
	} else {
		c.fn(ctx, r, &res)
	}
	res.DurationMs = ms(time.Since(start))
	if c.name == CheckBaseline && res.Status != Pass {
		r.baselineFailed = true
	}
	return res
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// newKey returns a fresh key, unique to this run and check.
func newKey(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "idemtest-" + prefix + "-" + hex.EncodeToString(b[:])
}

// reqOpts shape one request.
type reqOpts struct {
	label string
	key   *string // nil: no key header
	body  []byte
	// header is set over the Target's Header (PrincipalB, FaultHeader).
	header http.Header
	// url, when set, is sent to instead of the Target's URL (AltURL).
	url string
}

func withKey(k string) *string { return &k }

// response is what one request returned.
type response struct {
	status int
	header http.Header
	body   []byte
	code   string
	dur    time.Duration
	err    error
}

func (p response) ok() bool { return p.err == nil && p.status >= 200 && p.status < 300 }
func (p response) replayed() bool {
	return strings.EqualFold(p.header.Get(idem.HeaderReplayed), "true")
}

// inProgress reports a 409 that is not a fingerprint mismatch.
func (p response) inProgress() bool {
	if p.err != nil || p.status != http.StatusConflict {
		return false
	}
	return p.code == "" || p.code == idem.CodeKeyInProgress
}

// sameAs reports an identical status and body.
func (p response) sameAs(q response) bool {
	return p.err == nil && q.err == nil && p.status == q.status && bytes.Equal(p.body, q.body)
}

// replayHeaders are the response headers a replay must repeat: those the
// idempotency package stores by default (idempotency.ReplayHeadersDefault),
// which any store-and-replay server keeps.
var replayHeaders = []string{"Content-Type", "Content-Language", "Location"}

// headerDiff names the first of replayHeaders that differs between p and
// q ("" when none does).
func (p response) headerDiff(q response) string {
	for _, h := range replayHeaders {
		a, b := strings.Join(p.header.Values(h), ", "), strings.Join(q.header.Values(h), ", ")
		if a != b {
			return fmt.Sprintf("%s %q first, %q on the repeat", h, a, b)
		}
	}
	return ""
}

// bodyDiff says where two bodies first differ ("" when they do not).
func bodyDiff(a, b []byte) string {
	if bytes.Equal(a, b) {
		return ""
	}
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	around := func(x []byte) []byte { return x[max(i-12, 0):min(i+12, len(x))] }
	return fmt.Sprintf("bodies differ at byte %d (of %d and %d): %q vs %q", i, len(a), len(b), around(a), around(b))
}

func (p response) describe() string {
	if p.err != nil {
		return "error: " + p.err.Error()
	}
	s := strconv.Itoa(p.status)
	if p.code != "" {
		s += " " + p.code
	}
	if p.replayed() {
		s += " (replayed)"
	}
	return s
}

// do sends one request and records it as evidence of res.
func (r *runner) do(ctx context.Context, res *Result, o reqOpts) response {
	p := r.send(ctx, o)
	res.Evidence = append(res.Evidence, exchange(o, p))
	return p
}

func exchange(o reqOpts, p response) Exchange {
	e := Exchange{
		Label:      o.label,
		Status:     p.status,
		Code:       p.code,
		Replayed:   p.replayed(),
		RetryAfter: p.header.Get("Retry-After"),
		BodyBytes:  len(p.body),
		Ms:         ms(p.dur),
	}
	if o.key != nil {
		e.Key = shortKey(*o.key)
	}
	if p.err != nil {
		e.Error = p.err.Error()
	}
	return e
}

// shortKey keeps evidence readable: long keys are cut, control characters
// quoted.
func shortKey(k string) string {
	q := strconv.QuoteToASCII(k)
	q = q[1 : len(q)-1]
	if len(q) > 48 {
		return fmt.Sprintf("%s…(%d chars)", q[:32], len(k))
	}
	return q
}

func (r *runner) send(ctx context.Context, o reqOpts) response {
	ctx, cancel := context.WithTimeout(ctx, r.t.RequestTimeout)
	defer cancel()
	u := r.url
	if o.url != "" {
		u = o.url
	}
	req, err := http.NewRequestWithContext(ctx, r.t.Method, u, bytes.NewReader(o.body))
	if err != nil {
		return response{err: err, header: http.Header{}}
	}
	req.Header = r.t.Header.Clone()
	for k, v := range o.header {
		req.Header[k] = append([]string(nil), v...)
	}
	if o.key != nil {
		// Set directly: the header may legitimately be empty or odd here.
		req.Header[http.CanonicalHeaderKey(r.t.KeyHeader)] = []string{*o.key}
	}
	start := time.Now()
	resp, err := r.client.Do(req)
	if err != nil {
		return response{err: err, dur: time.Since(start), header: http.Header{}}
	}
	defer resp.Body.Close()
	return readResponse(resp, start)
}

func readResponse(resp *http.Response, start time.Time) response {
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	p := response{status: resp.StatusCode, header: resp.Header, body: body, dur: time.Since(start), err: err}
	if strings.Contains(resp.Header.Get("Content-Type"), "json") {
		var prob struct {
			Code string `json:"code"`
		}
		if json.Unmarshal(body, &prob) == nil {
			p.code = prob.Code
		}
	}
	return p
}

// counter reads the execution count, if the Target gives one.
type counter struct {
	r      *runner
	before int64
	has    bool
	err    error
}

// startCount reads the count before a check's requests.
func (r *runner) startCount(ctx context.Context) *counter {
	c := &counter{r: r}
	c.before, c.has, c.err = r.count(ctx)
	return c
}

// delta reads the count again and returns how many executions happened
// since startCount.
func (c *counter) delta(ctx context.Context) (int64, error) {
	if c.err != nil {
		return 0, c.err
	}
	after, _, err := c.r.count(ctx)
	return after - c.before, err
}

func (r *runner) count(ctx context.Context) (int64, bool, error) {
	switch {
	case r.t.Count != nil:
		n, err := r.t.Count(ctx)
		if err != nil {
			return 0, true, fmt.Errorf("%w: %v", ErrCountReadBack, err)
		}
		return n, true, nil
	case r.t.CountURL != "":
		n, err := r.countURL(ctx)
		if err != nil {
			return 0, true, fmt.Errorf("%w: GET %s: %v", ErrCountReadBack, r.t.CountURL, err)
		}
		return n, true, nil
	}
	return 0, false, nil
}

func (r *runner) countURL(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, r.t.RequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.t.CountURL, nil)
	if err != nil {
		return 0, err
	}
	req.Header = r.t.Header.Clone()
	req.Header.Del("Content-Type")
	resp, err := r.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return 0, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("status %d", resp.StatusCode)
	}
	return parseCount(body)
}

// parseCount understands a number, an array, {"count":n} and an object
// whose first array member (in name order) holds the executions.
func parseCount(body []byte) (int64, error) {
	var v any
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	if err := d.Decode(&v); err != nil {
		if n, err := strconv.ParseInt(strings.TrimSpace(string(body)), 10, 64); err == nil {
			return n, nil
		}
		return 0, errCountUnparsed
	}
	switch x := v.(type) {
	case json.Number:
		return x.Int64()
	case []any:
		return int64(len(x)), nil
	case map[string]any:
		if n, ok := x["count"].(json.Number); ok {
			return n.Int64()
		}
		names := make([]string, 0, len(x))
		for k := range x {
			names = append(names, k)
		}
		sort.Strings(names)
		for _, k := range names {
			switch a := x[k].(type) {
			case []any:
				return int64(len(a)), nil
			case nil: // an empty list encoded as null
				return 0, nil
			}
		}
	}
	return 0, errCountUnparsed
}

// errRawNeedsHTTP: raw requests are written by hand over TCP, plain http
// only.
var errRawNeedsHTTP = errors.New("raw requests need an http:// URL")

// sendRaw writes the request by hand over a fresh TCP connection, for key
// values net/http refuses to send (control characters other than tab). It
// bypasses Target.Client.
func (r *runner) sendRaw(ctx context.Context, o reqOpts) response {
	u, err := url.Parse(r.url)
	if err != nil || u.Scheme != "http" {
		return response{err: errRawNeedsHTTP, header: http.Header{}}
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "80")
	}
	ctx, cancel := context.WithTimeout(ctx, r.t.RequestTimeout)
	defer cancel()
	start := time.Now()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", host)
	if err != nil {
		return response{err: err, header: http.Header{}, dur: time.Since(start)}
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: %s\r\n", r.t.Method, u.RequestURI(), u.Host)
	h := r.t.Header.Clone()
	for k, v := range o.header {
		h[k] = v
	}
	h.Del("Content-Length")
	h.Del("Connection")
	for k, vs := range h {
		for _, v := range vs {
			fmt.Fprintf(&b, "%s: %s\r\n", k, v)
		}
	}
	if o.key != nil {
		fmt.Fprintf(&b, "%s: %s\r\n", r.t.KeyHeader, *o.key)
	}
	fmt.Fprintf(&b, "Content-Length: %d\r\nConnection: close\r\n\r\n", len(o.body))
	b.Write(o.body)
	if _, err := conn.Write(b.Bytes()); err != nil {
		return response{err: err, header: http.Header{}, dur: time.Since(start)}
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return response{err: err, header: http.Header{}, dur: time.Since(start)}
	}
	defer resp.Body.Close()
	return readResponse(resp, start)
}
