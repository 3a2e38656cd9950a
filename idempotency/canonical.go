package idempotency

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"hash/maphash"
	"math"
	"slices"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// The canonical form of a JSON body, which the fingerprint hashes: the body
// re-encoded with the members of every object sorted by their decoded names
// (bytewise), no insignificant whitespace, and strings written as
// encoding/json writes them without HTML escaping, so that "\u0061" and "a"
// are one string. Numbers keep their literal text (1.0 and 1 differ). It is
// byte for byte the form of earlier versions for every body both accept, so
// fingerprints stored before an upgrade still match after it.
//
// What is refused instead of canonicalised:
//
//   - a body nested deeper than the limit (Config.MaxBodyDepth):
//     ErrBodyTooDeep, answered 400;
//   - an object with two members whose names encoding/json could take for
//     one, equal ignoring case as strings.EqualFold compares them (see
//     foldRune): ErrBodyAmbiguous, answered 400. encoding/json
//     matches names to struct fields ignoring case and lets the last match
//     win, so {"amount":100,"Amount":5} and {"Amount":5,"amount":100}
//     decode to different requests; no canonical form can tell them apart
//     and keep the member order meaningless;
//   - anything that is not exactly one JSON value in UTF-8 (syntax errors,
//     trailing data, invalid UTF-8, which encoding/json would turn into
//     U+FFFD and so merge distinct bodies): errNotJSON, and the fingerprint
//     takes the raw bytes.
//
// # Cost
//
// Linear in the body, whatever its shape. A first pass validates the body
// and writes its canonical text into buf with every object's members in
// input order. An object whose members are out of order (or, at the top,
// filtered by FingerprintFields) leaves a record: its span in buf and its
// members' spans, sorted. A second pass, only if there are records, copies
// buf to the output, writing a recorded object's members in their sorted
// order. Every byte is written twice at most; the sorting costs
// O(k log k) name comparisons for an object of k members. No subtree is
// copied once per level of nesting, which is what made a 60 KB body nested
// 10,000 deep cost a quarter of a second before.
type canon struct {
	in       []byte
	pos      int
	buf      []byte
	maxDepth int
	// fields are the folded names FingerprintFields keeps at the top; nil
	// keeps every member.
	fields map[string]struct{}

	stack  []member  // members of the objects being read, innermost last
	arena  []member  // members of recorded objects, each object's sorted
	recs   []objRec  // recorded objects, in the order they closed
	names  []byte    // decoded names that have escapes
	order  []int32   // scratch of checkNames
	hashes []uint64  // scratch of checkNames
	keys   []sortKey // scratch of object
	fold   []byte    // scratch of checkNames and wanted
}

// member is one `"name":value` of an object. Offsets are int32 to keep the
// side tables small; canonicalize refuses larger inputs.
type member struct {
	nlo, nhi int32 // the decoded name: in[nlo:nhi], or names[nlo:nhi] if esc
	lo, hi   int32 // `"name":value` in buf
	esc      bool
}

// sortKey orders the members of one object: prefix is the first eight
// bytes of the name as a big-endian integer (zero-padded), so that
// comparing two prefixes is comparing the names' first eight bytes.
type sortKey struct {
	prefix uint64
	i      int32 // the member, in the object
}

func namePrefix(name []byte) uint64 {
	var b [8]byte
	copy(b[:], name)
	return binary.BigEndian.Uint64(b[:])
}

// objRec is an object whose members the second pass reorders.
type objRec struct {
	start, end int32 // the object, braces included, in buf
	mlo, mhi   int32 // its kept members, sorted, in arena
}

// maxBodyDepthLimit is the largest Config.MaxBodyDepth: encoding/json's
// own limit.
const maxBodyDepthLimit = 10000

// errNotJSON means the body is not one JSON value in UTF-8: the fingerprint
// takes its raw bytes.
var errNotJSON = errors.New("idempotency: body is not one JSON value")

