package idemtest

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Status is a check's outcome.
type Status string

// Outcomes of a check.
const (
	Pass Status = "pass"
	Fail Status = "fail"
	// Skip means the Target did not give what the check needs (Reason says
	// what), or the baseline failed.
	Skip Status = "skip"
)

// Names of the checks, in the order Run performs them.
const (
	CheckBaseline            = "baseline"
	CheckMissingKey          = "missing-key"
	CheckInvalidKey          = "invalid-key"
	CheckReplay              = "replay"
	CheckMismatch            = "mismatch"
	CheckConcurrency         = "concurrency"
	CheckPrincipals          = "principals"
	CheckQuotedKey           = "quoted-key"
	CheckRetryAfter          = "retry-after"
	CheckServerErrorReleased = "server-error-released"
	CheckExpiry              = "expiry"
	CheckRoutes              = "routes"
)

// Report is the outcome of Run.
type Report struct {
	// Target is the method and URL checked.
	Target  string   `json:"target"`
	Results []Result `json:"results"`
}

// Failed reports whether any check failed.
func (r *Report) Failed() bool {
	for _, res := range r.Results {
		if res.Status == Fail {
			return true
		}
	}
	return false
}

// Result returns the result of the named check.
func (r *Report) Result(name string) (Result, bool) {
	for _, res := range r.Results {
		if res.Name == name {
			return res, true
		}
	}
	return Result{}, false
}

// Names returns the names of the checks with status s.
func (r *Report) Names(s Status) []string {
	var names []string
	for _, res := range r.Results {
		if res.Status == s {
			names = append(names, res.Name)
		}
	}
	return names
}

// Result is one check's outcome.
type Result struct {
	Name string `json:"name"`
	// Title says what the check expects.
	Title  string `json:"title"`
	Status Status `json:"status"`
	// Reason says why a check failed or was skipped, or sums up a pass.
	Reason string `json:"reason"`
	// Notes are observations that do not decide the outcome, such as
	// whether replays carry Idempotent-Replayed.
	Notes []string `json:"notes,omitempty"`
	// Evidence is the exchanges the check made, in order.
	Evidence   []Exchange `json:"evidence,omitempty"`
	DurationMs float64    `json:"duration_ms"`
}

// String is a multi-line description for test logs.
func (res Result) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s — %s", res.Name, res.Status, res.Reason)
	for _, n := range res.Notes {
		fmt.Fprintf(&b, "\n  note: %s", n)
	}
	for _, e := range res.Evidence {
		fmt.Fprintf(&b, "\n  %s", e)
	}
	return b.String()
}

// Exchange is one request and what came back.
type Exchange struct {
	// Label says what the request was for ("first", "replay", "no key"…).
	Label string `json:"label"`
	// Key is the key sent, shortened for display; empty when none was sent.
	Key string `json:"key,omitempty"`
	// Status is the HTTP status, zero when the request failed.
	Status int `json:"status"`
	// Code is the problem+json "code" member, if any.
	Code string `json:"code,omitempty"`
	// Replayed reports Idempotent-Replayed: true.
	Replayed bool `json:"replayed,omitempty"`
	// RetryAfter is the Retry-After header, if any.
	RetryAfter string `json:"retry_after,omitempty"`
	// BodyBytes is the response body's length.
	BodyBytes int     `json:"body_bytes"`
	Ms        float64 `json:"ms"`
	// Error is a transport error (no response).
	Error string `json:"error,omitempty"`
}

func (e Exchange) String() string {
	var b strings.Builder
	b.WriteString(e.Label)
	if e.Key != "" {
		fmt.Fprintf(&b, " [key %s]", e.Key)
	}
	if e.Error != "" {
		fmt.Fprintf(&b, " → error: %s", e.Error)
	} else {
		fmt.Fprintf(&b, " → %d", e.Status)
	}
	if e.Code != "" {
		fmt.Fprintf(&b, " %s", e.Code)
	}
	if e.Replayed {
		b.WriteString(" replayed")
	}
	if e.RetryAfter != "" {
		fmt.Fprintf(&b, " Retry-After=%s", e.RetryAfter)
	}
	fmt.Fprintf(&b, " (%dB, %.1fms)", e.BodyBytes, e.Ms)
	return b.String()
}

// WriteTable writes a readable table: one line per check, then the
// evidence of every failed check and the reasons of skipped ones. verbose
// adds the evidence of every check.
func (r *Report) WriteTable(w io.Writer, verbose bool) error {
	var b strings.Builder
	fmt.Fprintf(&b, "idem conformance: %s\n\n", r.Target)
	tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tRESULT\tTIME\tEVIDENCE")
	counts := map[Status]int{}
	for _, res := range r.Results {
		counts[res.Status]++
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", res.Name, strings.ToUpper(string(res.Status)), fmtMs(res.DurationMs), res.Reason)
	}
	tw.Flush()
	for _, res := range r.Results {
		if res.Status != Fail && !verbose {
			continue
		}
		fmt.Fprintf(&b, "\n%s (%s): %s\n", res.Name, res.Status, res.Title)
		for _, n := range res.Notes {
			fmt.Fprintf(&b, "  note: %s\n", n)
		}
		for _, e := range res.Evidence {
			fmt.Fprintf(&b, "  %s\n", e)
		}
	}
	fmt.Fprintf(&b, "\n%d passed, %d failed, %d skipped\n", counts[Pass], counts[Fail], counts[Skip])
	_, err := io.WriteString(w, b.String())
	return err
}

func fmtMs(ms float64) string {
	if ms >= 1000 {
		return fmt.Sprintf("%.1fs", ms/1000)
	}
	return fmt.Sprintf("%.0fms", ms)
}
