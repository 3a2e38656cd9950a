package idempotency

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"mime"
	"net/http"
	"strings"
)

func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}

// fingerprint hashes method, path (with query), the configured headers and
// the body: the canonical form (see canon) for a JSON content type that
// parses, else the raw bytes. Every part is length-prefixed. A JSON body
// nested too deep or with ambiguous member names is an error
// (ErrBodyTooDeep, ErrBodyAmbiguous): it is refused, not fingerprinted.
func (c *config) fingerprint(r *http.Request, body []byte) (Fingerprint, error) {
	return c.fingerprintOf(r.Method, r.URL.EscapedPath(), r.URL.RawQuery, r.Header.Values, body)
}

// fingerprintOf is fingerprint over the request's parts: header returns the
// values of a request header.
func (c *config) fingerprintOf(method, path, rawQuery string, header func(string) []string, body []byte) (Fingerprint, error) {
	h := sha256.New()
	var n [8]byte
	part := func(b []byte) {
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	part([]byte(method))
	part([]byte(path))
	part([]byte(rawQuery))
	for _, name := range c.FingerprintHeaders {
		part([]byte(strings.Join(header(name), "\x00")))
	}
	var fp Fingerprint
	var ct string
	if vs := header("Content-Type"); len(vs) > 0 {
		ct = vs[0]
	}
	if isJSON(ct) {
		canon, err := canonicalize(body, c.fields, c.MaxBodyDepth)
		switch {
		case err == nil:
			part([]byte("json"))
			part(canon)
			h.Sum(fp[:0])
			return fp, nil
		case !errors.Is(err, errNotJSON):
			return fp, err
		}
	}
	part([]byte("raw"))
	part(body)
	h.Sum(fp[:0])
	return fp, nil
}
