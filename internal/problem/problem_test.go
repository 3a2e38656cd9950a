package problem_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"

	"go.uber.org/goleak"

	"github.com/idemkit/idem/internal/problem"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestClip(t *testing.T) {
	t.Parallel()
	testCases := []struct {
		s    string
		n    int
		want string
	}{
		{"abc", 3, "abc"},
		{"abcdef", 5, "ab…"},
		{"abcdef", 3, "…"},
		{"abcdef", 2, "ab"},
		{"abcdef", 0, ""},
		{"abcdef", -1, ""},
		{"ééé", 5, "é…"},                // é is 2 bytes, the mark 3
		{"ééé", 4, "…"},                 // a 1-byte prefix would cut é in half
		{"ééé", 6, "ééé"},               // fits whole
		{"éééé", 6, "é…"},               // a 3-byte prefix would cut é in half
		{"a€€", 5, "a…"},                // € is 3 bytes
		{"\xff\xfe\xfdabc", 4, "\xff…"}, // invalid UTF-8 bytes each start a "rune"
		{"€€", 2, ""},                   // no room for the mark, no whole character
	}
	for _, tt := range testCases {
		got := problem.Clip(tt.s, tt.n)
		if got != tt.want || len(got) > max(tt.n, 0) {
			t.Errorf("Clip(%q, %d) = %q, want %q", tt.s, tt.n, got, tt.want)
		}
	}
}

// TestWriteBoundsTheDetail: whatever the detail, the answer's detail is
// valid UTF-8 of at most MaxDetail bytes, and the answer is a problem
// marked no-store.
func TestWriteBoundsTheDetail(t *testing.T) {
	t.Parallel()
	for _, detail := range []string{
		"",
		"short",
		strings.Repeat("x", 100_000),
		strings.Repeat("é", 1000),
		"no such resource: /" + strings.Repeat("\xff", 500),
		"a\x00b" + strings.Repeat("€", 100),
	} {
		w := httptest.NewRecorder()
		problem.Write(w, http.StatusNotFound, "NOT_FOUND", detail)
		var p problem.Details
		if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
			t.Fatal(err)
		}
		if w.Code != 404 || w.Header().Get("Content-Type") != problem.ContentType || w.Header().Get("Cache-Control") != "no-store" ||
			p.Status != 404 || p.Code != "NOT_FOUND" || p.Title != "Not Found" ||
			p.Type != "https://github.com/idemkit/idem/blob/main/docs/problems.md#not-found" {
			t.Fatalf("%d %v %+v", w.Code, w.Header(), p)
		}
		if len(p.Detail) > problem.MaxDetail || !utf8.ValidString(p.Detail) {
			t.Errorf("detail of %d bytes (valid UTF-8: %v): %.60q", len(p.Detail), utf8.ValidString(p.Detail), p.Detail)
		}
		if len(detail) <= problem.MaxDetail && utf8.ValidString(detail) && p.Detail != detail {
			t.Errorf("a short detail changed: %q → %q", detail, p.Detail)
		}
		if len(strings.ToValidUTF8(detail, "\uFFFD")) > problem.MaxDetail && !strings.HasSuffix(p.Detail, "…") {
			t.Errorf("a clipped detail does not say so: %q", p.Detail)
		}
	}
}
