// Package testbin builds the programs that process tests run: real
// binaries, started with exec and stopped with real signals, because a crash
// or shutdown test of an in-process goroutine proves nothing about a process.
package testbin

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Build compiles pkg (an import path, or a path relative to the calling
// test's package directory) into dir/name and returns the binary's path.
// With race, the binary has the race detector: a data race in the child then
// makes it exit 66, which a test that checks the exit status catches.
//
// An import path of another module of this repository (the programs in
// cmd/, the reference service, the adapters) is built inside that module,
// so that a test of one module can run another module's binary without
// the first requiring the second.
func Build(dir, name, pkg string, race bool) (string, error) {
	out := filepath.Join(dir, name)
	args := []string{"build", "-o", out}
	if race {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, pkg)...)
	if modDir, rel, ok := moduleOf(pkg); ok {
		// -C must be the first flag.
		cmd = exec.Command("go", append(append([]string{"build", "-C", modDir, "-o", out}, raceFlag(race)...), rel)...)
	}
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
	}
	return out, nil
}

func raceFlag(race bool) []string {
	if race {
		return []string{"-race"}
	}
	return nil
}

// repoModule is the import path of the repository's root module.
const repoModule = "github.com/idemkit/idem"

// moduleOf finds the module of this repository that holds the import path
// pkg: the deepest directory with a go.mod whose module path prefixes pkg.
// It returns that directory and pkg relative to it ("./billing"). ok is
// false for relative paths, paths outside the repository, and the root
// module (built as usual from the calling test's directory).
func moduleOf(pkg string) (dir, rel string, ok bool) {
	if !strings.HasPrefix(pkg, repoModule+"/") {
		return "", "", false
	}
	root, err := repoRoot()
	if err != nil {
		return "", "", false
	}
	sub := strings.TrimPrefix(pkg, repoModule+"/")
	parts := strings.Split(sub, "/")
	for i := len(parts) - 1; i >= 1; i-- {
		cand := filepath.Join(append([]string{root}, parts[:i]...)...)
		if _, err := os.Stat(filepath.Join(cand, "go.mod")); err == nil {
			return cand, "./" + strings.Join(parts[i:], "/"), true
		}
	}
	if _, err := os.Stat(filepath.Join(root, sub, "go.mod")); err == nil {
		return filepath.Join(root, sub), ".", true
	}
	return "", "", false
}

// repoRoot walks up from the working directory to the directory whose
// go.mod declares the root module.
func repoRoot() (string, error) {
	d, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(d, "go.mod")); err == nil {
			for _, line := range strings.Split(string(b), "\n") {
				if strings.TrimSpace(line) == "module "+repoModule {
					return d, nil
				}
			}
		}
		parent := filepath.Dir(d)
		if parent == d {
			return "", errors.New("testbin: not inside the idem repository")
		}
		d = parent
	}
}

// BuildT is Build into the test's temporary directory, with the race
// detector when the test binary has it; a build failure fails t.
func BuildT(t testing.TB, pkg string) string {
	t.Helper()
	bin, err := Build(t.TempDir(), filepath.Base(pkg), pkg, Race)
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// Run runs bin with args and env added to the test's environment, waits for
// it, and returns its stdout, stderr and exit status. Failing to start it
// fails t; a non-zero exit does not.
func Run(t testing.TB, bin string, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("run %s: %v", bin, err)
	}
	return o.String(), e.String(), code
}

// Buffer is a goroutine-safe buffer for a child's output, read while the
// child still writes.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns what was written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// RSS is the resident set of process pid in bytes (VmRSS in
// /proc/pid/status): what a process test reads to bound a child's memory
// growth, since the child's own runtime statistics are out of its reach.
func RSS(t testing.TB, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS %q: %v", v, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}
