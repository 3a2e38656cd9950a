package dbsqlc

// ClaimLockedSQL is the at-least-once claim's text, for the test that
// reads its query plan.
const ClaimLockedSQL = claimLocked
