// Package testbin builds the programs that process tests run: real
// binaries, started with exec and stopped with real signals, because a crash
// or shutdown test of an in-process goroutine proves nothing about a process.
package testbin

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"
)

// Build compiles pkg (an import path, or a path relative to the calling
// test's package directory) into dir/name and returns the binary's path.
// With race, the binary has the race detector: a data race in the child then
// makes it exit 66, which a test that checks the exit status catches.
func Build(dir, name, pkg string, race bool) (string, error) {
	out := filepath.Join(dir, name)
	args := []string{"build", "-o", out}
	if race {
		args = append(args, "-race")
	}
	if b, err := exec.Command("go", append(args, pkg)...).CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
	}
	return out, nil
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
