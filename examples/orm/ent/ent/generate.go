package ent

// The generator runs at the version of entgo.io/ent in go.mod (a test
// checks): `go generate ./ent` in examples/orm/ent. The template adds
// (*Tx).SQLTx, the *sql.Tx under a transaction of Client.Tx.
//go:generate go run entgo.io/ent/cmd/ent@v0.14.5 generate --template ./template ./schema
