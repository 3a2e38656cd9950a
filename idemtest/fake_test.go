package idemtest_test

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
)

// fakeServer is a small, independent idempotent endpoint written for these
// tests: correct by default, and deliberately broken by its knobs. It lets
// the tests prove both that a correct server passes every check and that
// each defect fails exactly the checks meant to catch it.
//
// POST to any path executes a "charge" (201 {"id":n}, application/json);
// GET /count returns {"count":n}. Keys are scoped by principal (the
// Authorization header) and path; X-Fault: 1 makes the execution answer 500
// without charging.
type fakeServer struct {
	broken
	ttl  time.Duration // zero: keys never expire
	gate idemtest.Gate

	mu         sync.Mutex
	keys       map[string]*fakeEntry
	executions int64
}

// broken holds the defects.
type broken struct {
	ignoreKeys     bool // executes every request, keys or not
	crossPrincipal bool // keys are not scoped by principal
	store5xx       bool // a 5xx is stored and replayed
	noRetryAfter   bool // in-progress answers lack Retry-After
	noQuoted       bool // the sf-string form is refused
	noRouteScope   bool // keys are not scoped by route (path)
	noHeaders      bool // a replay does not repeat the first answer's headers
	// fingerprintOnly, when set, fingerprints these top-level members
	// only (say, the amount).
	fingerprintOnly []string
	topLevelOnly    bool // nested objects are left out of the fingerprint
}

type fakeEntry struct {
	fingerprint [32]byte
	done        bool
	status      int
	contentType string
	body        []byte
	expires     time.Time
}

func newFake(b broken, ttl time.Duration) *fakeServer {
	return &fakeServer{broken: b, ttl: ttl, keys: map[string]*fakeEntry{}}
}

