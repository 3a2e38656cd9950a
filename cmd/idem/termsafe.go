package main

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// termSafe makes text that came from the database or a broker (an event
// id, a header, an error, a payload) safe to print on an operator's
// terminal: control characters (C0, DEL, C1 — ESC and CSI start the
// sequences that move the cursor, recolour or retitle the terminal, or
// rewrite what was printed before), Unicode format characters (bidi
// overrides and zero-width characters, which make printed text read other
// than it is) and invalid UTF-8 are written as Go escapes (\x1b, \u202e),
// so what is shown is what is stored. Newlines and tabs are escaped too
// unless keepLines (a pretty-printed JSON payload keeps its lines; its
// other characters are escaped all the same).
func termSafe(s string, keepLines bool) string {
	clean := true
	for _, r := range s {
		if unsafeRune(r, keepLines) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case unsafeRune(r, keepLines) && r < 0x100:
			fmt.Fprintf(&b, `\x%02x`, r)
		case unsafeRune(r, keepLines):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

func unsafeRune(r rune, keepLines bool) bool {
	if keepLines && (r == '\n' || r == '\t') {
		return false
	}
	return r == utf8.RuneError || unicode.IsControl(r) || unicode.Is(unicode.Cf, r)
}

// oneLine is termSafe on one line: s's white space folded, at most max
// runes (an ellipsis marks a cut), then escaped.
func oneLineText(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > max {
		s = string(r[:max-1]) + "…"
	}
	return termSafe(s, false)
}
