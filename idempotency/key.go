package idempotency

import (
	"errors"
	"net/http"

	"github.com/idemkit/idem"
)

// keyFromRequest reads the one Idempotency-Key header of r with idem's key
// rule. Two header lines are invalid: they would make the key ambiguous.
func keyFromRequest(r *http.Request) (string, error) {
	vs := r.Header.Values(idem.HeaderKey)
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
