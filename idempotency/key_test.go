package idempotency_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/idemkit/idem"
)

// TestParseKey holds idem's key rule, which the middleware applies, to the
// cases the middleware must accept and refuse.
func TestParseKey(t *testing.T) {
	t.Parallel()
	testCases := []struct {
		in, want string
		err      error
	}{
		{"abc", "abc", nil},
		{"  8e03978e-40d5-43e8-bc93-6894a57f9324\t", "8e03978e-40d5-43e8-bc93-6894a57f9324", nil},
		{`"8e03978e"`, "8e03978e", nil},
		{`"a\"b\\c"`, `a"b\c`, nil},
		{strings.Repeat("k", 255), strings.Repeat("k", 255), nil},
		{`"` + strings.Repeat("k", 255) + `"`, strings.Repeat("k", 255), nil},
		{"!~", "!~", nil},
		{"", "", idem.ErrKeyRequired},
		{"   ", "", idem.ErrKeyRequired},
		{strings.Repeat("k", 256), "", idem.ErrKeyInvalid},
		{`"` + strings.Repeat("k", 256) + `"`, "", idem.ErrKeyInvalid},
		{"a b", "", idem.ErrKeyInvalid},
		{"ключ", "", idem.ErrKeyInvalid},
		{"a\x00b", "", idem.ErrKeyInvalid},
		{"a\x7f", "", idem.ErrKeyInvalid},
		{`""`, "", idem.ErrKeyInvalid},
		{`"abc`, "", idem.ErrKeyInvalid},
		{`"ab"c"`, "", idem.ErrKeyInvalid},
		{`"a b"`, "", idem.ErrKeyInvalid},
		{`"a\n"`, "", idem.ErrKeyInvalid},
		{`"a\`, "", idem.ErrKeyInvalid},
		{`"abc";p=1`, "", idem.ErrKeyInvalid},
	}
	for _, tt := range testCases {
		got, err := idem.ParseKey(tt.in)
		if got != tt.want || !errors.Is(err, tt.err) || (tt.err == nil) != (err == nil) {
			t.Errorf("ParseKey(%q) = %q, %v; want %q, %v", tt.in, got, err, tt.want, tt.err)
		}
	}
}

// FuzzParseKey checks that the parser never panics, that every accepted key
// is 1–255 visible ASCII characters, that a bare key parses to itself and
// that quoting any accepted key round-trips.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"abc", `"abc"`, `"a\"b\\c"`, "", " ", `"`, `""`, `"\`, strings.Repeat("x", 256), "a b", "\x00", "ключ", `"a"b"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		k, err := idem.ParseKey(in)
		if err != nil {
			if !errors.Is(err, idem.ErrKeyInvalid) && !errors.Is(err, idem.ErrKeyRequired) {
				t.Fatalf("unnamed error %v", err)
			}
			return
		}
		if len(k) < 1 || len(k) > 255 {
			t.Fatalf("accepted key of length %d", len(k))
		}
		for i := 0; i < len(k); i++ {
			if k[i] < 0x21 || k[i] > 0x7e {
				t.Fatalf("accepted invisible byte %#x", k[i])
			}
		}
		q := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(k) + `"`
		if k2, err := idem.ParseKey(q); err != nil || k2 != k {
			t.Fatalf("quoted round trip of %q = %q, %v", k, k2, err)
		}
		if k[0] != '"' {
			if k2, err := idem.ParseKey(k); err != nil || k2 != k {
				t.Fatalf("bare round trip of %q = %q, %v", k, k2, err)
			}
		}
	})
}
