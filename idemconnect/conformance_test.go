package idemconnect_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemconnect"
	"github.com/idemkit/idem/idempotency"
	"github.com/idemkit/idem/idemtest"
)

// TestHTTPConformance runs idem conformance (the HTTP suite) against
// Connect procedures in the Connect protocol's unary JSON form (POST with
// a JSON body), both modes. Nine of the twelve checks pass; three differ,
// for reasons of the Connect protocol (it maps codes to HTTP statuses and
// puts its own code in the body), not of the guard, and the test pins
// them down:
//   - mismatch: the reused key is refused with FailedPrecondition, which
//     the Connect protocol sends as HTTP 400; the suite wants 409 or 422;
//   - retry-after: the in-progress answer is HTTP 409 with a valid
//     Retry-After, but the suite recognises it by the JSON body's "code"
//     member, which for a Connect error is the Connect code ("aborted"),
//     so it sees no in-progress answer and skips;
//   - concurrency, for the same reason, fails when a racer meets the
//     claim (409 aborted is "neither in-progress nor the result" to it)
//     and passes when the racers come after the first completes; the
//     execution count, which is the point of the check, is one either way.
//
// TestRefusals and TestInProgress check both answers the Connect way,
// TestWireAnswers on the wire.
func TestHTTPConformance(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, &idemconnect.Config{Idempotency: idempotency.Config{Mode: mode, Retention: ttl, Lease: time.Second}})
			rep, err := idemtest.Run(t.Context(), idemtest.Target{
				Handler:     b.mux,
				Path:        procCharge,
				AltPath:     procRefund,
				Body:        []byte(`{"amount":100,"card":{"last4":"4242"}}`),
				Header:      http.Header{"Authorization": {"alice"}, "Content-Type": {"application/json"}},
				PrincipalB:  http.Header{"Authorization": {"bob"}},
				FaultHeader: http.Header{"X-Test-Fault": {"1"}},
				Hold:        b.svc.hold,
				TTL:         ttl,
				Count: func(ctx context.Context) (int64, error) {
					var n int64
					err := b.pool.QueryRow(ctx, "SELECT count(*) FROM effect").Scan(&n)
					return n, err
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			var table strings.Builder
			_ = rep.WriteTable(&table, false)
			t.Log("\n" + table.String())
			// docs/adapters.md says nine of twelve pass: a new check must
			// be placed there.
			if len(rep.Results) != 12 {
				t.Errorf("%d checks, want the 12 that docs/adapters.md accounts for", len(rep.Results))
			}
			for _, res := range rep.Results {
				switch res.Name {
				case idemtest.CheckMismatch:
					others := 0
					for _, e := range res.Evidence {
						if strings.HasPrefix(e.Label, "other body") {
							others++
							if e.Status != http.StatusBadRequest || e.Code != "failed_precondition" || e.Replayed {
								t.Errorf("mismatch: %s, want 400 failed_precondition", e)
							}
						}
					}
					if res.Status != idemtest.Fail || others < 2 || strings.Contains(res.Reason, "replay") || strings.Contains(res.Reason, "execution") {
						t.Errorf("mismatch: %s; want it failed only on the 400 of FailedPrecondition", res)
					}
				case idemtest.CheckRetryAfter:
					aborted := 0
					for _, e := range res.Evidence {
						if e.Status == http.StatusConflict {
							aborted++
							if e.Code != "aborted" || !leaseRetry(e.RetryAfter) {
								t.Errorf("retry-after: %s, want 409 aborted with Retry-After 1 or 2", e)
							}
						}
					}
					if res.Status != idemtest.Skip || aborted == 0 {
						t.Errorf("retry-after: %s (%d in-progress answers); want skipped with 409 aborted answers", res, aborted)
					}
				case idemtest.CheckConcurrency:
					for _, e := range res.Evidence {
						if !(e.Status == http.StatusOK || e.Status == http.StatusConflict && e.Code == "aborted" && leaseRetry(e.RetryAfter)) {
							t.Errorf("concurrency: %s, want 200 or 409 aborted", e)
						}
					}
					if res.Status != idemtest.Pass && (!strings.Contains(res.Reason, "neither in-progress nor the final result") || strings.Contains(res.Reason, "counted")) {
						t.Errorf("concurrency: %s; want one execution, any failure only from 409 aborted answers", res)
					}
				default:
					if res.Status != idemtest.Pass {
						t.Errorf("%s", res)
					}
				}
			}
		})
	}
}

