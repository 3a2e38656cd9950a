package idempotency

import (
	"encoding/json"
	"net/http"
	"strings"

	"github.com/idemkit/idem"
)

// Problem is an RFC 9457 problem details object with idem's code member:
// the body of every answer the middleware writes itself. The codes are
// package idem's (idem.CodeKeyReused and the rest).
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	Code   string `json:"code"`
}

var problemTitles = map[string]string{
	idem.CodeKeyRequired:      "Idempotency-Key required",
	idem.CodeKeyInvalid:       "Idempotency-Key invalid",
	idem.CodeKeyReused:        "Idempotency-Key reused with a different request",
	idem.CodeKeyInProgress:    "A request with this Idempotency-Key is in progress",
	idem.CodeBodyTooLarge:     "Request body too large",
	idem.CodeBodyUnreadable:   "Request body unreadable",
	idem.CodeBodyTooDeep:      "Request body nested too deep",
	idem.CodeBodyAmbiguous:    "Request body has ambiguous member names",
	idem.CodeScopeUnknown:     "Principal unknown",
	idem.CodeStoreUnavailable: "Idempotency store unavailable",
	idem.CodeTxAborted:        "Success answered for a failed transaction",
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
	h.Set("Content-Type", idem.ProblemContentType)
	h.Set("Cache-Control", "no-store")
	h.Del("Content-Length")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
