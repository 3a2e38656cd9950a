package idem_test

import (
	"errors"
	"fmt"

	"github.com/idemkit/idem"
)

// ExampleParseKey reads an Idempotency-Key header value the way every idem
// package does: a bare token or a structured-field string; an empty value
// and a value that breaks the rule are told apart by their sentinels.
func ExampleParseKey() {
	for _, v := range []string{`order-42:confirm`, `"order-42:confirm"`, ``, "bad\x7fkey"} {
		key, err := idem.ParseKey(v)
		switch {
		case errors.Is(err, idem.ErrKeyRequired):
			fmt.Println(idem.CodeKeyRequired)
		case errors.Is(err, idem.ErrKeyInvalid):
			fmt.Println(idem.CodeKeyInvalid)
		default:
			fmt.Println("key", key)
		}
	}
	// Output:
	// key order-42:confirm
	// key order-42:confirm
	// IDEMPOTENCY_KEY_REQUIRED
	// IDEMPOTENCY_KEY_INVALID
}
