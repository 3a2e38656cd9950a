package idemtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/idemkit/idem"
)

// Defaults of Target.
const (
	// MethodDefault is the method checked when Target.Method is empty.
	MethodDefault = http.MethodPost
	// ConcurrencyDefault is how many requests race on one key.
	ConcurrencyDefault = 10
	// RequestTimeoutDefault bounds each request.
	RequestTimeoutDefault = 30 * time.Second
	// HoldTimeoutDefault bounds how long retry-after keeps the endpoint
	// held while waiting for an in-progress answer.
	HoldTimeoutDefault = 3 * time.Second
	// SettleTimeoutDefault bounds how long a check waits for an
	// in-progress key to complete (concurrency) or an expired key to
	// become usable again (expiry, on top of TTL).
	SettleTimeoutDefault = 10 * time.Second
)

// Errors returned by Run for a Target that cannot be checked.
var (
	ErrNoTarget      = errors.New("idemtest: Target needs URL or Handler")
	ErrTwoTargets    = errors.New("idemtest: Target has both URL and Handler")
	ErrInvalidTarget = errors.New("idemtest: invalid Target")
	ErrCountReadBack = errors.New("idemtest: count read-back failed")
	errCountUnparsed = errors.New("no count in the response")
)

// Target is the endpoint under test and what the checks may use.
type Target struct {
	// URL is the endpoint's absolute http or https URL. Exactly one of URL
	// and Handler is required: there is no default.
	URL string
	// Handler is served on a loopback httptest server for the duration of
	// Run (requests go to its root path plus Path). Exactly one of URL and
	// Handler is required: there is no default.
	Handler http.Handler
	// Path is appended to the httptest server's URL when Handler is set.
	// Defaults to "/".
	Path string
	// Client sends every request. Defaults to a client of Run's own, whose
	// idle connections are closed when Run returns.
	Client *http.Client
	// Method is the method checked. Defaults to POST.
	Method string
	// Body is a request body that the endpoint accepts with a 2xx.
	// Defaults to empty.
	Body []byte
	// AltBody is a second valid body, different from Body, for the
	// mismatch and expiry checks. Defaults to Body with its first JSON
	// number incremented (or, for a JSON object without numbers, a member
	// "idemtest_variant" added; for other bodies, "-idemtest" appended).
	// The mismatch check also sends, besides AltBody, Body with each of its
	// members changed in turn, nested ones included (see fieldVariants).
	AltBody []byte
	// AltURL is another route of the same service (another POST
	// endpoint, say) that answers AltURLBody with a 2xx: the routes check
	// sends one key to URL and then to AltURL, which must be two
	// independent operations (a key is scoped by route). Defaults to none:
	// the routes check is skipped.
	AltURL string
	// AltPath is AltURL for a Handler target: a path on the httptest
	// server. Defaults to none.
	AltPath string
	// AltURLBody is the body sent to AltURL. Defaults to Body.
	AltURLBody []byte
	// Header is sent on every request: the first principal's credentials,
	// Content-Type and the like. Defaults to Content-Type: application/json
	// when Body is JSON and no Content-Type is given.
	Header http.Header
	// PrincipalB is set over Header (each name replaces Header's values) to
	// act as a second principal, e.g. Authorization: Bearer demo-bob.
	// Defaults to none: the principals check is skipped.
	PrincipalB http.Header
	// KeyHeader is the header carrying the key. Defaults to idem.HeaderKey
	// (Idempotency-Key).
	KeyHeader string
	// Concurrency is how many requests race on one key. Defaults to 10.
	Concurrency int
	// Count reads back how many times the endpoint has executed (a ledger
	// length, a row count). Checks compare it before and after. Defaults to
	// CountURL, and without either, execution counts are inferred from the
	// responses.
	Count func(ctx context.Context) (int64, error)
	// CountURL is fetched with GET and Header; its body is a JSON number, a
	// JSON array (its length), an object with a numeric "count" member, or
	// an object whose first array member (in name order) is counted, such
	// as paysim's {"charges":[…]}. Used when Count is nil. Defaults to none.
	CountURL string
	// Hold, when set, makes the endpoint's executions block until release
	// is called, so that the in-progress answer is observed for sure (see
	// Gate). Defaults to none: retry-after races requests instead and may
	// be skipped when the endpoint is too fast.
	Hold func() (release func())
	// SlowHeader, added to a request, makes the endpoint take long enough
	// (a test-only delay switch) for racing requests to meet its claim.
	// retry-after sends it on its racing requests when Hold is nil.
	// Defaults to none: the requests race as they are.
	SlowHeader http.Header
	// FaultHeader, added to a request, makes the endpoint answer 5xx
	// without executing (a test-only fault switch). Defaults to none: the
	// server-error-released check is skipped.
	FaultHeader http.Header
	// TTL is the key retention the endpoint is configured with. Every other
	// check assumes that its keys outlive its few exchanges, so a TTL for
	// tests should still be a second or more. Defaults to zero: the expiry
	// check is skipped.
	TTL time.Duration
	// RequestTimeout bounds each request. Defaults to 30s.
	RequestTimeout time.Duration
	// HoldTimeout bounds how long the endpoint is held waiting for an
	// in-progress answer. Defaults to 3s.
	HoldTimeout time.Duration
	// SettleTimeout bounds waits for an in-progress key to complete and for
	// an expired key to become usable (after TTL). Defaults to 10s.
	SettleTimeout time.Duration
}

