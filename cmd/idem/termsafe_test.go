package main

import (
	"context"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/testdb"
	"github.com/idemkit/idem/outbox"
)

func TestTermSafe(t *testing.T) {
	t.Parallel()
	testCases := []struct {
		in, want  string
		keepLines bool
	}{
		{"plain text, ünïcode", "plain text, ünïcode", false},
		{"\x1b[2J\x1b]0;owned\x07", `\x1b[2J\x1b]0;owned\x07`, false},
		{"csi \u009b31m", `csi \x9b31m`, false},
		{"del \x7f", `del \x7f`, false},
		{"evil\u202etxt.exe", `evil\u202etxt.exe`, false},
		{"zero\u200bwidth", `zero\u200bwidth`, false},
		{"bad \xff byte", `bad \xff byte`, false},
		{"two\nlines\tand tab", `two\x0alines\x09and tab`, false},
		{"two\nlines\tand tab \x1b", "two\nlines\tand tab \\x1b", true},
	}
	for _, tt := range testCases {
		if got := termSafe(tt.in, tt.keepLines); got != tt.want {
			t.Errorf("termSafe(%q, %v) = %q, want %q", tt.in, tt.keepLines, got, tt.want)
		}
	}
	if got := oneLineText("a\n\nb \x1b[31m"+strings.Repeat("x", 50), 10); got != `a b \x1b[31m…` {
		t.Errorf("oneLineText = %q", got)
	}
}

// TestAdminOutputEscapesControlCharacters: an event whose stored fields
// carry terminal escape sequences (an event type, a header, an error, a
// JSON payload with a C1 control and a bidi override) is shown by `idem
// outbox list|show` with every such character escaped; before, the ESC
// bytes reached the operator's terminal as they were.
func TestAdminOutputEscapesControlCharacters(t *testing.T) {
	t.Parallel()
	db := testdb.New(t)
	ctx := context.Background()
	if _, err := outbox.Enqueue(ctx, db.Pool, outbox.Message{
		Topic: "orders.events", AggregateType: "order", AggregateID: "a\x1b[8m", EventID: "e-1",
		EventType: "Confirmed\x1b]0;pwned\x07", Headers: map[string]string{"x-note\x1b[2J": "v\u202e1"},
		Payload: []byte("{\"note\":\"\u009b2J\u202e\"}"),
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, `UPDATE outbox_event SET status = 'DEAD', last_error = E'broker said \\x1b[31mno' WHERE event_id = 'e-1'`); err != nil {
		t.Fatal(err)
	}
	env := []string{"DATABASE_URL=" + db.URL, "USER=tester"}
	for _, args := range [][]string{{"outbox", "list", "--status", "DEAD"}, {"outbox", "show", "e-1"}} {
		stdout, stderr, code := runIdem(t, env, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d: %s", args, code, stderr)
		}
		if i := strings.IndexFunc(stdout, func(r rune) bool { return r == 0x1b || r == 0x07 || r == 0x9b || r == 0x202e }); i >= 0 {
			t.Errorf("%v printed a raw control or format character at %d:\n%q", args, i, stdout)
		}
		if !strings.Contains(stdout, `Confirmed\x1b]0;pwned\x07`) {
			t.Errorf("%v: the event type is not shown escaped:\n%s", args, stdout)
		}
	}
	stdout, _, _ := runIdem(t, env, "outbox", "show", "e-1")
	for _, want := range []string{`x-note\x1b[2J: v\u202e1`, `broker said \x1b[31mno`, `\x9b2J\u202e`} {
		if !strings.Contains(stdout, want) {
			t.Errorf("show lacks %q:\n%s", want, stdout)
		}
	}
}
