package idemtest_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idemkit/idem/idemtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var allChecks = []string{
	idemtest.CheckBaseline, idemtest.CheckMissingKey, idemtest.CheckInvalidKey,
	idemtest.CheckReplay, idemtest.CheckMismatch, idemtest.CheckConcurrency,
	idemtest.CheckPrincipals, idemtest.CheckQuotedKey, idemtest.CheckRetryAfter,
	idemtest.CheckServerErrorReleased, idemtest.CheckExpiry, idemtest.CheckRoutes,
}

const fakeTTL = time.Second

func serveFake(t *testing.T, b broken) (*fakeServer, string) {
	t.Helper()
	f := newFake(b, fakeTTL)
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv.URL
}

// TestCorrectServerPassesEveryCheck proves the suite does not fail a server
// that keeps the semantics, with a count and without one (where executions
// are inferred from the answers).
func TestCorrectServerPassesEveryCheck(t *testing.T) {
	t.Parallel()
	for _, withCount := range []bool{true, false} {
		t.Run(map[bool]string{true: "count", false: "no count"}[withCount], func(t *testing.T) {
			t.Parallel()
			f, url := serveFake(t, broken{})
			target := fakeTarget(f, url)
			if !withCount {
				target.CountURL = ""
			}
			rep, err := idemtest.Run(t.Context(), target)
			if err != nil {
				t.Fatal(err)
			}
			if got := rep.Names(idemtest.Pass); !slices.Equal(got, allChecks) {
				for _, r := range rep.Results {
					t.Log(r)
				}
				t.Fatalf("passed %v, want every check %v", got, allChecks)
			}
			// Nothing the checks did charged twice: one execution per
			// successful new key. The fake's own count is the witness.
			f.mu.Lock()
			n := f.executions
			f.mu.Unlock()
			if n == 0 {
				t.Fatal("no executions at all")
			}
		})
	}
}

// TestBrokenServersFailTheMatchingChecks proves that the suite can fail:
// each defect makes exactly the checks meant to catch it fail, and no
// other.
func TestBrokenServersFailTheMatchingChecks(t *testing.T) {
	t.Parallel()
	testCases := []struct {
		name     string
		broken   broken
		noCount  bool
		wantFail []string
		wantSkip []string
	}{
		{
			name:   "ignores keys",
			broken: broken{ignoreKeys: true},
			wantFail: []string{idemtest.CheckMissingKey, idemtest.CheckInvalidKey, idemtest.CheckReplay,
				idemtest.CheckMismatch, idemtest.CheckConcurrency, idemtest.CheckPrincipals, idemtest.CheckQuotedKey, idemtest.CheckRoutes},
			// It never answers in-progress: nothing to judge Retry-After on.
			wantSkip: []string{idemtest.CheckRetryAfter},
		},
		{
			name:     "ignores keys, no count",
			broken:   broken{ignoreKeys: true},
			noCount:  true,
			wantFail: []string{idemtest.CheckMissingKey, idemtest.CheckInvalidKey, idemtest.CheckReplay, idemtest.CheckMismatch, idemtest.CheckConcurrency, idemtest.CheckPrincipals, idemtest.CheckQuotedKey, idemtest.CheckRoutes},
			wantSkip: []string{idemtest.CheckRetryAfter},
		},
		{
			name:     "replays across principals",
			broken:   broken{crossPrincipal: true},
			wantFail: []string{idemtest.CheckPrincipals},
		},
		{
			name:     "replays across principals, no count",
			broken:   broken{crossPrincipal: true},
			noCount:  true,
			wantFail: []string{idemtest.CheckPrincipals},
		},
		{
			name:     "stores 5xx",
			broken:   broken{store5xx: true},
			wantFail: []string{idemtest.CheckServerErrorReleased},
		},
		{
			name:     "in-progress without Retry-After",
			broken:   broken{noRetryAfter: true},
			wantFail: []string{idemtest.CheckRetryAfter},
		},
		{
			name:     "refuses the quoted form",
			broken:   broken{noQuoted: true},
			wantFail: []string{idemtest.CheckQuotedKey},
		},
		{
			// AltBody changes the amount, which this fingerprint covers:
			// only the member-by-member variants catch it.
			name:     "fingerprints the amount only",
			broken:   broken{fingerprintOnly: []string{"amount_kopecks"}},
			wantFail: []string{idemtest.CheckMismatch},
		},
		{
			name:     "leaves nested members out of the fingerprint",
			broken:   broken{topLevelOnly: true},
			wantFail: []string{idemtest.CheckMismatch},
		},
		{
			name:     "replays without the headers",
			broken:   broken{noHeaders: true},
			wantFail: []string{idemtest.CheckReplay},
		},
		{
			name:     "keys not scoped by route",
			broken:   broken{noRouteScope: true},
			wantFail: []string{idemtest.CheckRoutes},
		},
	}
	for _, tt := range testCases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f, url := serveFake(t, tt.broken)
			target := fakeTarget(f, url)
			if tt.noCount {
				target.CountURL = ""
			}
			rep, err := idemtest.Run(t.Context(), target)
			if err != nil {
				t.Fatal(err)
			}
			if !rep.Failed() {
				t.Fatal("Failed() = false for a broken server")
			}
			gotFail, gotSkip := rep.Names(idemtest.Fail), rep.Names(idemtest.Skip)
			sort.Strings(gotFail)
			sort.Strings(tt.wantFail)
			if !slices.Equal(gotFail, tt.wantFail) || !slices.Equal(gotSkip, tt.wantSkip) {
				for _, r := range rep.Results {
					t.Log(r)
				}
				t.Fatalf("failed %v skipped %v, want failed %v skipped %v", gotFail, gotSkip, tt.wantFail, tt.wantSkip)
			}
			for _, name := range gotFail {
				res, _ := rep.Result(name)
				if res.Reason == "" || len(res.Evidence) == 0 {
					t.Errorf("%s failed without a reason or evidence: %+v", name, res)
				}
			}
		})
	}
}

