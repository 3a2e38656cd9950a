package natsjs_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/natsjs"
	"github.com/idemkit/idem/outbox"
)

// TestResendDroppedAtTheBroker: the relay publishing an event again (its
// first publish's answer was lost, or another relay took the row over)
// stores nothing new: the stream's duplicate window drops the copy by its
// Nats-Msg-Id, and Publish reports it delivered.
func TestResendDroppedAtTheBroker(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	s.createTopic(t, "orders.events", 0)
	pub, err := natsjs.NewPublisher(s.js, &natsjs.PublisherConfig{Prefix: s.prefix})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e := func(seq int64) outbox.Event {
		return outbox.Event{Seq: seq, Message: outbox.Message{Topic: "orders.events", AggregateType: "order",
			AggregateID: "o/1 x", EventID: "ev-" + string(rune('0'+seq)), EventType: "E", Payload: []byte(`{}`)}}
	}
	if err := pub.Publish(ctx, []outbox.Event{e(1), e(2)}); err != nil {
		t.Fatal(err)
	}
	if err := pub.Publish(ctx, []outbox.Event{e(2), e(3)}); err != nil {
		t.Fatalf("re-send: %v", err)
	}
	msgs, err := s.readAll(ctx, "orders.events")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range msgs {
		got = append(got, m.Header.Get(natsjs.HeaderMsgID))
		if want := natsjs.Subject(natsjs.WithPrefix(s.prefix, "orders.events"), "order", "o/1 x"); m.Subject != want {
			t.Errorf("subject %q, want %q", m.Subject, want)
		}
		if id := s.aggregateID("orders.events", m.Subject); id != "o/1 x" {
			t.Errorf("aggregate id read back %q", id)
		}
	}
	if strings.Join(got, " ") != "ev-1 ev-2 ev-3" {
		t.Fatalf("stream holds %v, want ev-1 ev-2 ev-3 once each", got)
	}
}

func TestCheck(t *testing.T) {
	t.Parallel()
	s := newServer(t)
	pub, err := natsjs.NewPublisher(s.js, &natsjs.PublisherConfig{MaxMsgSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	ok := outbox.Event{Message: outbox.Message{Topic: "a.b", AggregateType: "t", AggregateID: "i", EventID: "e", Payload: []byte("x")}}
	if err := pub.Check(ok); err != nil {
		t.Fatalf("Check(ok): %v", err)
	}
	for _, topic := range []string{"", "a..b", "a.*", "a.>", "a b", ".a"} {
		bad := ok
		bad.Topic = topic
		if err := pub.Check(bad); !errors.Is(err, natsjs.ErrBadTopic) {
			t.Errorf("Check(topic %q) = %v, want ErrBadTopic", topic, err)
		}
	}
	big := ok
	big.Payload = make([]byte, 1000)
	if err := pub.Check(big); err == nil {
		t.Error("Check(a 1000-byte payload) with MaxMsgSize 1000: nil")
	}
}

// FuzzToken: every string becomes one subject token (no '.', '*', '>',
// whitespace, never empty) that decodes back to it, and two strings never
// share one.
func FuzzToken(f *testing.F) {
	for _, s := range []string{"", "o1", "~x", "a.b", "a b", "*", ">", "ü", "-_"} {
		f.Add(s, "o1")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		ta, tb := natsjs.Token(a), natsjs.Token(b)
		if ta == "" || strings.ContainsAny(ta, ".*> \t\r\n") {
			t.Fatalf("Token(%q) = %q: not a subject token", a, ta)
		}
		if back, err := natsjs.ParseToken(ta); err != nil || back != a {
			t.Fatalf("ParseToken(Token(%q)) = %q, %v", a, back, err)
		}
		if a != b && ta == tb {
			t.Fatalf("Token(%q) == Token(%q) == %q", a, b, ta)
		}
	})
}