// leaseRetry reports whether ra is the Retry-After of a key in progress
// under the test's one-second lease: the lease's rest rounded up to whole
// seconds, which is 2 when a renewal (or the claim's transaction time,
// now() being its start) puts the lease's end a little over a second
// away.
func leaseRetry(ra string) bool { return ra == "1" || ra == "2" }

// TestWireAnswers pins, on the wire, the answers of the Connect protocol
// (unary, JSON) for the three cases where the HTTP suite's expectations
// and Connect differ or could: the HTTP status Connect derives from the
// code, the body's "code" member (the Connect code, not idem's) and the
// ErrorInfo detail that carries idem's reason. A change of Connect's
// mapping, or of the interceptor's codes, fails here first.
//   - reused key: FailedPrecondition, HTTP 400 (the suite wants 409/422);
//   - in progress: Aborted, HTTP 409 with Retry-After (the suite wants the
//     body's code to be IDEMPOTENCY_KEY_IN_PROGRESS);
//   - missing key: InvalidArgument, HTTP 400 (what the suite wants).
func TestWireAnswers(t *testing.T) {
	t.Parallel()
	b := setup(t, &idemconnect.Config{})
	post := func(key, body string) (int, http.Header, connectError) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, b.srv.URL+procCharge, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "alice")
		if key != "" {
			req.Header.Set(idem.HeaderKey, key)
		}
		resp, err := b.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var ce connectError
		raw, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			if err := json.Unmarshal(raw, &ce); err != nil {
				t.Fatalf("error body %q: %v", raw, err)
			}
		}
		return resp.StatusCode, resp.Header, ce
	}
	if st, _, _ := post("wire-used", `{"amount":1}`); st != http.StatusOK {
		t.Fatalf("first call: %d", st)
	}
	release := b.svc.hold()
	defer release()
	done := make(chan int, 1)
	go func() { st, _, _ := post("wire-busy", `{"amount":1}`); done <- st }()
	for b.svc.calls.Load() < 2 {
		time.Sleep(time.Millisecond) // until the held call has its claim
	}
	for _, tt := range []struct {
		name, key, body string
		status          int
		code, reason    string
		retryAfter      bool
	}{
		{"reused key", "wire-used", `{"amount":2}`, http.StatusBadRequest, "failed_precondition", idem.CodeKeyReused, false},
		{"in progress", "wire-busy", `{"amount":1}`, http.StatusConflict, "aborted", idem.CodeKeyInProgress, true},
		{"missing key", "", `{"amount":1}`, http.StatusBadRequest, "invalid_argument", idem.CodeKeyRequired, false},
	} {
		st, h, ce := post(tt.key, tt.body)
		if st != tt.status || ce.Code != tt.code || (h.Get("Retry-After") != "") != tt.retryAfter || h.Get(idem.HeaderReplayed) != "" {
			t.Errorf("%s: HTTP %d code %q Retry-After %q replayed %q; want HTTP %d code %q, Retry-After %v, not replayed",
				tt.name, st, ce.Code, h.Get("Retry-After"), h.Get(idem.HeaderReplayed), tt.status, tt.code, tt.retryAfter)
		}
		if r := ce.reason(t); r != tt.reason {
			t.Errorf("%s: ErrorInfo reason %q, want %q", tt.name, r, tt.reason)
		}
	}
	release()
	if st := <-done; st != http.StatusOK {
		t.Errorf("the held call: HTTP %d, want 200", st)
	}
	if n := b.svc.calls.Load(); n != 2 {
		t.Errorf("%d executions, want 2 (one per key)", n)
	}
}

// connectError is the Connect protocol's JSON error body.
type connectError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Details []struct {
		Type  string `json:"type"`
		Value string `json:"value"` // base64 of the detail's binary form, unpadded
	} `json:"details"`
}

// reason is the Reason of the body's ErrorInfo detail ("" if none).
func (ce connectError) reason(t *testing.T) string {
	t.Helper()
	for _, d := range ce.Details {
		if d.Type != "google.rpc.ErrorInfo" {
			continue
		}
		b, err := base64.RawStdEncoding.DecodeString(strings.TrimRight(d.Value, "="))
		if err != nil {
			t.Fatalf("detail value %q: %v", d.Value, err)
		}
		info := &errdetails.ErrorInfo{}
		if err := proto.Unmarshal(b, info); err != nil {
			t.Fatalf("ErrorInfo: %v", err)
		}
		return info.GetReason()
	}
	return ""
}
