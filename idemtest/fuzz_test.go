package idemtest

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
)

// FuzzAltBody: the derived second body always differs from the first, as
// bytes and, for JSON, as a value (a canonicalising fingerprint must tell
// them apart too), and a JSON object stays a JSON object.
func FuzzAltBody(f *testing.F) {
	for _, s := range []string{
		`{"order_id":"o-1","customer_id":"c-1","amount_kopecks":1000}`,
		`{"a":"x"}`, `{"n":1e300}`, `{"n":9007199254740993}`, `[1,2]`, `["a"]`, `"s"`, `0`, `null`, ``, `not json`,
		`{"a":{"b":[{"c":-0}]}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		alt := altBody(body)
		if bytes.Equal(alt, body) {
			t.Fatalf("altBody(%q) is the same bytes", body)
		}
		var a, b any
		if json.Unmarshal(body, &a) != nil || json.Unmarshal(alt, &b) != nil {
			return
		}
		if reflect.DeepEqual(a, b) {
			t.Fatalf("altBody(%q) = %q: the same JSON value", body, alt)
		}
		if _, ok := a.(map[string]any); ok {
			if _, ok := b.(map[string]any); !ok {
				t.Fatalf("altBody(%q) = %q: no longer an object", body, alt)
			}
		}
	})
}

// FuzzParseCount: any count URL body gives a count or an error, never a
// panic.
func FuzzParseCount(f *testing.F) {
	for _, s := range []string{`3`, `[1,2]`, `{"count":4}`, `{"charges":[{},{}]}`, `{"charges":null}`, `{"count":1.5}`, ` 7 `, `{}`, `x`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		_, _ = parseCount(body)
	})
}

func TestParseCount(t *testing.T) {
	t.Parallel()
	testCases := []struct {
		body    string
		want    int64
		wantErr bool
	}{
		{`3`, 3, false},
		{" 12\n", 12, false},
		{`[1,2]`, 2, false},
		{`{"count":4}`, 4, false},
		{`{"charges":[{},{}]}`, 2, false},
		{`{"charges":null}`, 0, false},
		{`{"b":[1],"a":[1,2,3]}`, 3, false}, // first array member in name order
		{`{}`, 0, true},
		{`{"count":"4"}`, 0, true},
		{`hello`, 0, true},
	}
	for _, tt := range testCases {
		got, err := parseCount([]byte(tt.body))
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("parseCount(%q) = %d, %v; want %d, error %v", tt.body, got, err, tt.want, tt.wantErr)
		}
	}
}
