package idempotency

import (
	"encoding/json"
	"net/http"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/problem"
)

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

// writeProblem writes one of the middleware's own answers: internal/problem's
// shape (type URI per code, detail bounded) with a title per code.
func writeProblem(w http.ResponseWriter, status int, code, detail string) {
	p := problem.New(status, code, detail)
	if t, ok := problemTitles[code]; ok {
		p.Title = t
	}
	b, _ := json.Marshal(p)
	h := w.Header()
	h.Set("Content-Type", idem.ProblemContentType)
	h.Set("Cache-Control", "no-store")
	h.Del("Content-Length")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
