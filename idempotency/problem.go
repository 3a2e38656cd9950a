package idempotency

import (
	"encoding/json"
	"net/http"
	"strings"
)

// Problem codes: the `code` member of the problem+json bodies the middleware
// writes (ARCHITECTURE.md lists the first four).
const (
	CodeKeyRequired      = "IDEMPOTENCY_KEY_REQUIRED"    // 400
	CodeKeyInvalid       = "IDEMPOTENCY_KEY_INVALID"     // 400
	CodeKeyReused        = "IDEMPOTENCY_KEY_REUSED"      // 409, or 422 by Config.MismatchStatus
	CodeKeyInProgress    = "IDEMPOTENCY_KEY_IN_PROGRESS" // 409 with Retry-After
	CodeBodyTooLarge     = "REQUEST_BODY_TOO_LARGE"      // 413
	CodeBodyUnreadable   = "REQUEST_BODY_UNREADABLE"     // 400: the body could not be read
	CodeScopeUnknown     = "IDEMPOTENCY_SCOPE_UNKNOWN"   // 401: Config.Scope failed
	CodeStoreUnavailable = "IDEMPOTENCY_STORE_UNAVAILABLE"
)

// ProblemContentType is the media type of RFC 9457 problem details.
const ProblemContentType = "application/problem+json"

// Problem is an RFC 9457 problem details object with idem's `code` member.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	Code   string `json:"code"`
}

var problemTitles = map[string]string{
	CodeKeyRequired:      "Idempotency-Key required",
	CodeKeyInvalid:       "Idempotency-Key invalid",
	CodeKeyReused:        "Idempotency-Key reused with a different request",
	CodeKeyInProgress:    "A request with this Idempotency-Key is in progress",
	CodeBodyTooLarge:     "Request body too large",
	CodeBodyUnreadable:   "Request body unreadable",
	CodeScopeUnknown:     "Principal unknown",
	CodeStoreUnavailable: "Idempotency store unavailable",
}

// problemType is a stable URI per code; it names the problem, it is not
// meant to be fetched.
func problemType(code string) string {
	return "https://github.com/idemkit/idem/blob/main/docs/problems.md#" + strings.ToLower(strings.ReplaceAll(code, "_", "-"))
}

func writeProblem(w http.ResponseWriter, status int, code, detail string) {
	p := Problem{Type: problemType(code), Title: problemTitles[code], Status: status, Detail: detail, Code: code}
	b, _ := json.Marshal(p)
	h := w.Header()
	h.Set("Content-Type", ProblemContentType)
	h.Set("Cache-Control", "no-store")
	h.Del("Content-Length")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
