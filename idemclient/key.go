package idemclient

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strings"

	"github.com/idemkit/idem"
)

// hashedKeyPrefix starts every hashed key. '~' is outside the readable
// alphabet of Key, so a hashed key can never equal a readable one.
const hashedKeyPrefix = "sha256~"

// Key derives a deterministic Idempotency-Key from the command's own data:
// what the command is about, what it does, and the request that asked for
// it:
//
//	idemclient.Key(order.ID, "charge", cmd.RequestID) // "o-42:charge:r-7"
//
// The same parts always give the same key, so the key survives a retry in
// the process and a retry after a restart; never build a key from
// uuid.New() or time.Now() at call time, or every attempt becomes a new
// operation for the server.
//
// The readable form, parts joined with ':', is used when every part is
// non-empty and made only of ASCII letters, digits, '.', '_' and '-', and
// the result fits in idem.MaxKeyLength. Otherwise the key is "sha256~"
// followed by the hex SHA-256 of the length-prefixed parts: still
// deterministic, 71 visible ASCII characters, and distinct parts never
// collide (("a:b","c") and ("a","b:c") give different keys). The result
// always passes idem.ValidateKey.
func Key(parts ...string) string {
	if readable(parts) {
		if k := strings.Join(parts, ":"); len(k) <= idem.MaxKeyLength {
			return k
		}
	}
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	for _, p := range parts {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(p)))])
		h.Write([]byte(p))
	}
	return hashedKeyPrefix + hex.EncodeToString(h.Sum(nil))
}

func readable(parts []string) bool {
	if len(parts) == 0 {
		return false
	}
	for _, p := range parts {
		if p == "" {
			return false
		}
		for i := 0; i < len(p); i++ {
			c := p[i]
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
				return false
			}
		}
	}
	return true
}
