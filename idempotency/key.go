package idempotency

import (
	"net/http"
	"strings"
)

// MaxKeyLen is the longest accepted Idempotency-Key, in characters.
const MaxKeyLen = 255

// ParseKey parses an Idempotency-Key header value: either a bare token of
// 1–255 visible ASCII characters (%x21-7E), or the IETF draft's
// structured-field string form, a double-quoted string whose content (after
// the \" and \\ escapes) is 1–255 visible ASCII characters. Surrounding
// spaces and tabs are ignored. An empty value is ErrKeyRequired; anything
// else that does not parse is ErrKeyInvalid. It never panics.
func ParseKey(v string) (string, error) {
	v = strings.Trim(v, " \t")
	if v == "" {
		return "", ErrKeyRequired
	}
	if v[0] != '"' {
		if len(v) > MaxKeyLen || !visible(v) {
			return "", ErrKeyInvalid
		}
		return v, nil
	}
	// sf-string: DQUOTE *( unescaped / "\" ( DQUOTE / "\" ) ) DQUOTE
	var b strings.Builder
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i >= len(v) || (v[i] != '"' && v[i] != '\\') {
				return "", ErrKeyInvalid
			}
			b.WriteByte(v[i])
		case c == '"':
			if i != len(v)-1 {
				return "", ErrKeyInvalid
			}
			k := b.String()
			if k == "" || len(k) > MaxKeyLen || !visible(k) {
				return "", ErrKeyInvalid
			}
			return k, nil
		case c < 0x21 || c > 0x7e:
			return "", ErrKeyInvalid
		default:
			b.WriteByte(c)
		}
		if b.Len() > MaxKeyLen {
			return "", ErrKeyInvalid
		}
	}
	return "", ErrKeyInvalid // no closing quote
}

func visible(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// keyFromRequest reads the one Idempotency-Key header of r. Two header
// lines are invalid: they would make the key ambiguous.
func keyFromRequest(r *http.Request) (string, error) {
	vs := r.Header.Values(HeaderName)
	switch len(vs) {
	case 0:
		return "", ErrKeyRequired
	case 1:
		return ParseKey(vs[0])
	}
	return "", ErrKeyInvalid
}