// canonicalize returns the canonical form of in (see canon). fields, when
// not nil, holds the folded names of the top-level members to keep
// (foldName). maxDepth bounds the nesting of objects and arrays, the
// outermost counting 1.
func canonicalize(in []byte, fields map[string]struct{}, maxDepth int) ([]byte, error) {
	if len(in) > math.MaxInt32/2 {
		return nil, errNotJSON // too large for the side tables: raw bytes
	}
	c := &canon{in: in, buf: make([]byte, 0, len(in)), maxDepth: maxDepth, fields: fields}
	c.ws()
	if err := c.value(0); err != nil {
		return nil, err
	}
	c.ws()
	if c.pos != len(c.in) {
		return nil, errNotJSON
	}
	if len(c.recs) == 0 {
		return c.buf, nil
	}
	slices.SortFunc(c.recs, func(a, b objRec) int { return int(a.start - b.start) })
	return c.emit(make([]byte, 0, len(c.buf)), 0, int32(len(c.buf))), nil
}

func (c *canon) ws() {
	for c.pos < len(c.in) {
		switch c.in[c.pos] {
		case ' ', '\t', '\n', '\r':
			c.pos++
		default:
			return
		}
	}
}

// value reads one value at pos; depth is the nesting of its container.
func (c *canon) value(depth int) error {
	if c.pos >= len(c.in) {
		return errNotJSON
	}
	switch b := c.in[c.pos]; {
	case b == '{', b == '[':
		if depth+1 > c.maxDepth {
			return ErrBodyTooDeep
		}
		if b == '{' {
			return c.object(depth + 1)
		}
		return c.array(depth + 1)
	case b == '"':
		_, _, _, err := c.str(false)
		return err
	case b == 't':
		return c.lit("true")
	case b == 'f':
		return c.lit("false")
	case b == 'n':
		return c.lit("null")
	case b == '-' || (b >= '0' && b <= '9'):
		return c.number()
	}
	return errNotJSON
}

func (c *canon) lit(s string) error {
	if !bytes.HasPrefix(c.in[c.pos:], []byte(s)) {
		return errNotJSON
	}
	c.pos += len(s)
	c.buf = append(c.buf, s...)
	return nil
}

// number copies a number literal as it is, after checking its grammar.
func (c *canon) number() error {
	in, i := c.in, c.pos
	start := i
	if in[i] == '-' {
		i++
	}
	switch {
	case i < len(in) && in[i] == '0':
		i++
	case i < len(in) && in[i] >= '1' && in[i] <= '9':
		for i < len(in) && in[i] >= '0' && in[i] <= '9' {
			i++
		}
	default:
		return errNotJSON
	}
	if i < len(in) && in[i] == '.' {
		i++
		d := i
		for i < len(in) && in[i] >= '0' && in[i] <= '9' {
			i++
		}
		if i == d {
			return errNotJSON
		}
	}
	if i < len(in) && (in[i] == 'e' || in[i] == 'E') {
		i++
		if i < len(in) && (in[i] == '+' || in[i] == '-') {
			i++
		}
		d := i
		for i < len(in) && in[i] >= '0' && in[i] <= '9' {
			i++
		}
		if i == d {
			return errNotJSON
		}
	}
	c.pos = i
	c.buf = append(c.buf, in[start:i]...)
	return nil
}

// str reads the string literal at pos and writes its canonical encoding to
// buf. A literal with no escapes and no U+2028 or U+2029 is its own
// canonical encoding and is copied as it is; any other is decoded and
// re-encoded as encoding/json would write it. With keep (member names), it
// returns where the decoded value is: in[lo:hi] when the literal has no
// escapes (esc false), else names[lo:hi].
func (c *canon) str(keep bool) (lo, hi int32, esc bool, err error) {
	in := c.in
	start := c.pos
	i := start + 1
	simple := true
	for {
		if i >= len(in) {
			return 0, 0, false, errNotJSON
		}
		b := in[i]
		if b == '"' {
			break
		}
		switch {
		case b < 0x20:
			return 0, 0, false, errNotJSON
		case b == '\\':
			n := escapeLen(in[i:])
			if n == 0 {
				return 0, 0, false, errNotJSON
			}
			simple = false
			i += n
		case b >= utf8.RuneSelf:
			r, size := utf8.DecodeRune(in[i:])
			if r == utf8.RuneError && size == 1 {
				return 0, 0, false, errNotJSON
			}
			if r == '\u2028' || r == '\u2029' {
				simple = false
			}
			i += size
		default:
			i++
		}
	}
	end := i + 1 // past the closing quote
	c.pos = end
	if simple {
		c.buf = append(c.buf, in[start:end]...)
		return int32(start + 1), int32(end - 1), false, nil
	}
	// Decode into names, then encode from there. Only member names stay
	// (they are sorted by their decoded form); a value's decoded text is
	// dropped again at once.
	mark := len(c.names)
	c.names = decodeString(c.names, in[start+1:end-1])
	c.buf = encodeString(c.buf, c.names[mark:])
	if !keep {
		c.names = c.names[:mark]
		return 0, 0, false, nil
	}
	return int32(mark), int32(len(c.names)), true, nil
}

