package idempotency_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"testing"

	"github.com/idemkit/idem/idempotency"
)

func TestCanonicalJSON(t *testing.T) {
	t.Parallel()
	testCases := []struct{ in, want string }{
		{`{"b":1,"a":2}`, `{"a":2,"b":1}`},
		{" {\n \"a\" : [ 1 , {\"d\":null, \"c\":true} ] }\n", `{"a":[1,{"c":true,"d":null}]}`},
		{`{"a":"<&>"}`, `{"a":"<&>"}`},
		{`1.50`, `1.50`},
		{`"x"`, `"x"`},
		{`{"a":12345678901234567890123}`, `{"a":12345678901234567890123}`},
	}
	for _, tt := range testCases {
		got, err := idempotency.CanonicalJSON([]byte(tt.in))
		if err != nil || string(got) != tt.want {
			t.Errorf("CanonicalJSON(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
	for _, bad := range []string{``, `{`, `{"a":1} x`, `{"a":1}{}`, `nul`, "\xff"} {
		if _, err := idempotency.CanonicalJSON([]byte(bad)); !errors.Is(err, idempotency.ErrNotJSON) {
			t.Errorf("CanonicalJSON(%q) error = %v, want ErrNotJSON", bad, err)
		}
	}
}

// referenceCanonical is the obvious (slow) canonicaliser: encoding/json
// into maps and back, which sorts keys.
func referenceCanonical(in []byte) ([]byte, bool) {
	dec := json.NewDecoder(bytes.NewReader(in))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if enc.Encode(v) != nil {
		return nil, false
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), true
}

// FuzzCanonicalJSON checks that canonicalisation never panics, is
// idempotent, keeps the value (same decoded data as the input) and agrees
// byte for byte with the encoding/json reference, valid or not.
func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{"{\"a\":\"\u2028\\u0041\xff\"}", `{"a":1,"a":{"c":[],"b":-0.5e+3}}`, `[1,]`, `01`, `-`, `1.`, `{"a" 1}`, `{"b":1,"a":2}`, `[1,2,{"z":[],"y":{}}]`, `"\u00e9\n"`, `{"a":1.0e10}`, `{`, `{"a":1,"a":2}`, `null`, ` 7 `} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		c1, err := idempotency.CanonicalJSON(in)
		ref, ok := referenceCanonical(in)
		if ok != (err == nil) || (ok && !bytes.Equal(ref, c1)) {
			t.Fatalf("CanonicalJSON(%q) = %q, %v; reference %q, valid %v", in, c1, err, ref, ok)
		}
		if err != nil {
			if !errors.Is(err, idempotency.ErrNotJSON) {
				t.Fatalf("unnamed error %v", err)
			}
			return
		}
		c2, err := idempotency.CanonicalJSON(c1)
		if err != nil || !bytes.Equal(c1, c2) {
			t.Fatalf("not idempotent: %q -> %q -> %q, %v", in, c1, c2, err)
		}
		var v1, v2 any
		d1 := json.NewDecoder(bytes.NewReader(in))
		d1.UseNumber()
		d2 := json.NewDecoder(bytes.NewReader(c1))
		d2.UseNumber()
		if d1.Decode(&v1) != nil || d2.Decode(&v2) != nil || !reflect.DeepEqual(v1, v2) {
			t.Fatalf("value changed: %q -> %q", in, c1)
		}
	})
}
