package inbox_test

import (
	"net/url"
	"os"
)

// exampleDatabaseURL is the database the examples use: TEST_DATABASE_URL,
// else the local server. A program uses its own DATABASE_URL.
func exampleDatabaseURL() string {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return u
	}
	return "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
}

// withSearchPath returns rawURL with its search_path set to schema, so that
// an example works in a schema of its own and drops it after.
func withSearchPath(rawURL, schema string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", err
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String(), nil
}
