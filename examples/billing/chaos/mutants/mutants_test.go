package mutants_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idemkit/idem/examples/billing/chaos"
	"github.com/idemkit/idem/internal/failpoint"
	"github.com/idemkit/idem/internal/testbin"
	"github.com/idemkit/idem/internal/testdb"
)

// mutant is one deliberate bug: testdata/name.patch, and the violations,
// any one of which catches it.
type mutant struct {
	name string
	want []string
}

// mutants lists every patch under testdata; the test fails when a patch
// has no entry or an entry no patch.
var mutants = []mutant{
	// The charger takes a provider 500 for a refusal and records FAILED;
	// paysim declined nothing for that key.
	{"provider-500-as-decline", []string{"unexplained-failure"}},
	// Every charge is sent for the wrong customer (a field mix-up in the
	// payment adapter).
	{"wrong-customer", []string{"wrong-customer"}},
	// The request fingerprint covers the amount members only: a key
	// reused with another order or customer replays the first answer.
	{"amount-only-fingerprint", []string{"key-reuse-accepted"}},
	// The idempotency middleware stores no response header: a replay
	// lacks the Content-Type (and Location) of the first answer.
	{"replay-without-headers", []string{"replay-differs"}},
	// The consumer commits a record's offset before its transaction; the
	// failpoint consumer-db-committed, armed by the harness, kills between
	// the two and the record is lost.
	{"offset-before-db-commit", []string{"not-final", "lost-charge"}},
	// The relay's publisher reports one event in 25 delivered without
	// producing it.
	{"relay-drops-one-in-n", []string{"lost-event"}},
	// idemclient sends its retries (the second attempt and later ones)
	// under a new key: a run need not reach a third attempt of any charge.
	{"idemclient-new-key-on-retry", []string{"wrong-key", "double-charge"}},
	// 8s after a process's last charge, the charger charges that command
	// again under a new key: only a ledger watched longer than that, once
	// everything is idle, sees it.
	{"late-duplicate-charge", []string{"double-charge"}},
}

// runConfig is the one chaos run every mutant gets, and the control too:
// two instances, paysim failing (500), dropping answers after charging
// often enough that billing's idemclient retries run, and declining; the
// driver dropping and duplicating; failpoints aiming kills at the
// consumer's crash window. Small: the whole test runs in CI.
func runConfig() chaos.Config {
	return chaos.Config{
		Orders: 30, Payments: 30, Instances: 2,
		DropRate: 0.4, FailRate: 0.15, DeclineRate: 0.1,
		// Kills aimed at the one window a mutant needs them in
		// (offset-before-db-commit's patch puts it between the offset and
		// the transaction): the holder dies within a few records of each
		// start, twice.
		Failpoints: true, Seed: 21, FailpointHits: 2,
		FailpointWindows: []string{failpoint.ConsumerDBCommitted},
		FailpointOdds:    map[string]float64{failpoint.ConsumerDBCommitted: 0.3},
		LoadDuration:     20 * time.Second,
		// A lost record leaves its order or payment not final: the run
		// then waits this long before the audit says so.
		Quiescence: 75 * time.Second,
	}
}

