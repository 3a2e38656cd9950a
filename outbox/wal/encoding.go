package wal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/idemkit/idem/outbox"
)

// EncodingVersion is the version byte that starts every message this
// package writes. A relay refuses a message of its prefix with another
// version (ErrBadMessage): it is a newer writer's, and skipping it would
// lose an event.
const EncodingVersion = 1

// The encoding, version 1, of one event as the content of a logical
// decoding message:
//
//	byte     version (1)
//	string   event id
//	string   event type
//	string   topic
//	string   aggregate type
//	string   aggregate id
//	uvarint  number of headers, then for each (sorted by key):
//	string   key
//	string   value
//	bytes    payload: the rest of the message
//
// where a string is a uvarint byte length followed by that many bytes
// (UTF-8), and uvarint is encoding/binary's. The prefix of the message
// (Config.Prefix, PrefixDefault) is not part of the content: PostgreSQL
// carries it beside it, and a relay reads only its own prefix.

// ErrBadMessage is reported when a message of the relay's prefix cannot be
// decoded (another version, truncated). The relay does not skip it: its
// stream stops there and retries, and the slot's lag grows until the
// writer and the relay agree again.
var ErrBadMessage = errors.New("outbox/wal: undecodable message")

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// encode returns m's content. m must have been checked.
func encode(m *outbox.Message) []byte {
	n := 1 + 5*binary.MaxVarintLen32 + len(m.EventID) + len(m.EventType) + len(m.Topic) +
		len(m.AggregateType) + len(m.AggregateID) + binary.MaxVarintLen32 + len(m.Payload)
	for k, v := range m.Headers {
		n += 2*binary.MaxVarintLen32 + len(k) + len(v)
	}
	b := make([]byte, 0, n)
	b = append(b, EncodingVersion)
	b = appendString(b, m.EventID)
	b = appendString(b, m.EventType)
	b = appendString(b, m.Topic)
	b = appendString(b, m.AggregateType)
	b = appendString(b, m.AggregateID)
	b = binary.AppendUvarint(b, uint64(len(m.Headers)))
	for _, k := range slices.Sorted(maps.Keys(m.Headers)) {
		b = appendString(b, k)
		b = appendString(b, m.Headers[k])
	}
	return append(b, m.Payload...)
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint(what string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = fmt.Errorf("%w: %s: bad length", ErrBadMessage, what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) string(what string) string {
	n := d.uvarint(what)
	if d.err != nil {
		return ""
	}
	if n > uint64(len(d.b)) {
		d.err = fmt.Errorf("%w: %s: %d bytes, %d left", ErrBadMessage, what, n, len(d.b))
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

// DecodeMessage parses the content of a logical decoding message that
// EnqueueTx wrote (see the encoding above), for a tool that reads a slot
// of its own (an audit, a replay): ErrBadMessage when it is not one.
func DecodeMessage(content []byte) (outbox.Message, error) {
	return decode(bytes.Clone(content))
}

// decode parses a message's content (see the encoding above).
func decode(content []byte) (outbox.Message, error) {
	var m outbox.Message
	if len(content) == 0 {
		return m, fmt.Errorf("%w: empty", ErrBadMessage)
	}
	if content[0] != EncodingVersion {
		return m, fmt.Errorf("%w: version %d, this relay reads %d", ErrBadMessage, content[0], EncodingVersion)
	}
	d := decoder{b: content[1:]}
	m.EventID = d.string("event id")
	m.EventType = d.string("event type")
	m.Topic = d.string("topic")
	m.AggregateType = d.string("aggregate type")
	m.AggregateID = d.string("aggregate id")
	nh := d.uvarint("header count")
	if d.err == nil && nh > uint64(len(d.b)) {
		d.err = fmt.Errorf("%w: %d headers in %d bytes", ErrBadMessage, nh, len(d.b))
	}
	if d.err == nil && nh > 0 {
		m.Headers = make(map[string]string, nh)
		for range nh {
			k := d.string("header key")
			m.Headers[k] = d.string("header value")
		}
	}
	if d.err != nil {
		return outbox.Message{}, d.err
	}
	m.Payload = d.b
	if m.Payload == nil {
		m.Payload = []byte{}
	}
	return m, nil
}
