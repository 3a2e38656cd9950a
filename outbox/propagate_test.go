package outbox_test

import (
	"context"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
)

// fixedPropagator writes its headers, as a tracer's propagator writes the
// span context of the ctx it is given.
type fixedPropagator map[string]string

func (p fixedPropagator) Inject(_ context.Context, h map[string]string) { maps.Copy(h, p) }

// A message enqueued with a propagator in its ctx carries what the
// propagator wrote all the way to the publisher (and to the hook's
// EventInfo, with its CreatedAt); the caller's own header wins over the
// propagator's, the caller's map is not changed, and headers the table
// could not store are dropped instead of failing the transaction. A ctx
// without a propagator adds nothing.
func TestEnqueuePropagatesHeaders(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	prop := fixedPropagator{
		"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"tracestate":  "vendor=from-propagator",
		"bad\x00key":  "v",
		"invalid":     "\xff\xfe",
		"huge":        strings.Repeat("x", outbox.MaxPropagatedBytes+1),
	}
	own := map[string]string{"tracestate": "vendor=own"}
	ctx := outbox.ContextWithPropagator(context.Background(), prop)
	m1 := msg("a", 1)
	m1.Headers = own
	m2 := msg("b", 1)
	tx, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.EnqueueTx(ctx, tx, m1, m2); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if len(own) != 1 {
		t.Fatalf("the caller's headers were changed: %v", own)
	}
	// Enqueue (its own transaction) propagates too; a ctx without a
	// propagator adds nothing.
	if _, err := outbox.Enqueue(ctx, db.Pool, msg("c", 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := outbox.Enqueue(context.Background(), db.Pool, msg("d", 1)); err != nil {
		t.Fatal(err)
	}

	rec := newRecorder()
	h := &hookLog{}
	r := newRelay(t, db, rec, outbox.RelayConfig{DisableNotify: true, Hook: h.hook})
	before := time.Now()
	drain(t, r)
	got := map[string]map[string]string{}
	for _, e := range rec.snapshot() {
		got[e.EventID] = e.Headers
	}
	want := map[string]map[string]string{
		"a-1": {"traceparent": prop["traceparent"], "tracestate": "vendor=own"},
		"b-1": {"traceparent": prop["traceparent"], "tracestate": "vendor=from-propagator"},
		"c-1": {"traceparent": prop["traceparent"], "tracestate": "vendor=from-propagator"},
		"d-1": nil,
	}
	for id, w := range want {
		if !maps.Equal(got[id], w) {
			t.Errorf("%s: headers %v, want %v", id, got[id], w)
		}
	}
	pub := h.of(outbox.RelayPublished)
	if len(pub) == 0 {
		t.Fatal("no published event")
	}
	for _, e := range pub[0].Events {
		if e.CreatedAt.IsZero() || e.CreatedAt.After(before.Add(time.Minute)) {
			t.Fatalf("EventInfo.CreatedAt %v", e.CreatedAt)
		}
		if e.EventID == "b-1" && e.Headers["traceparent"] != prop["traceparent"] {
			t.Fatalf("EventInfo.Headers %v", e.Headers)
		}
	}
}

// InjectHeaders without a propagator, or with one that writes nothing,
// returns the caller's map itself: no allocation on the common path.
func TestInjectHeadersWithoutPropagator(t *testing.T) {
	t.Parallel()
	h := map[string]string{"k": "v"}
	if got := outbox.InjectHeaders(context.Background(), h); !maps.Equal(got, h) {
		t.Fatalf("got %v", got)
	}
	ctx := outbox.ContextWithPropagator(context.Background(), fixedPropagator{})
	got := outbox.InjectHeaders(ctx, h)
	got["probe"] = "x" // the same map: the write shows in h
	if h["probe"] != "x" {
		t.Fatal("InjectHeaders copied the map although the propagator added nothing")
	}
	if outbox.PropagatorFromContext(outbox.ContextWithPropagator(ctx, nil)) != nil {
		t.Fatal("ContextWithPropagator(ctx, nil) did not remove the propagator")
	}
}