// escapeLen is the length of the valid escape sequence at the start of s
// (which starts with a backslash), or 0.
func escapeLen(s []byte) int {
	if len(s) < 2 {
		return 0
	}
	switch s[1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return 2
	case 'u':
		if len(s) < 6 {
			return 0
		}
		for _, h := range s[2:6] {
			if hexVal(h) < 0 {
				return 0
			}
		}
		return 6
	}
	return 0
}

func hexVal(b byte) rune {
	switch {
	case '0' <= b && b <= '9':
		return rune(b - '0')
	case 'a' <= b && b <= 'f':
		return rune(b - 'a' + 10)
	case 'A' <= b && b <= 'F':
		return rune(b - 'A' + 10)
	}
	return -1
}

func hex4(s []byte) rune {
	return hexVal(s[0])<<12 | hexVal(s[1])<<8 | hexVal(s[2])<<4 | hexVal(s[3])
}

// decodeString appends the decoded content of a string literal (escapes
// already validated) as encoding/json decodes it: a surrogate that is not
// half of a valid pair becomes U+FFFD.
func decodeString(dst, s []byte) []byte {
	for i := 0; i < len(s); {
		if s[i] != '\\' {
			j := i + 1
			for j < len(s) && s[j] != '\\' {
				j++
			}
			dst = append(dst, s[i:j]...)
			i = j
			continue
		}
		switch s[i+1] {
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r := hex4(s[i+2:])
			i += 6
			if utf16.IsSurrogate(r) {
				if i+6 <= len(s) && s[i] == '\\' && s[i+1] == 'u' {
					if dec := utf16.DecodeRune(r, hex4(s[i+2:])); dec != unicode.ReplacementChar {
						dst = utf8.AppendRune(dst, dec)
						i += 6
						continue
					}
				}
				r = unicode.ReplacementChar
			}
			dst = utf8.AppendRune(dst, r)
			continue
		default: // '"', '\\', '/'
			dst = append(dst, s[i+1])
		}
		i += 2
	}
	return dst
}

// encodeString appends s (valid UTF-8) as a string literal the way
// encoding/json's encoder with SetEscapeHTML(false) writes it.
func encodeString(dst, s []byte) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		b := s[i]
		if b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '"', '\\':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[b>>4], hex[b&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[r&0xf])
			start = i + size
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

func (c *canon) array(depth int) error {
	c.pos++ // [
	c.buf = append(c.buf, '[')
	c.ws()
	if c.pos < len(c.in) && c.in[c.pos] == ']' {
		c.pos++
		c.buf = append(c.buf, ']')
		return nil
	}
	for {
		c.ws()
		if err := c.value(depth); err != nil {
			return err
		}
		c.ws()
		if c.pos >= len(c.in) {
			return errNotJSON
		}
		switch c.in[c.pos] {
		case ',':
			c.pos++
			c.buf = append(c.buf, ',')
		case ']':
			c.pos++
			c.buf = append(c.buf, ']')
			return nil
		default:
			return errNotJSON
		}
	}
}

