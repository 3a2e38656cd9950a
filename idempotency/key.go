package idempotency

import (
	"errors"

	"github.com/idemkit/idem"
)

// keyFromValues reads the one Idempotency-Key header, given its values,
// with idem's key rule. Two header lines are invalid: they would make the
// key ambiguous.
func keyFromValues(vs []string) (string, error) {
	switch len(vs) {
	case 0:
		return "", ErrKeyRequired
	case 1:
		k, err := idem.ParseKey(vs[0])
		switch {
		case errors.Is(err, idem.ErrKeyRequired):
			return "", ErrKeyRequired
		case err != nil:
			return "", ErrKeyInvalid
		}
		return k, nil
	}
	return "", ErrKeyInvalid
}
