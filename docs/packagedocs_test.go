package docs_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// corePackages are the packages of the core module a user imports, as
// directories relative to the module root.
var corePackages = []string{
	".", "idempotency", "idemclient", "outbox", "outbox/wal", "inbox", "consume", "kafka",
	"lifecycle", "migrate", "paysim", "idemtest", "console",
	"idempotency/storetest", "outbox/publishertest", "consume/consumertest",
}

// maxDocHead bounds the lines of a package doc before its first heading:
// what `go doc PKG | head -30` shows must be what the package is for and
// how to use it, as pgx and River open theirs, with the design below.
const maxDocHead = 25

// TestPackageDocsOpenWithUsage: every core package's doc opens with what
// it is for and a short usage (an indented code block) within maxDocHead
// lines, before its first heading.
func TestPackageDocsOpenWithUsage(t *testing.T) {
	for _, dir := range corePackages {
		doc := packageDoc(t, filepath.Join("..", dir))
		if doc == "" {
			t.Errorf("%s: no package doc", dir)
			continue
		}
		lines := strings.Split(strings.TrimRight(doc, "\n"), "\n")
		head := len(lines)
		for i, l := range lines {
			if strings.HasPrefix(l, "# ") {
				head = i
				break
			}
		}
		if head > maxDocHead {
			t.Errorf("%s: %d lines of package doc before its first heading, want at most %d (usage first, the design under headings or in docs/)", dir, head, maxDocHead)
		}
		code := false
		for _, l := range lines[:min(head, maxDocHead)] {
			if strings.HasPrefix(l, "\t") {
				code = true
				break
			}
		}
		if !code {
			t.Errorf("%s: no usage (an indented code block) in the first %d lines of its package doc", dir, min(head, maxDocHead))
		}
	}
}

// TestExamplesUseOnlyThePublicAPI: no example file of the module imports
// an internal package, so every example can be copied into a user's
// module as it is.
func TestExamplesUseOnlyThePublicAPI(t *testing.T) {
	err := filepath.WalkDir("..", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != ".." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "internal") {
				return filepath.SkipDir
			}
			if path != ".." {
				if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
					return filepath.SkipDir // another module
				}
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly|parser.ParseComments)
		if err != nil {
			return err
		}
		full, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			return err
		}
		if !isExampleFile(path, full) {
			return nil
		}
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if strings.Contains(p, "/internal/") || strings.HasSuffix(p, "/internal") {
				t.Errorf("%s: an example file imports %s; examples use only the public API", path, p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// isExampleFile: a file that defines an Example function, or one named
// example*_test.go (the examples' helpers).
func isExampleFile(path string, f *ast.File) bool {
	if strings.HasPrefix(filepath.Base(path), "example") {
		return true
	}
	for _, decl := range f.Decls {
		if fd, ok := decl.(*ast.FuncDecl); ok && fd.Recv == nil && strings.HasPrefix(fd.Name.Name, "Example") {
			return true
		}
	}
	return false
}

// packageDoc returns the package doc comment of the non-test files of dir.
func packageDoc(t *testing.T, dir string) string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(dir, name), nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		if f.Doc != nil {
			return f.Doc.Text()
		}
	}
	return ""
}
