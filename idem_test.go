package idem_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/idemkit/idem"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseKey(t *testing.T) {
	t.Parallel()
	testCases := []struct {
		in, want string
		err      error
	}{
		{"abc", "abc", nil},
		{"  abc\t", "abc", nil},
		{`"a\"b\\c"`, `a"b\c`, nil},
		{"", "", idem.ErrKeyRequired},
		{" \t", "", idem.ErrKeyRequired},
		{"a b", "", idem.ErrKeyInvalid},
		{"é", "", idem.ErrKeyInvalid},
		{`""`, "", idem.ErrKeyInvalid},
		{`"abc`, "", idem.ErrKeyInvalid},
		{`"a"b"`, "", idem.ErrKeyInvalid},
		{`"a\x"`, "", idem.ErrKeyInvalid},
		{strings.Repeat("k", idem.MaxKeyLength), strings.Repeat("k", idem.MaxKeyLength), nil},
		{strings.Repeat("k", idem.MaxKeyLength+1), "", idem.ErrKeyInvalid},
		{`"` + strings.Repeat("k", idem.MaxKeyLength+1) + `"`, "", idem.ErrKeyInvalid},
	}
	for _, tt := range testCases {
		got, err := idem.ParseKey(tt.in)
		if got != tt.want || !errors.Is(err, tt.err) || (tt.err == nil && err != nil) {
			t.Errorf("ParseKey(%q) = %q, %v; want %q, %v", tt.in, got, err, tt.want, tt.err)
		}
	}
}

func TestValidateKeyAgreesWithParseKey(t *testing.T) {
	t.Parallel()
	for _, k := range []string{"a", "o-42:charge:r-7", strings.Repeat("x", 255), strings.Repeat("x", 256), "", "a b", "\x00", "\"q\""} {
		_, perr := idem.ParseKey(k)
		verr := idem.ValidateKey(k)
		bare := k != "" && k[0] != '"'
		if bare && (perr == nil) != (verr == nil) {
			t.Errorf("%q: ParseKey %v, ValidateKey %v disagree", k, perr, verr)
		}
	}
}

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"abc", `"a\"b"`, "", `"`, `\`, strings.Repeat("z", 300)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		k, err := idem.ParseKey(v)
		if err != nil {
			return
		}
		if verr := idem.ValidateKey(k); verr != nil {
			t.Fatalf("ParseKey(%q) = %q, which ValidateKey refuses: %v", v, k, verr)
		}
		// A key sent bare parses back to itself.
		if k2, err := idem.ParseKey(k); err != nil || k2 != k {
			t.Fatalf("round trip of %q: %q, %v", k, k2, err)
		}
	})
}

type ev struct{ n int }
type key struct{}

func TestJoinHooks(t *testing.T) {
	t.Parallel()
	var order []string
	a := func(ctx context.Context, e ev) context.Context {
		order = append(order, "a")
		return context.WithValue(ctx, key{}, "from-a")
	}
	b := func(ctx context.Context, e ev) context.Context {
		order = append(order, "b:"+ctx.Value(key{}).(string))
		return nil // a nil return keeps the ctx
	}
	if idem.JoinHooks[ev](nil, nil) != nil {
		t.Fatal("joining nil hooks must give nil")
	}
	h := idem.JoinHooks(a, nil, b)
	ctx := idem.CallHook(h, context.Background(), ev{1})
	if got := strings.Join(order, ","); got != "a,b:from-a" {
		t.Fatalf("order %s", got)
	}
	if ctx.Value(key{}) != "from-a" {
		t.Fatal("ctx of the first hook lost")
	}
	if idem.CallHook[ev](nil, ctx, ev{}) != ctx {
		t.Fatal("a nil hook must return ctx")
	}
}
