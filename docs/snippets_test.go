package docs_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// snippet is one ```go block of a Markdown file.
type snippet struct {
	file string
	line int
	code string
}

func goSnippets(t *testing.T) []snippet {
	t.Helper()
	files, err := filepath.Glob("*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, "../README.md")
	var out []snippet
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var cur *snippet
		for i, line := range strings.Split(string(b), "\n") {
			trimmed := strings.TrimSpace(line)
			switch {
			case cur == nil && trimmed == "```go":
				cur = &snippet{file: f, line: i + 1}
			case cur != nil && trimmed == "```":
				out = append(out, *cur)
				cur = nil
			case cur != nil:
				cur.code += line + "\n"
			}
		}
		if cur != nil {
			t.Errorf("%s:%d: a ```go block that never ends", f, cur.line)
		}
	}
	return out
}

var leadingImports = regexp.MustCompile(`\A(?:\s*(?://[^\n]*\n)*\s*import\s*(?:"[^"]*"|\([^)]*\))\s*\n)+`)

// source is the file a snippet compiles as (docs/conventions.md): a full
// file, from its package clause, as it is; a fragment, optionally led by
// its imports, as the body of a function that has ctx and pool.
func (s snippet) source() string {
	if regexp.MustCompile(`(?m)\A(\s*//[^\n]*\n)*\s*package `).MatchString(s.code) {
		return s.code
	}
	imports := leadingImports.FindString(s.code)
	body := s.code[len(imports):]
	return fmt.Sprintf(`package snippet

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"
)

%s

// fragment is %s:%d.
func fragment(ctx context.Context, pool *pgxpool.Pool) error {
	_, _ = ctx, pool
%s
	return nil
}
`, imports, s.file, s.line, body)
}

// TestGoSnippetsCompile compiles every ```go block of README.md and
// docs/*.md. The snippets are written as packages of a directory inside
// the core module, so that the workspace (go.work) gives them every module
// of the repository and its dependencies, and built by one go vet.
func TestGoSnippetsCompile(t *testing.T) {
	t.Parallel()
	snippets := goSnippets(t)
	if len(snippets) == 0 {
		t.Fatal("no ```go block found: the scan is broken (the README has one)")
	}
	dir, err := os.MkdirTemp(".", ".snippets-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	where := map[string]snippet{}
	args := []string{"vet"}
	for i, s := range snippets {
		pkg := filepath.Join(dir, fmt.Sprintf("s%02d", i))
		if err := os.Mkdir(pkg, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(pkg, "snippet.go"), []byte(s.source()), 0o644); err != nil {
			t.Fatal(err)
		}
		where[filepath.Base(pkg)] = s
		args = append(args, "./"+filepath.ToSlash(pkg))
	}
	// Named one by one: a directory whose name starts with a dot (kept out
	// of ./... and of the other tests' walks) matches no wildcard.
	cmd := exec.Command("go", args...)
	cmd.Dir = "."
	out, err := cmd.CombinedOutput()
	if err == nil {
		return
	}
	// Name each failing snippet by its Markdown file and line.
	report := string(out)
	for pkg, s := range where {
		report = strings.ReplaceAll(report, filepath.Base(dir)+"/"+pkg+"/snippet.go", fmt.Sprintf("%s:%d (```go block)", s.file, s.line))
	}
	t.Fatalf("a Go snippet of the docs does not compile (docs/conventions.md, Snippets):\n%s", report)
}
