// Package idem is the wire contract that idem's packages share: the header
// names of the Idempotency-Key protocol, the rule a key must follow, the
// problem codes of refused requests, and the one hook shape of every
// component. It is a leaf: it imports only the standard library, so a
// client, a server and a conformance test agree by construction instead of
// by comment.
//
// Usage:
//
//	key, err := idem.ParseKey(r.Header.Get(idem.HeaderKey)) // the key rule
//	if err != nil {
//		// answer 400 with code idem.CodeKeyInvalid
//	}
//	w.Header().Set(idem.HeaderReplayed, "true") // on a replayed response
//
// # The contract
//
// The capabilities live in their own packages: idempotency (incoming
// requests), idemclient (outgoing calls), outbox and inbox (events),
// kafka (franz-go adapters), lifecycle (graceful shutdown), migrate
// (tables). docs/conventions.md in the repository is the short list of
// rules they all follow.
//
// # The key rule
//
// A key is 1 to MaxKeyLength characters of visible ASCII (%x21-7E). On the
// wire it is either that bare token or, as the IETF draft
// (draft-ietf-httpapi-idempotency-key-header) writes it, a structured-field
// string: the same characters between double quotes, with \" and \\
// escapes. ParseKey accepts both; ValidateKey checks a key before it is
// sent, and a client sends it bare.
//
// # Hooks
//
// Every long-running or per-request component takes a hook of one shape,
// func(ctx context.Context, e E) context.Context, where E is the package's
// event type with a typed Kind. The hook is called synchronously on the
// component's goroutine, so it must be fast and must not block. ctx is the
// context of the unit of work the event is about (a request, a batch, a
// record, an attempt). For a kind that begins a unit of work (the
// package's …Begin kinds), the ctx the hook returns becomes the context of
// that work and of the events that follow for it, so a tracer can start a
// span there and end it at the matching end event; for every other kind the
// returned ctx is ignored. A hook that only observes returns its ctx.
// Events never carry secrets: no raw Idempotency-Key, no principal, no
// payload.
package idem
