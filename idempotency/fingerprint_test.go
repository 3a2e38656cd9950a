package idempotency_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

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
		{`{"a":{"c":1,"b":{"e":1,"d":1}},"A0":[{"y":1,"x":1}]}`, `{"A0":[{"x":1,"y":1}],"a":{"b":{"d":1,"e":1},"c":1}}`},
	}
	for _, tt := range testCases {
		got, err := idempotency.CanonicalJSON([]byte(tt.in))
		if err != nil || string(got) != tt.want {
			t.Errorf("CanonicalJSON(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
	for _, bad := range []string{``, `{`, `{"a":1} x`, `{"a":1}{}`, `nul`, "\xff", "\"\xff\"", "{\"a\xfe\":1}", `"\x"`, `"\u12"`} {
		if _, err := idempotency.CanonicalJSON([]byte(bad)); !errors.Is(err, idempotency.ErrNotJSON) {
			t.Errorf("CanonicalJSON(%q) error = %v, want ErrNotJSON", bad, err)
		}
	}
}

// TestCanonicalFormUnchanged: the canonical form is byte for byte what the
// previous canonicaliser (the one that cloned subtrees) wrote, so that
// fingerprints stored before an upgrade still match after it. The wants
// were produced by that version.
func TestCanonicalFormUnchanged(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ in, want string }{
		{"{\"b\":1,\"a\":{\"d\":[3,{\"z\":true,\"y\":null}],\"c\":\"x\"}}", "{\"a\":{\"c\":\"x\",\"d\":[3,{\"y\":null,\"z\":true}]},\"b\":1}"},
		{"{\"é\":\"\\u00e9\\n\\t\\\"\\\\\\/\",\"e\":\"\u2028\u2029\",\"A\":\"\\ud83d\\ude00\\u0001\\u001f\\b\\f\"}", "{\"A\":\"😀\\u0001\\u001f\\b\\f\",\"e\":\"\\u2028\\u2029\",\"é\":\"é\\n\\t\\\"\\\\/\"}"},
		{"[{\"k2\":2,\"k10\":10,\"k1\":1},-0.5e+3,1.0,1E2,0]", "[{\"k1\":1,\"k10\":10,\"k2\":2},-0.5e+3,1.0,1E2,0]"},
		{"{\"\\u0061b\":1,\"ab\\u0063\":\"<&>\x7f\"}", "{\"ab\":1,\"abc\":\"<&>\x7f\"}"},
		{"{\"amount_kopecks\":1000,\"customer_id\":\"c1\",\"note\":\"bench\"}", "{\"amount_kopecks\":1000,\"customer_id\":\"c1\",\"note\":\"bench\"}"},
	} {
		got, err := idempotency.CanonicalJSON([]byte(tt.in))
		if err != nil || string(got) != tt.want {
			t.Errorf("CanonicalJSON(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
}

// referenceCanonical is the obvious (slow) canonicaliser: encoding/json
// into maps and back, which sorts keys. ok is false for anything that is
// not one JSON value in UTF-8; dup and deep tell the other refusals apart.
func referenceCanonical(in []byte, maxDepth int) (out []byte, ok, dup, deep bool) {
	if !utf8.Valid(in) || !json.Valid(in) {
		return nil, false, false, false
	}
	dup, deep = referenceShape(in, maxDepth)
	dec := json.NewDecoder(bytes.NewReader(in))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return nil, false, false, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false, false, false
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if enc.Encode(v) != nil {
		return nil, false, false, false
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), true, dup, deep
}

// referenceShape walks a valid body's tokens: dup is an object with two
// names equal under strings.EqualFold, compared pairwise (not with the
// package's folding); deep is nesting past maxDepth.
func referenceShape(in []byte, maxDepth int) (dup, deep bool) {
	dec := json.NewDecoder(bytes.NewReader(in))
	type frame struct {
		obj   bool
		names []string
		key   bool // the next string token of an object is a name
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err != nil {
			return dup, deep
		}
		top := len(stack) - 1
		isName := false
		if top >= 0 && stack[top].obj {
			if _, ok := tok.(string); ok && stack[top].key {
				isName = true
			}
		}
		switch x := tok.(type) {
		case json.Delim:
			switch x {
			case '{', '[':
				if top >= 0 && stack[top].obj {
					stack[top].key = true
				}
				stack = append(stack, &frame{obj: x == '{', key: true})
				if len(stack) > maxDepth {
					deep = true
				}
			default:
				stack = stack[:top]
				if top > 0 && stack[top-1].obj {
					stack[top-1].key = true
				}
			}
			continue
		case string:
			if isName {
				for _, n := range stack[top].names {
					if strings.EqualFold(n, x) {
						dup = true
					}
				}
				stack[top].names = append(stack[top].names, x)
				stack[top].key = false
				continue
			}
		}
		if top >= 0 && stack[top].obj {
			stack[top].key = true
		}
	}
}

// allocated is how many bytes f allocates. Exact only with nothing else
// running: fuzz targets run after every test, parallel ones included.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// fastest is the shortest of a few runs of f: the run least disturbed by
// the rest of the machine.
func fastest(f func()) time.Duration {
	best := time.Duration(1<<63 - 1)
	for range 5 {
		start := time.Now()
		f()
		best = min(best, time.Since(start))
	}
	return best
}

// FuzzCanonicalJSON checks that canonicalisation never panics, is
// idempotent, keeps the value (same decoded data as the input), agrees byte
// for byte with the encoding/json reference, and refuses what the
// reference calls ambiguous or too deep.
func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{"{\"a\":\"\u2028\\u0041\xff\"}", "{\"a\":\"\u2028\\u0041\"}", `{"a":1,"a":{"c":[],"b":-0.5e+3}}`, `{"b":1,"a":{"c":[],"b":-0.5e+3}}`, `[1,]`, `01`, `-`, `1.`, `{"a" 1}`, `{"b":1,"a":2}`, `[1,2,{"z":[],"y":{}}]`, `"\u00e9\n"`, `{"a":1.0e10}`, `{`, `{"a":1,"a":2}`, `{"a":1,"A":2}`, "{\"k\":1,\"\u212a\":2}", "{\"i\":1,\"\u0130\":2}", "{\"S\":1,\"\u017f\":2}", `{"\ud800":1,"\udc00":2}`, `null`, ` 7 `,
		nested(65, "1"), nested(64, "1"), nested(10000, longString(1000)), nestedUnsorted(64, longString(200<<10), "f"), manyKeys(20000), `"` + strings.Repeat(`\u00e9\"`, 20000) + `"`} {
		f.Add([]byte(s))
	}
	const maxDepth = idempotency.MaxBodyDepthDefault
	f.Fuzz(func(t *testing.T, in []byte) {
		c1, err := idempotency.CanonicalJSON(in)
		ref, ok, dup, deep := referenceCanonical(in, maxDepth)
		switch {
		case !ok:
			if !errors.Is(err, idempotency.ErrNotJSON) && !errors.Is(err, idempotency.ErrBodyAmbiguous) && !errors.Is(err, idempotency.ErrBodyTooDeep) {
				t.Fatalf("CanonicalJSON(%q) = %q, %v; the reference refuses it", in, c1, err)
			}
			return
		case dup && deep:
			if !errors.Is(err, idempotency.ErrBodyAmbiguous) && !errors.Is(err, idempotency.ErrBodyTooDeep) {
				t.Fatalf("CanonicalJSON(%q) = %v, want ErrBodyAmbiguous or ErrBodyTooDeep", in, err)
			}
			return
		case dup:
			if !errors.Is(err, idempotency.ErrBodyAmbiguous) {
				t.Fatalf("CanonicalJSON(%q) = %q, %v; want ErrBodyAmbiguous", in, c1, err)
			}
			return
		case deep:
			if !errors.Is(err, idempotency.ErrBodyTooDeep) {
				t.Fatalf("CanonicalJSON(%q) = %q, %v; want ErrBodyTooDeep", in, c1, err)
			}
			return
		}
		if err != nil || !bytes.Equal(ref, c1) {
			t.Fatalf("CanonicalJSON(%q) = %q, %v; reference %q", in, c1, err, ref)
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

// FuzzCanonicalCost bounds the memory and time of one canonicalisation per
// byte, valid or not. Memory is measured; time is a ratio to json.Valid over
// the same bytes in the same run, so that it holds on a slow or busy
// machine: the cost must grow like a validator's, linearly. The seeds are
// the bodies that made the former canonicaliser quadratic.
func FuzzCanonicalCost(f *testing.F) {
	big := longString(900 << 10)
	for _, s := range []string{
		`{"a":1}`, nested(10000, "1"), nested(10000, longString(100<<10)), nested(64, big),
		nestedUnsorted(64, big, strings.Repeat("f", 1000)), manyKeys(50000), `"` + strings.Repeat(`\u00e9\n`, 100000) + `"`,
		`[` + strings.Repeat(`{"b":1,"a":2},`, 50000) + `0]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) < 4<<10 {
			return // fixed costs dominate; nothing to learn per byte
		}
		if alloc, limit := allocated(func() { _, _ = idempotency.CanonicalJSON(in) }), 16*uint64(len(in))+1<<20; alloc > limit {
			t.Fatalf("%d bytes allocated for %d bytes of input (%.1f per byte), want at most %d", alloc, len(in), float64(alloc)/float64(len(in)), limit)
		}
		canon := fastest(func() { _, _ = idempotency.CanonicalJSON(in) })
		valid := fastest(func() { _ = json.Valid(in) })
		if limit := 50*valid + 5*time.Millisecond; canon > limit {
			t.Fatalf("canonicalising %d bytes took %s, json.Valid %s: more than 50 times as long", len(in), canon, valid)
		}
	})
}

// TestFoldRuneIsEqualFold: two names fold alike (and are refused as
// ambiguous) exactly when strings.EqualFold calls them equal: foldRune is
// constant on every simple-folding orbit and maps each rune into its own
// orbit. Checked for every rune.
func TestFoldRuneIsEqualFold(t *testing.T) {
	t.Parallel()
	for r := rune(0); r <= unicode.MaxRune; r++ {
		if !utf8.ValidRune(r) {
			continue
		}
		f := idempotency.FoldRune(r)
		if s := unicode.SimpleFold(r); idempotency.FoldRune(s) != f {
			t.Fatalf("%U folds to %U, but %U of its orbit to %U", r, f, s, idempotency.FoldRune(s))
		}
		if !strings.EqualFold(string(r), string(f)) {
			t.Fatalf("%U folds to %U, which strings.EqualFold calls different", r, f)
		}
	}
}

// TestEncodingJSONFoldsAsAssumed holds the premise of foldRune to the
// encoding/json the tests are built with: a member is decoded into a field
// whose tag differs from its name exactly when strings.EqualFold calls the
// two equal. Runes: Latin, Greek, Cyrillic and known odd ones (the Kelvin
// sign, long s, dotted and dotless i, which full case mapping would fold
// and simple folding does not).
func TestEncodingJSONFoldsAsAssumed(t *testing.T) {
	t.Parallel()
	var runes []rune
	for r := rune('A'); r < 0x530; r++ {
		runes = append(runes, r)
	}
	runes = append(runes, 'ſ', 'K', 'Å', 'ϴ', 'ẞ', 'ß', 'İ', 'ı', 'ǅ', 'ᲀ')
	for _, r := range runes {
		if !unicode.IsLetter(r) {
			continue
		}
		typ := reflect.StructOf([]reflect.StructField{{Name: "F", Type: reflect.TypeFor[int](), Tag: reflect.StructTag(`json:"x` + string(r) + `"`)}})
		for _, s := range []rune{r, unicode.ToUpper(r), unicode.ToLower(r), unicode.ToTitle(r), unicode.SimpleFold(r), unicode.SimpleFold(unicode.SimpleFold(r)), 'i', 'I', 's', 'k'} {
			v := reflect.New(typ)
			if err := json.Unmarshal([]byte(`{"x`+string(s)+`":1}`), v.Interface()); err != nil {
				t.Fatal(err)
			}
			matched := v.Elem().Field(0).Int() == 1
			if want := strings.EqualFold(string(r), string(s)); matched != want {
				t.Errorf("encoding/json decodes member %q into field %q: %v; strings.EqualFold says %v", "x"+string(s), "x"+string(r), matched, want)
			}
		}
	}
}
