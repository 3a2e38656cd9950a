package dbsqlc

// ClaimLockedSQL is the at-least-once claim's text, for the test that
// reads its query plan.
const ClaimLockedSQL = claimLocked

// EnqueueOneSQL and EnqueueSQL are the enqueue statements' texts, which
// EnqueueSQLTx runs with Exec (see outbox.enqueue).
const (
	EnqueueOneSQL = enqueueOne
	EnqueueSQL    = enqueue
)
