package idemclient_test

import (
	"strings"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemclient"
)

func TestKey(t *testing.T) {
	t.Parallel()
	if got := idemclient.Key("o-42", "charge", "r-7"); got != "o-42:charge:r-7" {
		t.Errorf("Key = %q, want the readable form o-42:charge:r-7", got)
	}
	hashed := []struct {
		name  string
		parts []string
	}{
		{"no parts", nil},
		{"empty part", []string{"o-1", ""}},
		{"colon inside a part", []string{"a:b", "c"}},
		{"space", []string{"order 1", "charge"}},
		{"non-ASCII", []string{"заказ", "charge"}},
		{"too long", []string{strings.Repeat("x", 200), strings.Repeat("y", 100)}},
		{"looks hashed", []string{"sha256~abc"}},
	}
	seen := map[string]string{}
	for _, tt := range hashed {
		k := idemclient.Key(tt.parts...)
		if !strings.HasPrefix(k, "sha256~") || len(k) != 71 {
			t.Errorf("%s: Key = %q, want the hashed form", tt.name, k)
		}
		if err := idem.ValidateKey(k); err != nil {
			t.Errorf("%s: %v", tt.name, err)
		}
		if k != idemclient.Key(tt.parts...) {
			t.Errorf("%s: not deterministic", tt.name)
		}
		if prev, dup := seen[k]; dup {
			t.Errorf("%s and %s collide", tt.name, prev)
		}
		seen[k] = tt.name
	}
	// Joining with ':' would make these equal; the hashed form keeps the
	// boundaries.
	if idemclient.Key("a:b", "c") == idemclient.Key("a", "b:c") {
		t.Error(`Key("a:b","c") == Key("a","b:c")`)
	}
	if idemclient.Key() == idemclient.Key("") {
		t.Error(`Key() == Key("")`)
	}
}

func TestValidateKey(t *testing.T) {
	t.Parallel()
	for _, good := range []string{"a", "o-1:charge:r-1", strings.Repeat("~", 255), "!\"#$%&'()*+,-./"} {
		if err := idem.ValidateKey(good); err != nil {
			t.Errorf("ValidateKey(%q) = %v", good, err)
		}
	}
	for _, bad := range []string{"", " ", "a b", strings.Repeat("x", 256), "é", "a\x7f", "a\n"} {
		if err := idem.ValidateKey(bad); err == nil {
			t.Errorf("ValidateKey(%q) = nil", bad)
		}
	}
}

func FuzzKey(f *testing.F) {
	f.Add("o-1", "charge")
	f.Add("a:b", "")
	f.Add(strings.Repeat("z", 300), "ключ")
	f.Fuzz(func(t *testing.T, a, b string) {
		k := idemclient.Key(a, b)
		if err := idem.ValidateKey(k); err != nil {
			t.Fatalf("Key(%q, %q) = %q: %v", a, b, k, err)
		}
		if k != idemclient.Key(a, b) {
			t.Fatal("not deterministic")
		}
		if a != b && k == idemclient.Key(b, a) {
			t.Fatalf("Key(%q,%q) == Key(%q,%q)", a, b, b, a)
		}
	})
}

func FuzzValidateKey(f *testing.F) {
	f.Add("o-1:charge:r-1")
	f.Add("")
	f.Fuzz(func(t *testing.T, k string) {
		err := idem.ValidateKey(k)
		ok := len(k) >= 1 && len(k) <= 255 && strings.IndexFunc(k, func(r rune) bool { return r < 0x21 || r > 0x7e }) < 0
		if (err == nil) != ok {
			t.Fatalf("ValidateKey(%q) = %v, want ok=%v", k, err, ok)
		}
	})
}
