package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// tree writes a small repository: the core and kafkago, in the scheme.
func tree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	base := map[string]string{
		"go.mod":         "module github.com/idemkit/idem\n\ngo 1.26.0\n",
		"kafkago/go.mod": "module github.com/idemkit/idem/kafkago\n\ngo 1.26.0\n\nrequire github.com/idemkit/idem v0.1.0\n",
		"go.work":        "go 1.26.0\n\nuse (\n\t.\n\t./kafkago\n)\n\nreplace github.com/idemkit/idem v0.1.0 => ./\n\nreplace github.com/idemkit/idem/kafkago v0.1.0 => ./kafkago\n",
		"Makefile":       "MODULES := . kafkago\n",
	}
	for k, v := range files {
		base[k] = v
	}
	for name, body := range base {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func checkErr(t *testing.T, root string) error {
	t.Helper()
	r, err := load(root)
	if err != nil {
		t.Fatal(err)
	}
	return r.check()
}

func TestCheck(t *testing.T) {
	t.Parallel()
	testCases := []struct {
		name  string
		files map[string]string
		want  string // "" for a pass
	}{
		{name: "the scheme"},
		{
			name:  "a published go.mod gains a replace",
			files: map[string]string{"kafkago/go.mod": "module github.com/idemkit/idem/kafkago\n\ngo 1.26.0\n\nrequire github.com/idemkit/idem v0.1.0\n\nreplace github.com/idemkit/idem => ../\n"},
			want:  "replace github.com/idemkit/idem => ../",
		},
		{
			name:  "the v0.0.0 placeholder",
			files: map[string]string{"kafkago/go.mod": "module github.com/idemkit/idem/kafkago\n\ngo 1.26.0\n\nrequire github.com/idemkit/idem v0.0.0\n"},
			want:  "not a release version",
		},
		{
			name:  "a module missing from go.work and MODULES",
			files: map[string]string{"natsjs/go.mod": "module github.com/idemkit/idem/natsjs\n\ngo 1.26.0\n\nrequire github.com/idemkit/idem v0.1.0\n"},
			want:  "natsjs: not in go.work's use list",
		},
		{
			name: "an unpublished module may keep its replace",
			files: map[string]string{
				"bench/go.mod": "// idem:unpublished\nmodule github.com/idemkit/idem/bench\n\ngo 1.26.0\n\nrequire github.com/idemkit/idem v0.0.0\n\nreplace github.com/idemkit/idem => ../\n",
				"go.work":      "go 1.26.0\n\nuse (\n\t.\n\t./bench\n\t./kafkago\n)\n\nreplace github.com/idemkit/idem v0.1.0 => ./\n\nreplace github.com/idemkit/idem/kafkago v0.1.0 => ./kafkago\n",
				"Makefile":     "MODULES := . bench kafkago\n",
			},
		},
		{
			name:  "a module whose path is not its directory",
			files: map[string]string{"kafkago/go.mod": "module example.com/kafkago\n\ngo 1.26.0\n"},
			want:  "a module's path is its directory",
		},
	}
	for _, tt := range testCases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			root := tree(t, tt.files)
			r, err := load(root)
			if err == nil {
				err = r.check()
			}
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("check: %v, want a pass", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("check: %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

// TestConvert: a module in the old pattern (v0.0.0 plus replace, absent
// from go.work) is brought to the scheme, and check then passes.
func TestConvert(t *testing.T) {
	t.Parallel()
	root := tree(t, map[string]string{
		"gin/go.mod": "module github.com/idemkit/idem/gin\n\ngo 1.26.0\n\nrequire github.com/idemkit/idem v0.0.0\n\nreplace github.com/idemkit/idem => ../\n",
		"gin/go.sum": "github.com/idemkit/idem v0.1.0 h1:x=\ngithub.com/x/y v1.0.0 h1:y=\n",
		"Makefile":   "MODULES := . gin kafkago\n",
	})
	if err := checkErr(t, root); err == nil {
		t.Fatal("check passed on the old pattern")
	}
	r, err := load(root)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.convert([]string{"gin"}); err != nil {
		t.Fatal(err)
	}
	if err := checkErr(t, root); err != nil {
		t.Fatalf("after convert: %v", err)
	}
	mod, _ := os.ReadFile(filepath.Join(root, "gin", "go.mod"))
	if strings.Contains(string(mod), "replace") || !strings.Contains(string(mod), "github.com/idemkit/idem v0.1.0") {
		t.Errorf("gin/go.mod after convert:\n%s", mod)
	}
	sum, _ := os.ReadFile(filepath.Join(root, "gin", "go.sum"))
	if string(sum) != "github.com/x/y v1.0.0 h1:y=\n" {
		t.Errorf("gin/go.sum after convert:\n%s", sum)
	}
}

// TestProxyLayout: the proxy serves list, info, mod and zip per module;
// the core's zip holds neither the nested module's files nor ignored ones.
func TestProxyLayout(t *testing.T) {
	t.Parallel()
	root := tree(t, map[string]string{"idem.go": "package idem\n", "kafkago/k.go": "package kafkago\n"})
	if out, err := runIn(root, "git", "init", "-q"); err != nil {
		t.Fatalf("git init: %v\n%s", err, out)
	}
	r, err := load(root)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "proxy")
	if err := r.writeProxy(dir, "v0.1.0"); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"list", "v0.1.0.info", "v0.1.0.mod", "v0.1.0.zip"} {
		for _, m := range []string{"github.com/idemkit/idem", "github.com/idemkit/idem/kafkago"} {
			if _, err := os.Stat(filepath.Join(dir, m, "@v", f)); err != nil {
				t.Error(err)
			}
		}
	}
	files, err := r.files(r.modules[0])
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, f.Path())
	}
	if got := strings.Join(names, " "); strings.Contains(got, "kafkago") || !strings.Contains(got, "idem.go") {
		t.Errorf("core zip files: %s", got)
	}
}

func TestUntidyIgnoresOnlyTheRepositorysSums(t *testing.T) {
	t.Parallel()
	diff := "diff current/go.sum tidy/go.sum\n--- current/go.sum\n+++ tidy/go.sum\n@@ -1,0 +1,2 @@\n+github.com/idemkit/idem v0.1.0 h1:abc=\n+github.com/idemkit/idem/kafkago v0.1.0/go.mod h1:def=\n"
	if rest := untidy(diff); rest != "" {
		t.Errorf("the repository's own sums counted as untidy: %q", rest)
	}
	diff += "-github.com/x/y v1.0.0 h1:y=\n"
	if rest := untidy(diff); !strings.Contains(rest, "github.com/x/y") {
		t.Errorf("a third-party line was ignored: %q", rest)
	}
	if rest := untidy("go: github.com/x/y@v9: not found\n"); rest == "" {
		t.Error("a resolution error without a diff was ignored")
	}
}

func runIn(dir string, name string, args ...string) ([]byte, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	return cmd.CombinedOutput()
}
