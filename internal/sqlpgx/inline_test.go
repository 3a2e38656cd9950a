package sqlpgx_test

import (
	"bytes"
	"encoding/hex"
	"reflect"
	"strings"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq"

	"github.com/idemkit/idem/internal/sqlpgx"
	"github.com/idemkit/idem/internal/testdb"
)

func TestInlineScanner(t *testing.T) {
	t.Parallel()
	a := `(convert_from(decode('61','hex'),'UTF8'))`
	testCases := []struct {
		name, query string
		args        []any
		want        string // "" for ok false
	}{
		{"placeholders", "SELECT $1::text, $2, $1", []any{"a", []byte{0xff}}, "SELECT " + a + "::text, (decode('ff','hex')), " + a},
		{"in a string", "SELECT '$1', $1", []any{"a"}, "SELECT '$1', " + a},
		{"doubled quote", "SELECT 'it''s $1', $1", []any{"a"}, "SELECT 'it''s $1', " + a},
		{"in an identifier", `SELECT 1 AS "$1", $1`, []any{"a"}, `SELECT 1 AS "$1", ` + a},
		{"in comments", "-- $1\nSELECT /* $1 */ $1", []any{"a"}, "-- $1\nSELECT /* $1 */ " + a},
		{"part of an identifier", "SELECT x$1, $1", []any{"a"}, "SELECT x$1, " + a},
		{"arrays", "SELECT $1::text[], $2::bytea[]", []any{[]string{"a"}, [][]byte{{1}, nil}},
			"SELECT (ARRAY[" + a + "]::text[])::text[], (ARRAY[(decode('01','hex')),(decode('','hex'))]::bytea[])::bytea[]"},
		{"empty arrays", "SELECT $1, $2", []any{[]string{}, [][]byte{}}, "SELECT (ARRAY[]::text[]), (ARRAY[]::bytea[])"},
		{"nil bytes", "SELECT $1", []any{[]byte(nil)}, "SELECT (NULL)"},
		{"dollar quote", "SELECT $$x$$, $1", []any{"a"}, ""},
		{"tagged dollar quote", "SELECT $q$x$q$, $1", []any{"a"}, ""},
		{"escape string", "SELECT E'\\n', $1", []any{"a"}, ""},
		{"escape string lower", "SELECT e'x', $1", []any{"a"}, ""},
		{"unicode string", "SELECT U&'x', $1", []any{"a"}, ""},
		{"nested comment", "SELECT /* /* */ */ $1", []any{"a"}, ""},
		{"open string", "SELECT 'x, $1", []any{"a"}, ""},
		{"open comment", "SELECT /* $1", []any{"a"}, ""},
		{"beyond the arguments", "SELECT $2", []any{"a"}, ""},
		{"placeholder zero", "SELECT $0", []any{"a"}, ""},
		{"unknown argument", "SELECT $1", []any{int64(1)}, ""},
		{"nil argument", "SELECT $1", []any{nil}, ""},
	}
	for _, tt := range testCases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, ok := sqlpgx.Inline(tt.query, tt.args)
			if ok != (tt.want != "") || ok && got != tt.want {
				t.Fatalf("Inline(%q) = %q, %v; want %q", tt.query, got, ok, tt.want)
			}
			if !ok && got != tt.query {
				t.Fatalf("refused, but the query changed: %q", got)
			}
		})
	}
}

// FuzzInline: whatever the values, what reaches the SQL text is the
// template with hex literals, and each decodes back to its value.
func FuzzInline(f *testing.F) {
	f.Add("'); DROP TABLE t; --", []byte("$$\\'"))
	f.Add("", []byte{})
	f.Fuzz(func(t *testing.T, s string, b []byte) {
		got, ok := sqlpgx.Inline("SELECT $1::text, $2::bytea", []any{s, b})
		if !ok {
			t.Fatal("refused")
		}
		rest, found := strings.CutPrefix(got, "SELECT (convert_from(decode('")
		if !found {
			t.Fatalf("%q", got)
		}
		hs, rest, _ := strings.Cut(rest, "'")
		if rest, found = strings.CutPrefix(rest, ",'hex'),'UTF8'))::text, "); !found {
			t.Fatalf("%q", got)
		}
		var hb string
		if b == nil {
			if rest != "(NULL)::bytea" {
				t.Fatalf("%q", got)
			}
		} else {
			if rest, found = strings.CutPrefix(rest, "(decode('"); !found {
				t.Fatalf("%q", got)
			}
			hb, rest, _ = strings.Cut(rest, "'")
			if rest != ",'hex'))::bytea" {
				t.Fatalf("%q", got)
			}
		}
		ds, err1 := hex.DecodeString(hs)
		db, err2 := hex.DecodeString(hb)
		if err1 != nil || err2 != nil || string(ds) != s || b != nil && !bytes.Equal(db, b) {
			t.Fatalf("%q does not carry %q, %q", got, s, b)
		}
	})
}

// TestInlineSameValues: on both drivers, a statement with its values
// inlined returns what the same statement with parameters returns, for
// values made to break out of a literal.
func TestInlineSameValues(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, testdb.MaxConns(1), testdb.Empty())
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	nasty := `'); DROP TABLE x; -- $$ $1 $t$ \' \\ " E'\x41' /* ` + "\t\r\n ünï 🙂 \u2028\U0010fffd"
	args := []any{nasty, all, []string{nasty, "", `"`, `\`}, [][]byte{all, {}, nil}, "", []byte{}, []byte(nil)}
	const query = `SELECT $1::text, $2::bytea, $3::text[]::text, $4::bytea[]::text, $5::text, $6::bytea, '$1' || $5, $7::bytea IS NULL`
	for _, driver := range testdb.SQLDrivers {
		t.Run(driver, func(t *testing.T) {
			sdb := db.SQL(t, driver, 1)
			scan := func(d sqlpgx.DB) []any {
				var (
					s1, a3, a4, s5, lit string
					b2, b6              []byte
					null7               bool
				)
				if err := d.QueryRow(t.Context(), query, args...).Scan(&s1, &b2, &a3, &a4, &s5, &b6, &lit, &null7); err != nil {
					t.Fatalf("inline %v: %v", d.Inline, err)
				}
				return []any{s1, b2, a3, a4, s5, b6, lit, null7}
			}
			inl, par := scan(sqlpgx.DB{Q: sdb, Inline: true}), scan(sqlpgx.DB{Q: sdb})
			if !reflect.DeepEqual(inl, par) {
				t.Fatalf("inlined %q\nparameters %q", inl, par)
			}
			if inl[0] != nasty || !bytes.Equal(inl[1].([]byte), all) || inl[6] != "$1" || inl[7] != true {
				t.Fatalf("values changed: %q", inl)
			}
		})
	}
}