func (c *canon) object(depth int) error {
	// depth 1 is the body itself: FingerprintFields apply there only.
	top := depth == 1
	c.pos++ // {
	start := int32(len(c.buf))
	c.buf = append(c.buf, '{')
	c.ws()
	if c.pos < len(c.in) && c.in[c.pos] == '}' {
		c.pos++
		c.buf = append(c.buf, '}')
		return nil
	}
	base := len(c.stack)
	for {
		c.ws()
		if c.pos >= len(c.in) || c.in[c.pos] != '"' {
			return errNotJSON
		}
		lo := int32(len(c.buf))
		nlo, nhi, esc, err := c.str(true)
		if err != nil {
			return err
		}
		c.ws()
		if c.pos >= len(c.in) || c.in[c.pos] != ':' {
			return errNotJSON
		}
		c.pos++
		c.buf = append(c.buf, ':')
		c.ws()
		if err := c.value(depth); err != nil {
			return err
		}
		c.stack = push(c.stack, member{nlo: nlo, nhi: nhi, esc: esc, lo: lo, hi: int32(len(c.buf))})
		c.ws()
		if c.pos >= len(c.in) {
			return errNotJSON
		}
		if c.in[c.pos] == ',' {
			c.pos++
			c.buf = append(c.buf, ',')
			continue
		}
		if c.in[c.pos] == '}' {
			c.pos++
			c.buf = append(c.buf, '}')
			break
		}
		return errNotJSON
	}
	ms := c.stack[base:]
	if err := c.checkNames(ms); err != nil {
		return err
	}
	filter := top && c.fields != nil
	if filter || !c.inOrder(ms) {
		// Sort the kept members by name, comparing the first eight bytes
		// as one integer first (most names differ there), then copy them
		// to the arena in that order.
		c.keys = c.keys[:0]
		for i, m := range ms {
			if !filter || c.wanted(m) {
				c.keys = push(c.keys, sortKey{prefix: namePrefix(c.name(m)), i: int32(i)})
			}
		}
		slices.SortFunc(c.keys, func(a, b sortKey) int {
			if a.prefix != b.prefix {
				return cmp.Compare(a.prefix, b.prefix)
			}
			return bytes.Compare(c.name(ms[a.i]), c.name(ms[b.i]))
		})
		mlo := int32(len(c.arena))
		for _, k := range c.keys {
			c.arena = push(c.arena, ms[k.i])
		}
		c.recs = push(c.recs, objRec{start: start, end: int32(len(c.buf)), mlo: mlo, mhi: int32(len(c.arena))})
	}
	c.stack = c.stack[:base]
	return nil
}

func (c *canon) name(m member) []byte {
	if m.esc {
		return c.names[m.nlo:m.nhi]
	}
	return c.in[m.nlo:m.nhi]
}

// inOrder reports whether the members are sorted already (names are
// distinct by now).
func (c *canon) inOrder(ms []member) bool {
	for i := 1; i < len(ms); i++ {
		if bytes.Compare(c.name(ms[i-1]), c.name(ms[i])) > 0 {
			return false
		}
	}
	return true
}

// checkNames refuses an object with two names that fold alike (which
// includes two equal names): pairwise for a few members; for many, by
// sorting hashes of the folded names, and only if two hashes meet, by
// sorting the names on their folded form.
func (c *canon) checkNames(ms []member) error {
	if len(ms) < 2 {
		return nil
	}
	if len(ms) <= 8 {
		for i := range ms {
			for j := i + 1; j < len(ms); j++ {
				if compareFolded(c.name(ms[i]), c.name(ms[j])) == 0 {
					return ErrBodyAmbiguous
				}
			}
		}
		return nil
	}
	c.hashes = c.hashes[:0]
	for _, m := range ms {
		c.fold = appendFolded(c.fold[:0], c.name(m))
		c.hashes = push(c.hashes, maphash.Bytes(nameSeed, c.fold))
	}
	slices.Sort(c.hashes)
	collision := false
	for i := 1; i < len(c.hashes); i++ {
		if c.hashes[i-1] == c.hashes[i] {
			collision = true
			break
		}
	}
	if !collision {
		return nil
	}
	c.order = c.order[:0]
	for i := range ms {
		c.order = push(c.order, int32(i))
	}
	slices.SortFunc(c.order, func(a, b int32) int { return compareFolded(c.name(ms[a]), c.name(ms[b])) })
	for i := 1; i < len(c.order); i++ {
		if compareFolded(c.name(ms[c.order[i-1]]), c.name(ms[c.order[i]])) == 0 {
			return ErrBodyAmbiguous
		}
	}
	return nil
}

