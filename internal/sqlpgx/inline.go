package sqlpgx

import (
	"encoding/hex"
	"strconv"
	"strings"
)

// Inline returns query with each placeholder $n replaced by a literal of
// args[n-1], and ok; or ok false, and query is to be sent with parameters,
// when query or an argument is outside what it handles.
//
// Why it is safe: no byte of an argument reaches the SQL text as itself.
// A string is sent as convert_from(decode('<hex>','hex'),'UTF8') and a
// []byte as decode('<hex>','hex'): only the digits 0-9a-f travel between
// the quotes, whatever the argument holds (quotes, backslashes, $$, NUL,
// any byte), and the literal means the same under every setting of
// standard_conforming_strings and every client encoding. A nil []byte is
// NULL; []string and [][]byte are ARRAY[...] of those, cast to text[] and
// bytea[] (sqlc's array parameters; a nil element is empty, as in the
// array literal that convert sends). Each literal is parenthesised, so it
// is one operand wherever the placeholder stood. The value is the one the
// parameter would carry: convert_from refuses bytes that are not UTF-8, as
// the server refuses a text parameter that is not.
//
// Handled arguments: string, []byte, []string, [][]byte. A placeholder is
// replaced only outside quoted strings, quoted identifiers and comments;
// a query holding what the scanner below does not follow (a dollar-quoted
// string, an escape string E'...' or U&'...', a backslash, a nested
// comment) is left alone, ok false. The queries it is used on are idem's own constants.
func Inline(query string, args []any) (string, bool) {
	lits := make([]string, len(args))
	for i, a := range args {
		var ok bool
		if lits[i], ok = literal(a); !ok {
			return query, false
		}
	}
	if strings.ContainsRune(query, '\\') || strings.Contains(query, "&'") || strings.Contains(query, "&\"") {
		return query, false // backslash escapes, U&'...' or U&"..."
	}
	var b strings.Builder
	b.Grow(len(query) + 64)
	for i := 0; i < len(query); {
		c := query[i]
		switch {
		case c == '\'' || c == '"':
			// A quoted string or identifier; a doubled quote is one
			// character of it.
			j := i + 1
			for {
				k := strings.IndexByte(query[j:], c)
				if k < 0 {
					return query, false
				}
				j += k + 1
				if j < len(query) && query[j] == c {
					j++
					continue
				}
				break
			}
			if c == '\'' && i > 0 && (query[i-1] == 'E' || query[i-1] == 'e') && (i < 2 || !identChar(query[i-2])) {
				return query, false // E'...': backslash escapes
			}
			b.WriteString(query[i:j])
			i = j
		case c == '-' && strings.HasPrefix(query[i:], "--"):
			j := strings.IndexByte(query[i:], '\n')
			if j < 0 {
				j = len(query) - i
			}
			b.WriteString(query[i : i+j])
			i += j
		case c == '/' && strings.HasPrefix(query[i:], "/*"):
			j := strings.Index(query[i+2:], "*/")
			if j < 0 || strings.Contains(query[i+2:i+2+j], "/*") {
				return query, false
			}
			b.WriteString(query[i : i+2+j+2])
			i += 2 + j + 2
		case c == '$' && (i == 0 || !identChar(query[i-1])):
			j := i + 1
			for j < len(query) && query[j] >= '0' && query[j] <= '9' {
				j++
			}
			if j == i+1 {
				return query, false // $$ or $tag$: a dollar-quoted string
			}
			n, err := strconv.Atoi(query[i+1 : j])
			if err != nil || n < 1 || n > len(lits) || (j < len(query) && identChar(query[j])) {
				return query, false
			}
			b.WriteString(lits[n-1])
			i = j
		default:
			b.WriteByte(c)
			i++
		}
	}
	return b.String(), true
}

// identChar reports whether c may continue an identifier (or a
// placeholder's number).
func identChar(c byte) bool {
	return c == '_' || c == '$' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= 0x80
}

func literal(a any) (string, bool) {
	switch v := a.(type) {
	case string:
		return textLit(v), true
	case []byte:
		if v == nil {
			return "(NULL)", true
		}
		return byteaLit(v), true
	case []string:
		parts := make([]string, len(v))
		for i, s := range v {
			parts[i] = textLit(s)
		}
		return "(ARRAY[" + strings.Join(parts, ",") + "]::text[])", true
	case [][]byte:
		parts := make([]string, len(v))
		for i, s := range v {
			parts[i] = byteaLit(s) // nil too: empty, as the parameter's array literal sends it
		}
		return "(ARRAY[" + strings.Join(parts, ",") + "]::bytea[])", true
	}
	return "", false
}

func textLit(s string) string {
	return "(convert_from(decode('" + hex.EncodeToString([]byte(s)) + "','hex'),'UTF8'))"
}

func byteaLit(v []byte) string {
	return "(decode('" + hex.EncodeToString(v) + "','hex'))"
}
