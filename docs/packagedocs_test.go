package docs_test

import (
	"fmt"
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// corePackages returns the packages of the core module a user imports, as
// directories relative to the module root: every directory with a
// non-test Go file that is not a command, outside internal/, testdata/
// and the sub-modules.
func corePackages(t *testing.T) []string {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir("..", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		if name := d.Name(); path != ".." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "internal") {
			return filepath.SkipDir
		}
		if path != ".." {
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir // another module
			}
		}
		entries, err := os.ReadDir(path)
		if err != nil {
			return err
		}
		for _, e := range entries {
			name := e.Name()
			if e.IsDir() || !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(path, name), nil, parser.PackageClauseOnly)
			if err != nil {
				return err
			}
			if f.Name.Name != "main" {
				rel, err := filepath.Rel("..", path)
				if err != nil {
					return err
				}
				dirs = append(dirs, filepath.ToSlash(rel))
			}
			break
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) < 10 {
		t.Fatalf("found only %d core packages (%v): the walk is broken", len(dirs), dirs)
	}
	return dirs
}

// maxDocHead bounds the lines of a package doc before its first heading:
// what `go doc PKG | head -30` shows must be what the package is for and
// how to use it, as pgx and River open theirs, with the design below.
const maxDocHead = 25

// TestPackageDocsOpenWithUsage: every core package's doc opens with what
// it is for and a short usage (an indented code block) within maxDocHead
// lines, before its first heading.
func TestPackageDocsOpenWithUsage(t *testing.T) {
	for _, dir := range corePackages(t) {
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

// TestEveryPackageHasARunnableExample: every core package has an example
// that `go test` runs and checks (an `// Output:` comment), in an example
// file (example_test.go, or a name with "example" in it) of its external
// test package, so that it sees only the public API; the example files
// import no internal package and use nothing that the package's other test
// files declare (internal/testdb's helpers, TestMain's setup), so that the
// example files can be copied into a user's module as they are; and an
// example that talks to PostgreSQL reads TEST_DATABASE_URL itself.
func TestEveryPackageHasARunnableExample(t *testing.T) {
	for _, dir := range corePackages(t) {
		for _, problem := range examplesOf(t, filepath.Join("..", dir)) {
			t.Errorf("%s: %s", dir, problem)
		}
	}
}

// examplesOf returns what is wrong with the examples of the package in dir.
func examplesOf(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	pkgName := ""
	var exampleFiles, otherTestFiles []*ast.File
	for _, e := range entries {
		name := e.Name()
		if e.IsDir() || !strings.HasSuffix(name, ".go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case !strings.HasSuffix(name, "_test.go"):
			pkgName = f.Name.Name
		case strings.Contains(name, "example"):
			exampleFiles = append(exampleFiles, f)
		default:
			otherTestFiles = append(otherTestFiles, f)
		}
	}
	external := pkgName + "_test"
	var problems []string
	runnable := 0
	for _, f := range exampleFiles {
		file := filepath.Base(fset.Position(f.Package).Filename)
		if f.Name.Name != external {
			problems = append(problems, fmt.Sprintf("%s is package %s, want %s (an example sees only the public API)", file, f.Name.Name, external))
			continue
		}
		for _, ex := range doc.Examples(f) {
			if ex.Output != "" || ex.EmptyOutput {
				runnable++
			}
		}
	}
	if runnable == 0 {
		problems = append(problems, fmt.Sprintf("no runnable example: want an Example function with an // Output: comment in an example_test.go of package %s", external))
	}

	// What the example files declare, and what the package's other
	// external test files declare that the examples must not use.
	declared := map[string]bool{}
	for _, f := range exampleFiles {
		for name := range topLevelNames(f) {
			declared[name] = true
		}
	}
	foreign := map[string]string{}
	for _, f := range otherTestFiles {
		if f.Name.Name != external {
			continue
		}
		for name := range topLevelNames(f) {
			if !declared[name] {
				foreign[name] = filepath.Base(fset.Position(f.Package).Filename)
			}
		}
	}
	usesDB, readsURL := false, false
	for _, f := range exampleFiles {
		if f.Name.Name != external {
			continue
		}
		file := filepath.Base(fset.Position(f.Package).Filename)
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if strings.Contains(p, "/internal/") || strings.HasSuffix(p, "/internal") {
				problems = append(problems, fmt.Sprintf("%s imports %s; examples use only the public API", file, p))
			}
			if strings.HasPrefix(p, "github.com/jackc/pgx/") || p == "database/sql" || p == "github.com/lib/pq" {
				usesDB = true
			}
		}
		for _, id := range f.Unresolved {
			if other, ok := foreign[id.Name]; ok {
				problems = append(problems, fmt.Sprintf("%s uses %s, declared in %s, not an example file: the examples cannot be copied on their own", fset.Position(id.Pos()), id.Name, other))
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING && strings.Contains(lit.Value, "TEST_DATABASE_URL") {
				readsURL = true
			}
			return true
		})
	}
	if usesDB && !readsURL {
		problems = append(problems, "the examples talk to PostgreSQL but none reads TEST_DATABASE_URL (os.Getenv) itself")
	}
	return problems
}

// topLevelNames returns the names f declares at package level, but TestMain.
func topLevelNames(f *ast.File) map[string]bool {
	names := map[string]bool{}
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil && d.Name.Name != "TestMain" {
				names[d.Name.Name] = true
			}
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.ValueSpec:
					for _, n := range s.Names {
						names[n.Name] = true
					}
				case *ast.TypeSpec:
					names[s.Name.Name] = true
				}
			}
		}
	}
	return names
}