// nameSeed seeds the hashes of checkNames; any seed will do.
var nameSeed = maphash.MakeSeed()

// wanted reports whether FingerprintFields keeps m, by folded name, so that
// a member that encoding/json would decode into a listed field counts
// whatever the case of its name.
func (c *canon) wanted(m member) bool {
	c.fold = appendFolded(c.fold[:0], c.name(m))
	_, ok := c.fields[string(c.fold)]
	return ok
}

// push appends v, doubling the capacity when it runs out: append grows
// large slices by a quarter at a time, which costs five times the final
// size in copies; doubling costs two.
func push[T any](s []T, v T) []T {
	if len(s) == cap(s) {
		n := make([]T, len(s), max(16, 2*cap(s)))
		copy(n, s)
		s = n
	}
	return append(s, v)
}

// emit writes buf[lo:hi] to out, writing the members of recorded objects
// in their sorted order.
func (c *canon) emit(out []byte, lo, hi int32) []byte {
	pos := lo
	for ri := c.firstRec(lo); ri < len(c.recs) && c.recs[ri].start < hi; ri = c.firstRec(pos) {
		r := c.recs[ri]
		out = append(out, c.buf[pos:r.start]...)
		out = append(out, '{')
		for i, m := range c.arena[r.mlo:r.mhi] {
			if i > 0 {
				out = append(out, ',')
			}
			out = c.emit(out, m.lo, m.hi)
		}
		out = append(out, '}')
		pos = r.end
	}
	return append(out, c.buf[pos:hi]...)
}

// firstRec is the index of the first record starting at or after off.
func (c *canon) firstRec(off int32) int {
	i, _ := slices.BinarySearchFunc(c.recs, off, func(r objRec, off int32) int { return int(r.start - off) })
	return i
}

// foldRune maps r to the smallest rune of its Unicode simple-folding orbit
// (K, k and the Kelvin sign; S, s and ſ), as encoding/json does when it
// matches a member name to a struct field: two names fold alike exactly
// when strings.EqualFold says they are equal. The package's tests hold
// this to encoding/json and strings.EqualFold.
func foldRune(r rune) rune {
	if r < utf8.RuneSelf {
		if 'a' <= r && r <= 'z' {
			r -= 'a' - 'A'
		}
		return r
	}
	for {
		r2 := unicode.SimpleFold(r)
		if r2 <= r {
			return r2
		}
		r = r2
	}
}

// appendFolded appends the folded form of name (valid UTF-8).
func appendFolded(dst, name []byte) []byte {
	for i := 0; i < len(name); {
		if b := name[i]; b < utf8.RuneSelf {
			dst = append(dst, byte(foldRune(rune(b))))
			i++
			continue
		}
		r, size := utf8.DecodeRune(name[i:])
		dst = utf8.AppendRune(dst, foldRune(r))
		i += size
	}
	return dst
}

// compareFolded compares two names (valid UTF-8) by their folded forms
// without building them.
func compareFolded(a, b []byte) int {
	for len(a) > 0 && len(b) > 0 {
		ra, na := rune(a[0]), 1
		if ra >= utf8.RuneSelf {
			ra, na = utf8.DecodeRune(a)
		}
		rb, nb := rune(b[0]), 1
		if rb >= utf8.RuneSelf {
			rb, nb = utf8.DecodeRune(b)
		}
		if fa, fb := foldRune(ra), foldRune(rb); fa != fb {
			if fa < fb {
				return -1
			}
			return 1
		}
		a, b = a[na:], b[nb:]
	}
	return len(a) - len(b)
}

// foldedFields is the set of FingerprintFields by folded name.
func foldedFields(fields []string) map[string]struct{} {
	if len(fields) == 0 {
		return nil
	}
	m := make(map[string]struct{}, len(fields))
	for _, f := range fields {
		m[string(appendFolded(nil, []byte(f)))] = struct{}{}
	}
	return m
}
