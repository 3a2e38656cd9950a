package idempotency

// CanonicalJSON is the canonical form the fingerprint hashes (see canon),
// with every member kept and the default depth limit; ErrNotJSON is what it
// returns for a body that is not one JSON value in UTF-8. They are exported
// to this package's tests only.
func CanonicalJSON(b []byte) ([]byte, error) {
	return canonicalize(b, nil, MaxBodyDepthDefault)
}

var ErrNotJSON = errNotJSON

// FoldRune is foldRune, for the tests that hold it to encoding/json.
var FoldRune = foldRune
