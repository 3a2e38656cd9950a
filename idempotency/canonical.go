package idempotency

import (
	"bytes"
	"encoding/json"
	"slices"
	"unicode/utf8"
)

// canonicalMaxDepth bounds nesting, as encoding/json does, so that a hostile
// body cannot exhaust the stack.
const canonicalMaxDepth = 10000

// canon is a one-pass JSON canonicaliser: it validates and re-emits the
// input with object members sorted by their decoded names and insignificant
// whitespace dropped, copying strings and numbers as they are whenever their
// text is already canonical. It replaces a decode into maps and a re-encode,
// which cost most of the middleware's own time per request.
type canon struct {
	in  []byte
	pos int
	out []byte
}

type member struct {
	name  string // decoded, for sorting
	key   []byte // canonical encoding of the name
	value []byte // canonical encoding of the value
}

// canonicalize appends the canonical form of in to out. With fields set and
// a top-level object, only those members are kept.
func canonicalize(out, in []byte, fields map[string]bool) ([]byte, error) {
	c := &canon{in: in, out: out}
	c.ws()
	if err := c.value(0, fields); err != nil {
		return nil, err
	}
	c.ws()
	if c.pos != len(c.in) {
		return nil, ErrNotJSON
	}
	return c.out, nil
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

func (c *canon) value(depth int, fields map[string]bool) error {
	if depth > canonicalMaxDepth || c.pos >= len(c.in) {
		return ErrNotJSON
	}
	switch b := c.in[c.pos]; {
	case b == '{':
		return c.object(depth, fields)
	case b == '[':
		return c.array(depth)
	case b == '"':
		return c.str()
	case b == 't':
		return c.lit("true")
	case b == 'f':
		return c.lit("false")
	case b == 'n':
		return c.lit("null")
	case b == '-' || (b >= '0' && b <= '9'):
		return c.number()
	}
	return ErrNotJSON
}

func (c *canon) lit(s string) error {
	if !bytes.HasPrefix(c.in[c.pos:], []byte(s)) {
		return ErrNotJSON
	}
	c.pos += len(s)
	c.out = append(c.out, s...)
	return nil
}

func (c *canon) number() error {
	start := c.pos
	in := c.in
	i := c.pos
	if i < len(in) && in[i] == '-' {
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
		return ErrNotJSON
	}
	if i < len(in) && in[i] == '.' {
		i++
		d := i
		for i < len(in) && in[i] >= '0' && in[i] <= '9' {
			i++
		}
		if i == d {
			return ErrNotJSON
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
			return ErrNotJSON
		}
	}
	c.pos = i
	c.out = append(c.out, in[start:i]...)
	return nil
}

// str copies a string literal. Text that encoding/json would emit unchanged
// (no escapes, no control characters, valid UTF-8 without U+2028/U+2029) is
// copied as is; anything else is decoded and re-encoded, so that "\u0061"
// and "a" canonicalise alike.
func (c *canon) str() error {
	raw, _, err := c.scanString()
	if err != nil {
		return err
	}
	c.out = append(c.out, raw...)
	return nil
}

// scanString reads a string literal at pos and returns its canonical
// encoding and its decoded value.
func (c *canon) scanString() (canonical []byte, decoded string, err error) {
	in := c.in
	start := c.pos
	i := c.pos + 1
	simple := true
	for {
		if i >= len(in) {
			return nil, "", ErrNotJSON
		}
		b := in[i]
		if b == '"' {
			break
		}
		if b < 0x20 {
			return nil, "", ErrNotJSON
		}
		if b == '\\' {
			simple = false
			i += 2
			continue
		}
		if b >= utf8.RuneSelf {
			r, size := utf8.DecodeRune(in[i:])
			if r == utf8.RuneError || r == '\u2028' || r == '\u2029' {
				simple = false
			}
			i += size
			continue
		}
		i++
	}
	lit := in[start : i+1]
	c.pos = i + 1
	if simple {
		return lit, string(lit[1 : len(lit)-1]), nil
	}
	var s string
	if err := json.Unmarshal(lit, &s); err != nil {
		return nil, "", ErrNotJSON
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		return nil, "", ErrNotJSON
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), s, nil
}

func (c *canon) array(depth int) error {
	c.pos++ // [
	c.out = append(c.out, '[')
	c.ws()
	if c.pos < len(c.in) && c.in[c.pos] == ']' {
		c.pos++
		c.out = append(c.out, ']')
		return nil
	}
	for {
		c.ws()
		if err := c.value(depth+1, nil); err != nil {
			return err
		}
		c.ws()
		if c.pos >= len(c.in) {
			return ErrNotJSON
		}
		switch c.in[c.pos] {
		case ',':
			c.pos++
			c.out = append(c.out, ',')
		case ']':
			c.pos++
			c.out = append(c.out, ']')
			return nil
		default:
			return ErrNotJSON
		}
	}
}

func (c *canon) object(depth int, fields map[string]bool) error {
	c.pos++ // {
	c.ws()
	var members []member
	if c.pos < len(c.in) && c.in[c.pos] == '}' {
		c.pos++
		c.out = append(c.out, '{', '}')
		return nil
	}
	for {
		c.ws()
		if c.pos >= len(c.in) || c.in[c.pos] != '"' {
			return ErrNotJSON
		}
		key, name, err := c.scanString()
		if err != nil {
			return err
		}
		c.ws()
		if c.pos >= len(c.in) || c.in[c.pos] != ':' {
			return ErrNotJSON
		}
		c.pos++
		c.ws()
		// Emit the value into out, then cut it off: it is placed after
		// sorting.
		mark := len(c.out)
		if err := c.value(depth+1, nil); err != nil {
			return err
		}
		val := slices.Clone(c.out[mark:])
		c.out = c.out[:mark]
		if fields == nil || fields[name] {
			members = append(members, member{name: name, key: key, value: val})
		}
		c.ws()
		if c.pos >= len(c.in) {
			return ErrNotJSON
		}
		if c.in[c.pos] == ',' {
			c.pos++
			continue
		}
		if c.in[c.pos] == '}' {
			c.pos++
			break
		}
		return ErrNotJSON
	}
	// Sort by decoded name; for a duplicate name the last one wins, as in
	// encoding/json.
	slices.SortStableFunc(members, func(a, b member) int {
		switch {
		case a.name < b.name:
			return -1
		case a.name > b.name:
			return 1
		}
		return 0
	})
	c.out = append(c.out, '{')
	n := 0
	for i, m := range members {
		if i+1 < len(members) && members[i+1].name == m.name {
			continue
		}
		if n > 0 {
			c.out = append(c.out, ',')
		}
		c.out = append(c.out, m.key...)
		c.out = append(c.out, ':')
		c.out = append(c.out, m.value...)
		n++
	}
	c.out = append(c.out, '}')
	return nil
}
