package dbsqlc

// The statements that PostgresStore pipelines in a pgx.Batch together with
// BEGIN or COMMIT (a batch takes SQL text, not a generated method), with
// their arguments in the order of the generated methods. Not generated:
// sqlc leaves this file alone; the tests run every statement.
const (
	TxLockSQL     = txLock
	TxReadSQL     = txRead
	TxCompleteSQL = txComplete
)

// TxReadArgs are the arguments of TxReadSQL.
func TxReadArgs(arg TxReadParams) []any { return []any{arg.Fingerprint, arg.KeyHash} }

// TxCompleteArgs are the arguments of TxCompleteSQL.
func TxCompleteArgs(arg TxCompleteParams) []any {
	return []any{arg.KeyHash, arg.Fingerprint, arg.Status, arg.Headers, arg.Body, arg.RetentionS}
}
