package wal

import (
	"bytes"
	"errors"
	"maps"
	"testing"

	"github.com/idemkit/idem/outbox"
)

func TestEncodingRoundTrip(t *testing.T) {
	t.Parallel()
	testCases := []outbox.Message{
		{Topic: "t", AggregateType: "order", AggregateID: "42", EventID: "id", EventType: "E"},
		{Topic: "t", AggregateType: "order", AggregateID: "42", EventID: "id", EventType: "E", Payload: []byte{0, 1, 2, 0xff},
			Headers: map[string]string{"traceparent": "00-x", "b": "", "a": "ü"}},
	}
	for _, tt := range testCases {
		got, err := decode(encode(&tt))
		if err != nil {
			t.Fatal(err)
		}
		want := tt
		if want.Payload == nil {
			want.Payload = []byte{}
		}
		if got.Topic != want.Topic || got.AggregateType != want.AggregateType || got.AggregateID != want.AggregateID ||
			got.EventID != want.EventID || got.EventType != want.EventType || !bytes.Equal(got.Payload, want.Payload) ||
			!maps.Equal(got.Headers, want.Headers) {
			t.Fatalf("decode(encode(%+v)) = %+v", want, got)
		}
	}
	// The version byte is checked: a newer writer's message is refused.
	b := encode(&testCases[0])
	b[0] = EncodingVersion + 1
	if _, err := decode(b); !errors.Is(err, ErrBadMessage) {
		t.Fatalf("version %d: %v, want ErrBadMessage", b[0], err)
	}
	for _, bad := range [][]byte{nil, {EncodingVersion}, {EncodingVersion, 200}, {EncodingVersion, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f}} {
		if _, err := decode(bad); !errors.Is(err, ErrBadMessage) {
			t.Errorf("decode(%x): %v, want ErrBadMessage", bad, err)
		}
	}
}

// FuzzDecode: decode never panics, and what it accepts survives an
// encode and decode unchanged.
func FuzzDecode(f *testing.F) {
	f.Add(encode(&outbox.Message{Topic: "t", AggregateType: "a", AggregateID: "1", EventID: "e", EventType: "E",
		Headers: map[string]string{"k": "v"}, Payload: []byte("x")}))
	f.Add([]byte{EncodingVersion})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decode(b)
		if err != nil {
			return
		}
		m2, err := decode(encode(&m))
		if err != nil || m2.Topic != m.Topic || m2.AggregateType != m.AggregateType || m2.AggregateID != m.AggregateID ||
			m2.EventID != m.EventID || m2.EventType != m.EventType || !bytes.Equal(m2.Payload, m.Payload) || !maps.Equal(m2.Headers, m.Headers) {
			t.Fatalf("%x: decoded %+v, re-decoded %+v (%v)", b, m, m2, err)
		}
	})
}