var idemBin, billingBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "mutants-test-")
	if err != nil {
		panic(err)
	}
	code := func() int {
		defer os.RemoveAll(dir)
		if idemBin, err = testbin.Build(dir, "idem", "github.com/idemkit/idem/cmd/idem", false); err == nil {
			billingBin, err = testbin.Build(dir, "billing", "github.com/idemkit/idem/cmd/billing", false)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return m.Run()
	}()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// result is one run's outcome, reported by its subtest.
type result struct {
	rep   *chaos.Report
	log   string
	err   error
	setup error
}

func TestMutantsAreCaught(t *testing.T) {
	t.Parallel()
	patches, err := filepath.Glob("testdata/*.patch")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range patches {
		names = append(names, strings.TrimSuffix(filepath.Base(p), ".patch"))
	}
	for _, m := range mutants {
		if !slices.Contains(names, m.name) {
			t.Errorf("mutant %s has no testdata/%s.patch", m.name, m.name)
		}
	}
	for _, n := range names {
		if !slices.ContainsFunc(mutants, func(m mutant) bool { return m.name == n }) {
			t.Errorf("testdata/%s.patch is not in the mutants table: every patch must be run", n)
		}
	}
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}

	// Builds two at a time (they are CPU-bound), runs all at once (they
	// mostly wait on timers and children).
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	buildSem := make(chan struct{}, 2)
	results := make(map[string]*result, len(mutants)+1)
	var wg sync.WaitGroup
	// Databases and directories are made here: testdb.New and t.TempDir
	// may fail the test, which only the test's goroutine may do.
	dbs := map[string]string{"control": testdb.New(t, testdb.Empty()).URL}
	dirs := map[string]string{}
	for _, m := range mutants {
		dbs[m.name], dirs[m.name] = testdb.New(t, testdb.Empty()).URL, t.TempDir()
	}
	run := func(name, bin string, res *result) {
		var log bytes.Buffer
		cfg := runConfig()
		cfg.IdemBin, cfg.BillingBin, cfg.DatabaseURL, cfg.Progress = idemBin, bin, dbs[name], &log
		res.rep, res.err = chaos.Run(ctx, &cfg)
		res.log = log.String()
	}
	defer func() {
		for _, res := range results {
			if res.rep != nil && res.rep.WorkDir != "" && !t.Failed() {
				os.RemoveAll(res.rep.WorkDir)
			}
		}
	}()
	// The map is filled before any goroutine starts: they only write
	// through their own *result.
	results["control"] = &result{}
	for _, m := range mutants {
		results[m.name] = &result{}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		run("control", billingBin, results["control"])
	}()
	for _, m := range mutants {
		res := results[m.name]
		wg.Add(1)
		go func() {
			defer wg.Done()
			buildSem <- struct{}{}
			bin, err := buildMutant(ctx, dirs[m.name], root, m.name)
			<-buildSem
			if err != nil {
				res.setup = err
				return
			}
			run(m.name, bin, res)
		}()
	}
	wg.Wait()

	t.Run("control", func(t *testing.T) {
		res := results["control"]
		logReport(t, res)
		if res.err != nil || !res.rep.Pass {
			t.Fatalf("the unmutated billing fails the mutants' run (err %v): a catch below would prove nothing\n%s", res.err, res.log)
		}
	})
	for _, m := range mutants {
		t.Run(m.name, func(t *testing.T) {
			res := results[m.name]
			if res.setup != nil {
				t.Fatal(res.setup)
			}
			logReport(t, res)
			if res.err != nil {
				t.Fatalf("run: %v\n%s", res.err, res.log)
			}
			if res.rep.Pass {
				t.Fatalf("mutant %s SURVIVED: the run passed\n%s", m.name, res.log)
			}
			var caught, other []string
			for _, v := range res.rep.Violations {
				if slices.Contains(m.want, v.Kind) {
					caught = append(caught, v.Kind+": "+v.Subject+": "+v.Detail)
				} else {
					other = append(other, v.Kind)
				}
			}
			if len(caught) == 0 {
				t.Fatalf("mutant %s failed the run, but not with %v: %v", m.name, m.want, kinds(res.rep.Violations))
			}
			t.Logf("caught by %d violation(s), first: %s (other kinds: %v)", len(caught), caught[0], dedup(other))
		})
	}
}

func logReport(t *testing.T, res *result) {
	t.Helper()
	if res.rep == nil {
		return
	}
	var out strings.Builder
	res.rep.WriteText(&out)
	t.Log(out.String())
}

func kinds(vs []chaos.Violation) []string {
	var out []string
	for _, v := range vs {
		out = append(out, v.Kind)
	}
	return dedup(out)
}

func dedup(ss []string) []string {
	sort.Strings(ss)
	return slices.Compact(ss)
}

// moduleRoot is the directory of the idem module's go.mod, four levels up.
func moduleRoot() (string, error) {
	root, err := filepath.Abs("../../../..")
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil || !bytes.HasPrefix(b, []byte("module github.com/idemkit/idem\n")) {
		return "", fmt.Errorf("%s is not the idem module's root (%v)", root, err)
	}
	return root, nil
}

// buildMutant copies the module into dir, applies testdata/name.patch and
// builds billing from the copy. A patch that does not apply is an error
// naming it: the code it mutates has changed, and the patch must be
// rewritten, never dropped.
func buildMutant(ctx context.Context, dir, root, name string) (string, error) {
	src := filepath.Join(dir, "src")
	if err := copyModule(root, src); err != nil {
		return "", fmt.Errorf("copy the module: %w", err)
	}
	patch, err := filepath.Abs(filepath.Join("testdata", name+".patch"))
	if err != nil {
		return "", err
	}
	apply := exec.CommandContext(ctx, "git", "apply", "--verbose", patch)
	apply.Dir = src
	if out, err := apply.CombinedOutput(); err != nil {
		return "", fmt.Errorf("mutant %s: testdata/%s.patch no longer applies to the module (%v); rewrite it against the current code:\n%s", name, name, err, out)
	}
	bin := filepath.Join(dir, "billing")
	// billing is in the cmd module, which requires the core and the
	// reference service at their release version with no replace
	// (docs/releasing.md); the copy's go.work points each at its copied
	// directory, so the build uses the mutated code.
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./billing")
	build.Dir = filepath.Join(src, "cmd")
	build.Env = append(os.Environ(), "GOWORK="+filepath.Join(src, "go.work"), "GOFLAGS=-mod=readonly")
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("mutant %s: build: %v\n%s", name, err, out)
	}
	return bin, nil
}

// copyModule copies the sources billing is built from: everything but
// .git, test files and testdata.
func copyModule(root, dst string) error {
	return filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		if d.IsDir() {
			if rel != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		if strings.HasSuffix(path, "_test.go") || !d.Type().IsRegular() {
			return nil
		}
		in, err := os.Open(path)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.Create(filepath.Join(dst, rel))
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	})
}