// withDefaults fills in the defaults, then validates the result; the
// error names the bad field.
func (t Target) withDefaults() (Target, error) {
	if t.Method == "" {
		t.Method = MethodDefault
	}
	if t.KeyHeader == "" {
		t.KeyHeader = idem.HeaderKey
	}
	if t.Path == "" {
		t.Path = "/"
	}
	if t.Concurrency == 0 {
		t.Concurrency = ConcurrencyDefault
	}
	if t.RequestTimeout == 0 {
		t.RequestTimeout = RequestTimeoutDefault
	}
	if t.HoldTimeout == 0 {
		t.HoldTimeout = HoldTimeoutDefault
	}
	if t.SettleTimeout == 0 {
		t.SettleTimeout = SettleTimeoutDefault
	}
	t.Header = t.Header.Clone()
	if t.Header == nil {
		t.Header = http.Header{}
	}
	if t.Header.Get("Content-Type") == "" && len(t.Body) > 0 && json.Valid(t.Body) {
		t.Header.Set("Content-Type", "application/json")
	}
	if t.AltBody == nil {
		t.AltBody = altBody(t.Body)
	}
	if t.AltURLBody == nil {
		t.AltURLBody = t.Body
	}
	return t, t.validate()
}

// validate checks a filled Target.
func (t Target) validate() error {
	switch {
	case t.URL == "" && t.Handler == nil:
		return ErrNoTarget
	case t.URL != "" && t.Handler != nil:
		return ErrTwoTargets
	}
	switch {
	case t.AltURL != "" && t.Handler != nil:
		return fmt.Errorf("%w: AltURL is for a URL target; a Handler target takes AltPath", ErrInvalidTarget)
	case t.AltPath != "" && t.Handler == nil:
		return fmt.Errorf("%w: AltPath is for a Handler target; a URL target takes AltURL", ErrInvalidTarget)
	case t.AltURL != "" && t.AltURL == t.URL, t.AltPath != "" && strings.TrimPrefix(t.AltPath, "/") == strings.TrimPrefix(t.Path, "/"):
		return fmt.Errorf("%w: AltURL (AltPath) must name another route than URL (Path)", ErrInvalidTarget)
	}
	for _, u := range []struct{ name, v string }{{"URL", t.URL}, {"CountURL", t.CountURL}, {"AltURL", t.AltURL}} {
		if u.v == "" {
			continue
		}
		if p, err := url.Parse(u.v); err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			return fmt.Errorf("%w: %s %q is not an absolute http(s) URL", ErrInvalidTarget, u.name, u.v)
		}
	}
	if t.Concurrency < 2 {
		return fmt.Errorf("%w: Concurrency %d must be at least 2", ErrInvalidTarget, t.Concurrency)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"TTL", t.TTL}, {"RequestTimeout", t.RequestTimeout}, {"HoldTimeout", t.HoldTimeout}, {"SettleTimeout", t.SettleTimeout}} {
		if d.v < 0 {
			return fmt.Errorf("%w: %s %s is negative", ErrInvalidTarget, d.name, d.v)
		}
	}
	if string(t.AltBody) == string(t.Body) {
		return fmt.Errorf("%w: AltBody must differ from Body", ErrInvalidTarget)
	}
	return nil
}

