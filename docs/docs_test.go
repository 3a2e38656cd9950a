// Package docs holds idem's documentation; its test keeps the documents
// honest: every problem code the code defines has its entry in problems.md
// (the problem type URIs point there), and every relative link in docs/ and
// the README leads to a file and, with a fragment, to an anchor that exists.
package docs_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// problemCodes finds every string constant named Code… in the module's
// non-test Go files: the problem codes, wherever a package defines one.
func problemCodes(t *testing.T) map[string]string {
	t.Helper()
	codes := map[string]string{}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != ".." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "tools") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, name := range vs.Names {
					if !strings.HasPrefix(name.Name, "Code") || i >= len(vs.Values) {
						continue
					}
					lit, ok := vs.Values[i].(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						continue
					}
					v, _ := strconv.Unquote(lit.Value)
					codes[v] = path + ": " + name.Name
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return codes
}

var anchorRE = regexp.MustCompile(`<a id="([^"]+)"></a>`)

// anchors returns the explicit anchors and the heading slugs of a
// Markdown file, as GitHub renders them.
func anchors(t *testing.T, path string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, m := range anchorRE.FindAllStringSubmatch(string(b), -1) {
		out[m[1]] = true
	}
	inFence := false
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "```") {
			inFence = !inFence
		}
		if inFence || !strings.HasPrefix(line, "#") {
			continue
		}
		out[slug(strings.TrimLeft(line, "# "))] = true
	}
	return out
}

// slug is GitHub's heading anchor: lower case, punctuation other than '-'
// and '_' dropped, spaces as '-'.
func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 0x7f:
			b.WriteRune(r)
		}
	}
	return b.String()
}

func TestEveryProblemCodeIsDocumented(t *testing.T) {
	t.Parallel()
	codes := problemCodes(t)
	if len(codes) < 20 {
		t.Fatalf("found only %d problem codes: the scan is broken", len(codes))
	}
	have := anchors(t, "problems.md")
	for code, where := range codes {
		if !have[strings.ToLower(strings.ReplaceAll(code, "_", "-"))] {
			t.Errorf("%s (%s) has no entry in docs/problems.md", code, where)
		}
	}
}

var linkRE = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// pending are documents linked to before they exist, each with the work
// that writes it. A link to one is logged, not failed; once the file
// exists its entry must go (the test fails until it does), so the list
// cannot outlive its reason.
var pending = map[string]string{}

func TestRelativeLinksResolve(t *testing.T) {
	t.Parallel()
	for name := range pending {
		if _, err := os.Stat(name); err == nil {
			t.Errorf("docs/%s exists now: remove it from pending", name)
		}
	}
	files, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, "../README.md")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range linkRE.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, frag, _ := strings.Cut(target, "#")
			path := f
			if file != "" {
				path = filepath.Join(filepath.Dir(f), file)
			}
			if _, err := os.Stat(path); err != nil {
				if why, ok := pending[filepath.Base(path)]; ok && filepath.Dir(path) == "." {
					t.Logf("%s: link %q: not written yet: %s", f, target, why)
					continue
				}
				t.Errorf("%s: link %q: %v", f, target, err)
				continue
			}
			if frag != "" && strings.HasSuffix(path, ".md") && !anchors(t, path)[frag] {
				t.Errorf("%s: link %q: no anchor %q in %s", f, target, frag, path)
			}
		}
	}
}

// outsideRefs are the names of documents that live beside the repository
// during development but not in it: nothing committed may cite them, since
// a reader of the module cannot follow the reference.
var outsideRefs = regexp.MustCompile(`ARCHITECTURE\.md|STYLE\.md|\.\./shared/|the seed article`)

func TestNothingPointsOutsideTheRepository(t *testing.T) {
	t.Parallel()
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != ".." && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(path) {
		case ".go", ".md", ".sql", ".yaml", ".tmpl", ".html", ".txt":
		default:
			if filepath.Base(path) != "Makefile" {
				return nil
			}
		}
		if path == filepath.Join("..", "docs", "docs_test.go") {
			return nil // the pattern itself
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(b), "\n") {
			if m := outsideRefs.FindString(line); m != "" {
				t.Errorf("%s:%d: cites %q, which is not in the repository", path, i+1, m)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