// TestExpiryFailsWhenKeysNeverExpire covers the expiry check's failing side:
// a server that keeps keys forever, checked with a stated TTL.
func TestExpiryFailsWhenKeysNeverExpire(t *testing.T) {
	t.Parallel()
	f := newFake(broken{}, 0)
	srv := httptest.NewServer(f)
	defer srv.Close()
	target := fakeTarget(f, srv.URL)
	target.TTL = 100 * time.Millisecond
	target.SettleTimeout = 300 * time.Millisecond
	rep, err := idemtest.Run(t.Context(), target)
	if err != nil {
		t.Fatal(err)
	}
	if got := rep.Names(idemtest.Fail); !slices.Equal(got, []string{idemtest.CheckExpiry}) {
		t.Fatalf("failed %v, want [expiry]; %s", got, statuses(rep))
	}
}

// TestSkipsSayWhatIsMissing: without the optional inputs, the checks that
// need them skip with a reason instead of passing.
func TestSkipsSayWhatIsMissing(t *testing.T) {
	t.Parallel()
	f, url := serveFake(t, broken{})
	rep, err := idemtest.Run(t.Context(), idemtest.Target{
		URL:    url + "/charges",
		Body:   []byte(`{"amount_kopecks":1}`),
		Header: http.Header{"Authorization": {"Bearer alice"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = f
	want := map[string]string{
		idemtest.CheckPrincipals:          "PrincipalB",
		idemtest.CheckServerErrorReleased: "FaultHeader",
		idemtest.CheckExpiry:              "TTL",
		idemtest.CheckRoutes:              "AltURL",
	}
	for name, field := range want {
		res, _ := rep.Result(name)
		if res.Status != idemtest.Skip || !strings.Contains(res.Reason, field) {
			t.Errorf("%s: %s %q, want skip naming %s", name, res.Status, res.Reason, field)
		}
	}
	if rep.Failed() {
		t.Errorf("a correct server failed: %s", statuses(rep))
	}
}

// TestBaselineFailureSkipsTheRest: a wrong body (401 here: no credentials)
// fails the baseline with the status, and nothing else is judged.
func TestBaselineFailureSkipsTheRest(t *testing.T) {
	t.Parallel()
	_, url := serveFake(t, broken{})
	rep, err := idemtest.Run(t.Context(), idemtest.Target{URL: url + "/charges", Body: []byte(`{}`)})
	if err != nil {
		t.Fatal(err)
	}
	base, _ := rep.Result(idemtest.CheckBaseline)
	if base.Status != idemtest.Fail || !strings.Contains(base.Reason, "401") {
		t.Fatalf("baseline %s %q, want a failure naming 401", base.Status, base.Reason)
	}
	if got := rep.Names(idemtest.Skip); len(got) != len(allChecks)-1 {
		t.Fatalf("skipped %v, want every other check", got)
	}
}

// TestCheckReportsSubtests runs Check against a handler (served by Check
// itself) and verifies one subtest per check, all passing.
func TestCheckReportsSubtests(t *testing.T) {
	t.Parallel()
	f := newFake(broken{}, fakeTTL)
	target := fakeTarget(f, "")
	target.URL, target.CountURL, target.AltURL = "", "", ""
	target.Handler, target.Path, target.AltPath = f, "/charges", "/refunds"
	target.Count = func(context.Context) (int64, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.executions, nil
	}
	rep := idemtest.Check(t, target)
	if len(rep.Results) != len(allChecks) || rep.Failed() {
		t.Fatalf("report %s", statuses(rep))
	}
}

// TestSlowHeaderWithoutHold: a CLI user has no Gate; a delay switch on the
// racing requests lets retry-after observe the in-progress answer.
func TestSlowHeaderWithoutHold(t *testing.T) {
	t.Parallel()
	f, url := serveFake(t, broken{})
	target := fakeTarget(f, url)
	target.Hold = nil
	target.SlowHeader = http.Header{"X-Slow": {"1"}}
	rep, err := idemtest.Run(t.Context(), target)
	if err != nil {
		t.Fatal(err)
	}
	res, _ := rep.Result(idemtest.CheckRetryAfter)
	if res.Status != idemtest.Pass || !strings.Contains(res.Reason, "Retry-After=1") {
		t.Fatalf("retry-after: %s", res)
	}
	if rep.Failed() {
		t.Fatalf("report %s", statuses(rep))
	}
}

func TestInvalidTarget(t *testing.T) {
	t.Parallel()
	h := http.NotFoundHandler()
	testCases := []struct {
		name   string
		target idemtest.Target
		want   error
		field  string
	}{
		{"nothing", idemtest.Target{}, idemtest.ErrNoTarget, ""},
		{"both", idemtest.Target{URL: "http://x", Handler: h}, idemtest.ErrTwoTargets, ""},
		{"relative URL", idemtest.Target{URL: "/charges"}, idemtest.ErrInvalidTarget, "URL"},
		{"bad count URL", idemtest.Target{Handler: h, CountURL: "ftp://x"}, idemtest.ErrInvalidTarget, "CountURL"},
		{"concurrency 1", idemtest.Target{Handler: h, Concurrency: 1}, idemtest.ErrInvalidTarget, "Concurrency"},
		{"negative TTL", idemtest.Target{Handler: h, TTL: -time.Second}, idemtest.ErrInvalidTarget, "TTL"},
		{"same alt body", idemtest.Target{Handler: h, Body: []byte("a"), AltBody: []byte("a")}, idemtest.ErrInvalidTarget, "AltBody"},
	}
	for _, tt := range testCases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rep, err := idemtest.Run(t.Context(), tt.target)
			if !errors.Is(err, tt.want) || rep != nil || !strings.Contains(err.Error(), tt.field) {
				t.Fatalf("err %v, want %v naming %q", err, tt.want, tt.field)
			}
		})
	}
}

// TestCountReadBackFailure: a count URL that does not answer a count fails
// the baseline with the read-back error instead of guessing.
func TestCountReadBackFailure(t *testing.T) {
	t.Parallel()
	f, url := serveFake(t, broken{})
	target := fakeTarget(f, url)
	target.CountURL = url + "/charges" // GET without credentials: 401
	rep, err := idemtest.Run(t.Context(), target)
	if err != nil {
		t.Fatal(err)
	}
	base, _ := rep.Result(idemtest.CheckBaseline)
	if base.Status != idemtest.Fail || !strings.Contains(base.Reason, "count read-back failed") {
		t.Fatalf("baseline %s %q", base.Status, base.Reason)
	}
}

func TestGate(t *testing.T) {
	t.Parallel()
	var g idemtest.Gate
	ran := make(chan struct{}, 1)
	h := g.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran <- struct{}{} }))
	serve := func(ctx context.Context) int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequestWithContext(ctx, "POST", "/", nil))
		return rec.Code
	}

	// Held: a request whose client gives up never reaches the handler.
	release := g.Hold()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if code := serve(ctx); code != http.StatusServiceUnavailable {
		t.Fatalf("held request with a cancelled context got %d, want 503", code)
	}
	select {
	case <-ran:
		t.Fatal("handler ran while held")
	default:
	}

	// Held: a live request waits until release, then runs.
	done := make(chan int)
	go func() { done <- serve(t.Context()) }()
	release()
	release() // safe twice
	if code := <-done; code != http.StatusOK {
		t.Fatalf("released request got %d", code)
	}
	<-ran

	// Open again: runs at once.
	serve(t.Context())
	<-ran
}
