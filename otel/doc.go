// Package idemotel traces and measures idem's components with
// OpenTelemetry, through their hooks (idem.Hook): it adds no second path.
// It is a Go module of its own (github.com/idemkit/idem/otel), so that a
// user of idem's core does not download OpenTelemetry.
//
//	tel, err := idemotel.New(&idemotel.Config{TracerProvider: tp, MeterProvider: mp})
//	mw, _ := idempotency.New(store, &idempotency.Config{Scope: scope, Hook: tel.RequestHook()})
//	srv := tel.Handler(mux)                                   // extracts the caller's trace context
//	relay, _ := outbox.NewRelay(pool, pub, &outbox.RelayConfig{Hook: tel.RelayHook()})
//	cons, _ := kafka.NewConsumer(pool, handle, &kafka.ConsumerConfig{Hook: tel.ConsumerHook(), ...})
//	ic, _ := idemclient.New(&http.Client{Transport: tel.Transport(nil)}, &idemclient.Config{Hook: tel.ClientHook()})
//
// # One trace through the outbox
//
// A request's trace goes on across the outbox and the broker:
//
//  1. Handler extracts the caller's traceparent; RequestHook's span is its
//     child, and the ctx it returns carries OutboxPropagator;
//  2. outbox.EnqueueTx, called with that ctx (or a ctx derived from it),
//     writes the span context into the event's headers (traceparent,
//     tracestate) in the same transaction as the event;
//  3. the relay publishes the headers with the event (every idem
//     publisher copies them to the broker's headers); its batch span
//     (RelayHook) is a trace of its own linked to each event's trace,
//     since a batch carries events of many traces;
//  4. ConsumerHook's span for the record is the child of the context in
//     its headers, and its ctx carries OutboxPropagator again, so the
//     events the handler enqueues go on in the same trace;
//  5. an idemclient call made with the record's ctx gets a client span
//     per attempt (ClientHook), which the Transport injects into the
//     request; the server's Handler extracts it, and so on.
//
// # Guaranteed and not
//
// Spans and metrics never carry an Idempotency-Key, a principal or a
// payload: the hooks' events have none. Metric attributes come from fixed
// sets (kinds, outcomes, reasons, modes) or from values the code chooses
// (route patterns, topics, consumer ids), the latter capped at 100
// distinct values per attribute ("other" beyond). The trace context is
// best-effort: a header the table cannot store is dropped, never failing
// the transaction (outbox.InjectHeaders); a record without one starts a
// new trace. An idemclient attempt that could not be built (no request
// was sent) leaves its span unended, so it is not exported.
//
// The metric names and attributes are in docs/metrics.md, one table with
// the Prometheus collector's (module github.com/idemkit/idem/prom).
package idemotel
