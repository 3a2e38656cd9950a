// Package idemtest checks, from the outside, whether an HTTP endpoint honours
// the Idempotency-Key header: the semantics of package idempotency, of the
// IETF draft "The Idempotency-Key HTTP Header Field" and of Stripe's API.
//
// Usage:
//
//	func TestIdempotency(t *testing.T) {
//		idemtest.Check(t, idemtest.Target{Handler: myHandler, Path: "/orders"})
//	}
//
// # What it checks
//
// It is a black box: it talks HTTP to a URL, or to an http.Handler that it
// serves on a loopback httptest server, and never imports the server's code.
// A team calls it from its own tests (Check reports each check as a
// subtest) or from the command line (`idem conformance`, which calls Run).
//
// # Checks
//
// Every check uses keys of its own (random), so checks never see each
// other's keys, and each returns pass, fail or skip with evidence: the
// status codes, problem codes, replay markers, Retry-After values and
// timings of the exchanges it made.
//
//   - baseline: a new key and Target.Body succeed (2xx), one execution.
//     If this fails every other check is skipped: nothing else can be
//     judged.
//   - missing-key: no key → 400 (or 428), no execution.
//   - invalid-key: a key of 256 characters, with a tab, a space, a 0x01 or
//     a DEL, with non-ASCII bytes, or empty → 400, no execution; the
//     255-character key (the longest legal one) succeeds.
//   - replay: the same key and body twice → the same status, the same
//     Content-Type, Content-Language and Location, and a byte-identical
//     body (a difference names the first differing byte), one execution;
//     whether the replay carries Idempotent-Replayed: true is reported.
//   - mismatch: the same key with a different body → 409 or 422, not a
//     replay and not an execution; the original request still replays.
//     The different bodies are Target.AltBody and then Body with each of
//     its JSON members changed in turn, members of nested objects
//     included (at most 32): a fingerprint that covers only some members
//     (the amount, the top level) replays one of them.
//   - concurrency: Target.Concurrency requests with one new key at once →
//     one execution (through Target.Count or Target.CountURL when given,
//     else identical successful responses); the rest answer in-progress or
//     replay.
//   - principals: the same key from a second principal (Target.PrincipalB)
//     runs on its own and never replays the first principal's answer.
//   - quoted-key: the key in the draft's sf-string form ("abc") is accepted
//     and names the same key as the bare form.
//   - retry-after: an in-progress answer (409) carries a valid Retry-After.
//   - server-error-released: after a 5xx (provoked with Target.FaultHeader)
//     a retry with the same key runs again instead of replaying the 5xx.
//   - expiry: after Target.TTL the key can be used again.
//   - routes: the same key sent to Target.AltURL (another route of the
//     service) is another operation: that route's own answer, neither a
//     replay nor an idempotency refusal, and the first route still replays
//     its answer. Keys are scoped by route.
//
// # What it does not prove
//
// A passing run is evidence, not a proof. Without a count read-back,
// "one execution" is inferred from identical responses, which a handler
// that ignores keys but answers a constant body would also give. The count
// must be global (it must see both principals' executions) and nothing
// else may write to it while a check runs. Concurrency checks race real
// requests; a fast endpoint may finish before the next request arrives, so
// the in-progress answer may never be observed (retry-after is then
// skipped, not passed): Target.Hold makes it deterministic. Keys with
// control characters other than tab, which net/http refuses to send, are
// written by hand over TCP for http:// targets only (not through
// Target.Client); most HTTP servers, Go's included, refuse them before the
// application sees them.
package idemtest
