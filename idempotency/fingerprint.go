package idempotency

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"mime"
	"net/http"
	"strings"
)

// ErrNotJSON is returned by CanonicalJSON for input that is not exactly one
// JSON value.
var ErrNotJSON = errors.New("idempotency: body is not one JSON value")

// CanonicalJSON re-encodes one JSON value with object members sorted by
// name (for a repeated name the last wins, as in encoding/json), no
// insignificant whitespace and no HTML escaping, so that two bodies that
// differ only in member order, spacing or string escapes canonicalise to the
// same bytes. Numbers keep their literal text (1.0 and 1 differ). Invalid
// JSON or trailing data is ErrNotJSON; it never panics.
func CanonicalJSON(b []byte) ([]byte, error) {
	return canonicalize(nil, b, nil)
}

func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}

// fingerprint hashes method, path (with query), the configured headers and
// the body: canonical JSON for a JSON content type that parses, else the
// raw bytes. Every part is length-prefixed.
func (c *config) fingerprint(r *http.Request, body []byte) Fingerprint {
	h := sha256.New()
	var n [8]byte
	part := func(b []byte) {
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	part([]byte(r.Method))
	part([]byte(r.URL.EscapedPath()))
	part([]byte(r.URL.RawQuery))
	for _, name := range c.FingerprintHeaders {
		part([]byte(strings.Join(r.Header.Values(name), "\x00")))
	}
	if isJSON(r.Header.Get("Content-Type")) {
		if canon, err := canonicalize(make([]byte, 0, len(body)), body, c.fingerprintFields); err == nil {
			part([]byte("json"))
			part(canon)
			var fp Fingerprint
			h.Sum(fp[:0])
			return fp
		}
	}
	part([]byte("raw"))
	part(body)
	var fp Fingerprint
	h.Sum(fp[:0])
	return fp
}
