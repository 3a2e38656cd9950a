package idempotency

import "time"

// EventKind names an Event.
type EventKind string

// Event kinds. Every guarded request gets EventBegin first, then, after
// any of the kinds marked "goes on", exactly one of the others: a tracer
// starts its span at EventBegin and ends it there.
const (
	// EventBegin: a guarded request arrived. The context Config.Hook
	// returns for it becomes the request's: the handler's, and that of
	// every later event of the request.
	EventBegin EventKind = "begin"
	// EventClaim: the key was claimed; the handler runs (goes on).
	EventClaim EventKind = "claim"
	// EventTakeover: an expired lease was taken over; the handler runs
	// (goes on).
	EventTakeover EventKind = "takeover"
	// EventLeaseLost: the heartbeat could not renew the claim's lease in
	// time, or found it taken over; the handler's context was ended with
	// ErrLeaseLost (goes on: the handler still returns).
	EventLeaseLost EventKind = "lease_lost"
	// EventReplay: a stored response was replayed.
	EventReplay EventKind = "replay"
	// EventConflict: 409 in progress.
	EventConflict EventKind = "conflict"
	// EventMismatch: the key was reused with a different request.
	EventMismatch EventKind = "mismatch"
	// EventComplete: the response was stored.
	EventComplete EventKind = "complete"
	// EventRelease: the key was released (5xx, 408, 429, panic, client
	// gone).
	EventRelease EventKind = "release"
	// EventFenced: the completion was rejected because a newer owner holds
	// the key; the client got 409 in progress, not the handler's response.
	EventFenced EventKind = "fenced"
	// EventStoreError: the store failed: 503, or a lost completion.
	EventStoreError EventKind = "store_error"
	// EventRejected: a bad request: no key, a bad key, a body too large,
	// too deep or ambiguous, no principal.
	EventRejected EventKind = "rejected"
	// EventPurge: one purge round (the loop's, or a Purge call) ended;
	// Purged says how many records it deleted, Err why it stopped early.
	// It belongs to no request.
	EventPurge EventKind = "purge"
)

// Event is what Config.Hook receives. It never carries the key, the
// principal or a body.
type Event struct {
	Kind   EventKind
	Method string
	Route  string
	Mode   Mode
	// Status is the response status sent (or stored) when known.
	Status int
	// Fence is the claim's fencing token, when there is one.
	Fence int64
	// Elapsed is the time since the request's EventBegin, or, for
	// EventPurge, the round's duration.
	Elapsed time.Duration
	// Purged is how many records an EventPurge round deleted.
	Purged int
	// Err is the failure behind EventStoreError, EventFenced,
	// EventLeaseLost, EventRejected and a failed EventPurge.
	Err error
}