func problem(w http.ResponseWriter, status int, code string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"type":"about:blank","title":%q,"status":%d,"code":%q}`, http.StatusText(status), status, code)
}

// parseKey accepts 1–255 visible ASCII characters, bare or quoted.
func (f *fakeServer) parseKey(raw string) (string, bool) {
	if len(raw) >= 2 && raw[0] == '"' && raw[len(raw)-1] == '"' {
		if f.noQuoted {
			return "", false
		}
		raw = raw[1 : len(raw)-1]
	}
	if len(raw) == 0 || len(raw) > 255 {
		return "", false
	}
	for i := 0; i < len(raw); i++ {
		if raw[i] < 0x21 || raw[i] > 0x7e || raw[i] == '"' {
			return "", false
		}
	}
	return raw, true
}

func (f *fakeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && r.URL.Path == "/count" {
		f.mu.Lock()
		n := f.executions
		f.mu.Unlock()
		fmt.Fprintf(w, `{"count":%d}`, n)
		return
	}
	principal := r.Header.Get("Authorization")
	if principal == "" {
		problem(w, http.StatusUnauthorized, "UNAUTHORIZED")
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil || !json.Valid(body) {
		problem(w, http.StatusBadRequest, "BAD_BODY")
		return
	}
	if f.ignoreKeys {
		status, resp := f.execute(r)
		w.WriteHeader(status)
		w.Write(resp)
		return
	}
	raw, present := r.Header["Idempotency-Key"]
	if !present {
		problem(w, http.StatusBadRequest, idem.CodeKeyRequired)
		return
	}
	key, ok := f.parseKey(raw[0])
	if !ok {
		problem(w, http.StatusBadRequest, idem.CodeKeyInvalid)
		return
	}
	id := principal + "\x00" + r.URL.Path + "\x00" + key
	switch {
	case f.crossPrincipal:
		id = r.URL.Path + "\x00" + key
	case f.noRouteScope:
		id = principal + "\x00" + key
	}
	fp := f.fingerprint(body)

	f.mu.Lock()
	e := f.keys[id]
	if e != nil && f.ttl > 0 && time.Now().After(e.expires) {
		e = nil
	}
	switch {
	case e != nil && e.fingerprint != fp:
		f.mu.Unlock()
		problem(w, http.StatusConflict, idem.CodeKeyReused)
		return
	case e != nil && !e.done:
		f.mu.Unlock()
		if !f.noRetryAfter {
			w.Header().Set("Retry-After", "1")
		}
		problem(w, http.StatusConflict, idem.CodeKeyInProgress)
		return
	case e != nil:
		f.mu.Unlock()
		w.Header().Set("Idempotent-Replayed", "true")
		if e.contentType != "" && !f.noHeaders {
			w.Header().Set("Content-Type", e.contentType)
		}
		w.WriteHeader(e.status)
		w.Write(e.body)
		return
	}
	e = &fakeEntry{fingerprint: fp, expires: time.Now().Add(f.ttl)}
	f.keys[id] = e
	f.mu.Unlock()

	status, resp := f.execute(r)

	ct := ""
	if status == http.StatusCreated {
		ct = "application/json"
		w.Header().Set("Content-Type", ct)
	}
	f.mu.Lock()
	if status >= 500 && !f.store5xx {
		delete(f.keys, id)
	} else {
		e.done, e.status, e.body, e.contentType = true, status, resp, ct
	}
	f.mu.Unlock()
	w.WriteHeader(status)
	w.Write(resp)
}

// fingerprint is the body's, or only the parts the broken knobs keep.
func (f *fakeServer) fingerprint(body []byte) [32]byte {
	if f.fingerprintOnly == nil && !f.topLevelOnly {
		return sha256.Sum256(body)
	}
	var m map[string]any
	_ = json.Unmarshal(body, &m)
	kept := map[string]any{}
	for k, v := range m {
		if _, nested := v.(map[string]any); f.topLevelOnly && nested {
			continue
		}
		if f.fingerprintOnly != nil && !slices.Contains(f.fingerprintOnly, k) {
			continue
		}
		kept[k] = v
	}
	b, _ := json.Marshal(kept)
	return sha256.Sum256(b)
}

// execute is the application: it waits at the gate, then charges.
func (f *fakeServer) execute(r *http.Request) (int, []byte) {
	var status int
	var body []byte
	f.gate.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Slow") != "" {
			// The server's own latency, as a test-only delay switch.
			t := time.NewTimer(300 * time.Millisecond)
			defer t.Stop()
			select {
			case <-t.C:
			case <-r.Context().Done():
			}
		}
		if r.Header.Get("X-Fault") != "" {
			status, body = http.StatusInternalServerError, []byte(`{"error":"injected"}`)
			return
		}
		f.mu.Lock()
		f.executions++
		n := f.executions
		f.mu.Unlock()
		status, body = http.StatusCreated, fmt.Appendf(nil, `{"id":%d}`, n)
	})).ServeHTTP(discard{}, r)
	if status == 0 { // the client went away while held
		return http.StatusServiceUnavailable, nil
	}
	return status, body
}

type discard struct{}

func (discard) Header() http.Header         { return http.Header{} }
func (discard) Write(b []byte) (int, error) { return len(b), nil }
func (discard) WriteHeader(int)             {}

// fakeTarget is a Target for f with everything the checks can use; the
// caller's edit func may take parts away.
func fakeTarget(f *fakeServer, url string) idemtest.Target {
	return idemtest.Target{
		URL:         url + "/charges",
		AltURL:      url + "/refunds",
		Body:        []byte(`{"order_id":"o1","amount_kopecks":1000,"card":{"last4":"4242","exp":{"month":12}}}`),
		Header:      http.Header{"Authorization": {"Bearer alice"}},
		PrincipalB:  http.Header{"Authorization": {"Bearer bob"}},
		CountURL:    url + "/count",
		Hold:        f.gate.Hold,
		FaultHeader: http.Header{"X-Fault": {"1"}},
		TTL:         f.ttl,
		HoldTimeout: 500 * time.Millisecond,
	}
}

func statuses(rep *idemtest.Report) string {
	var b strings.Builder
	for _, r := range rep.Results {
		fmt.Fprintf(&b, "%s=%s ", r.Name, r.Status)
	}
	return b.String()
}
