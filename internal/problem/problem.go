// Package problem writes the RFC 9457 problem details of idem's programs
// (billing, paysim, and the connection refusals of internal/httpserver):
// one shape with idem's code member, a stable type URI per code, and a
// detail bounded in size whatever the client sent.
//
// It guarantees that a detail is valid UTF-8 of at most MaxDetail bytes,
// cut on a character boundary, so that an answer that quotes input (an
// unknown member's name, a method, a path) never grows with it, even when
// it is stored as an idempotent answer. It does not remove what the input
// may say: quote as little of it as the message needs.
package problem

import (
	"encoding/json"
	"net/http"
	"strings"
	"unicode/utf8"
)

// ContentType is the media type of RFC 9457 problem details.
const ContentType = "application/problem+json"

// MaxDetail bounds the bytes of Details.Detail.
const MaxDetail = 200

// Details is a problem details object with idem's code member.
type Details struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	Code   string `json:"code"`
}

// TypeURI is the stable type of code's problems: it names the problem in
// docs/problems.md, it is not meant to be fetched.
func TypeURI(code string) string {
	return "https://github.com/idemkit/idem/blob/main/docs/problems.md#" + strings.ToLower(strings.ReplaceAll(code, "_", "-"))
}

// New returns the problem of status and code, titled with the status text;
// detail is made valid UTF-8 and clipped to MaxDetail bytes.
func New(status int, code, detail string) Details {
	return Details{
		Type:   TypeURI(code),
		Title:  http.StatusText(status),
		Status: status,
		Detail: Clip(strings.ToValidUTF8(detail, "\uFFFD"), MaxDetail),
		Code:   code,
	}
}

// Marshal is New's problem in JSON.
func Marshal(status int, code, detail string) []byte {
	b, _ := json.Marshal(New(status, code, detail)) // strings and an int: cannot fail
	return b
}

// Write answers with New's problem, marked not to be cached.
func Write(w http.ResponseWriter, status int, code, detail string) {
	b := Marshal(status, code, detail)
	h := w.Header()
	h.Set("Content-Type", ContentType)
	h.Set("Cache-Control", "no-store")
	h.Del("Content-Length")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// Clip returns s if it has at most n bytes, else its longest prefix that
// ends on a character boundary and, with "…" appended to mark the cut,
// has at most n bytes. Below 3 bytes there is no room for the mark: the
// prefix alone.
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "…"
	if n < len(mark) {
		return prefix(s, max(n, 0))
	}
	return prefix(s, n-len(mark)) + mark
}

// prefix is s cut to at most n bytes on a character boundary.
func prefix(s string, n int) string {
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