// altBody derives a second body that any fingerprint (bytes, or canonical
// JSON) tells apart from body, and that a typical handler still accepts.
func altBody(body []byte) []byte {
	var v any
	if len(body) > 0 && json.Unmarshal(body, &v) == nil {
		if bumpFirstNumber(&v) {
			if b, err := json.Marshal(v); err == nil {
				return b
			}
		}
		if m, ok := v.(map[string]any); ok {
			m["idemtest_variant"] = 1
			if b, err := json.Marshal(m); err == nil {
				return b
			}
		}
	}
	return append(append([]byte{}, body...), "-idemtest"...)
}

// bumpFirstNumber adds one to the first number found (object members in
// name order, depth first) and reports whether it found one.
func bumpFirstNumber(v *any) bool {
	switch x := (*v).(type) {
	case float64:
		if x+1 != x {
			*v = x + 1
		} else {
			// Too large for +1 to change it (1e300): any fingerprint
			// that parses numbers would see the same value.
			*v = -x
		}
		return true
	case map[string]any:
		names := make([]string, 0, len(x))
		for k := range x {
			names = append(names, k)
		}
		sort.Strings(names)
		for _, k := range names {
			e := x[k]
			if bumpFirstNumber(&e) {
				x[k] = e
				return true
			}
		}
	case []any:
		for i := range x {
			if bumpFirstNumber(&x[i]) {
				return true
			}
		}
	}
	return false
}

// maxVariants bounds the bodies the mismatch check derives from Body.
const maxVariants = 32

// variant is Body with one member changed.
type variant struct {
	field string // the member's path: "amount" or "card.number"
	body  []byte
}

// fieldVariants returns Body with each of its JSON object members changed
// in turn, members of nested objects (and of objects inside arrays)
// included, at most maxVariants, in path order: a fingerprint that leaves
// a member out (only the amounts, only the top level) replays the first
// answer to one of them. A body that is not a JSON object has none.
func fieldVariants(body []byte) []variant {
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.UseNumber()
	var root any
	if dec.Decode(&root) != nil {
		return nil
	}
	if _, ok := root.(map[string]any); !ok {
		return nil
	}
	var paths [][]any
	var walk func(v any, path []any)
	walk = func(v any, path []any) {
		switch x := v.(type) {
		case map[string]any:
			names := make([]string, 0, len(x))
			for k := range x {
				names = append(names, k)
			}
			sort.Strings(names)
			for _, k := range names {
				p := append(append([]any{}, path...), k)
				paths = append(paths, p)
				walk(x[k], p)
			}
		case []any:
			for i, e := range x {
				if _, ok := e.(map[string]any); ok {
					walk(e, append(append([]any{}, path...), i))
				}
			}
		}
	}
	walk(root, nil)
	var out []variant
	for _, p := range paths {
		if len(out) == maxVariants {
			break
		}
		// A fresh copy of the body for each variant.
		dec := json.NewDecoder(strings.NewReader(string(body)))
		dec.UseNumber()
		var v any
		_ = dec.Decode(&v)
		changeAt(v, p)
		b, err := json.Marshal(v)
		if err != nil || string(b) == string(body) {
			continue
		}
		out = append(out, variant{field: pathString(p), body: b})
	}
	return out
}

// changeAt replaces the value at path p in v with a different one of the
// same kind: a number plus one, a string with "x" appended, a boolean
// negated, null made 0, an array with its first element repeated (or a 0
// for an empty one), an object with a member added.
func changeAt(v any, p []any) {
	for i, step := range p {
		last := i == len(p)-1
		switch c := v.(type) {
		case map[string]any:
			k := step.(string)
			if last {
				c[k] = changed(c[k])
				return
			}
			v = c[k]
		case []any:
			v = c[step.(int)]
		}
	}
}

func changed(v any) any {
	switch x := v.(type) {
	case json.Number:
		if n, err := x.Int64(); err == nil && n < 1<<53 {
			return json.Number(fmt.Sprint(n + 1))
		}
		if f, err := x.Float64(); err == nil && f+1 != f {
			return f + 1
		}
		return json.Number("-" + strings.TrimPrefix(x.String(), "-") + "1")
	case string:
		return x + "x"
	case bool:
		return !x
	case nil:
		return 0
	case []any:
		if len(x) == 0 {
			return []any{0}
		}
		return append(x, x[0])
	case map[string]any:
		x["idemtest_variant"] = 1
		return x
	}
	return v
}

func pathString(p []any) string {
	var b strings.Builder
	for i, s := range p {
		switch x := s.(type) {
		case string:
			if i > 0 {
				b.WriteByte('.')
			}
			b.WriteString(x)
		case int:
			fmt.Fprintf(&b, "[%d]", x)
		}
	}
	return b.String()
}
