package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"runtime/pprof"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idemkit/idem/internal/cli"
)

// benchScenario is one `idem bench NAME`. Run measures the subject and its
// baseline in the same process and returns one Result per variant, in the
// names the scenario's issue lists.
type benchScenario struct {
	Name    string
	Summary string
	// Flags lets a scenario add its own flags (record counts and the like).
	Flags func(fs *benchFlags)
	Run   func(ctx context.Context, env *benchEnv) ([]benchResult, error)
}

// benchEnv is what every scenario receives.
type benchEnv struct {
	DatabaseURL string
	// Log receives progress lines; it is stderr, so that --json output on
	// stdout stays one JSON object.
	Log io.Writer
	// Ints and Strings hold the scenario's own flags by name.
	Ints    map[string]*int
	Strings map[string]*string
	Bools   map[string]*bool
	// Set names the flags given on the command line (not left at their
	// defaults), so that a scenario can tell an explicit ask from a default.
	Set map[string]bool
}

// benchFlags lets a scenario declare integer and string flags.
type benchFlags struct {
	ints   map[string]*int
	strs   map[string]*string
	add    func(name string, def int, usage string) *int
	addStr func(name, def, usage string) *string
	bools  map[string]*bool
	addB   func(name string, def bool, usage string) *bool
}

// Int declares an integer flag of the scenario.
func (f *benchFlags) Int(name string, def int, usage string) { f.ints[name] = f.add(name, def, usage) }

// String declares a string flag of the scenario.
func (f *benchFlags) String(name, def, usage string) { f.strs[name] = f.addStr(name, def, usage) }

// Bool declares a boolean flag of the scenario.
func (f *benchFlags) Bool(name string, def bool, usage string) {
	f.bools[name] = f.addB(name, def, usage)
}

// benchResult is one variant's figures.
type benchResult struct {
	Name      string  `json:"name"`
	OpsPerSec float64 `json:"ops_per_sec"`
	P50Ms     float64 `json:"p50_ms"`
	P99Ms     float64 `json:"p99_ms"`
	// Ops is how many operations the figures cover.
	Ops int `json:"ops"`
	// Ratio is OpsPerSec over the scenario's baseline in the same run,
	// where the scenario has one.
	Ratio float64 `json:"ratio,omitempty"`
}

var benchScenarios = map[string]*benchScenario{}

func registerBench(s *benchScenario) { benchScenarios[s.Name] = s }

func init() {
	register(&cli.Command{Name: "bench", Summary: "benchmark a subject against its baseline in one run", Run: runBench})
}

func benchNames() string {
	var names []string
	for n := range benchScenarios {
		names = append(names, n)
	}
	sort.Strings(names)
	return strings.Join(names, "|")
}

func runBench(ctx context.Context, args []string) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
			fmt.Printf("Usage: idem bench %s [--json] [flags]\n\nEach scenario runs its subject and its baseline in the same run,\nagainst DATABASE_URL (default: the local server) and an in-process kfake broker.\n", benchNames())
			return nil
		}
		return cli.Usagef("missing scenario: %s", benchNames())
	}
	sc, ok := benchScenarios[args[0]]
	if !ok {
		return cli.Usagef("unknown scenario %q: want %s", args[0], benchNames())
	}
	fs := cli.FlagSet("bench "+sc.Name, "Usage: idem bench "+sc.Name+" [flags]\n\n"+sc.Summary)
	asJSON := fs.Bool("json", false, "print one JSON object instead of a table")
	dbURL := fs.String("database-url", cli.DatabaseURL(), "PostgreSQL URL")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run (subject and load generator) to this file, for go tool pprof")
	bf := &benchFlags{
		ints: map[string]*int{}, add: func(name string, def int, usage string) *int { return fs.Int(name, def, usage) },
		strs: map[string]*string{}, addStr: func(name, def, usage string) *string { return fs.String(name, def, usage) },
		bools: map[string]*bool{}, addB: func(name string, def bool, usage string) *bool { return fs.Bool(name, def, usage) },
	}
	if sc.Flags != nil {
		sc.Flags(bf)
	}
	if err := cli.Parse(fs, args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return cli.Usagef("unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	objs, bytes := benchMemStart()
	results, err := sc.Run(ctx, &benchEnv{DatabaseURL: *dbURL, Log: os.Stderr, Ints: bf.ints, Strings: bf.strs, Bools: bf.bools, Set: set})
	if err != nil {
		return err
	}
	ops := 0
	for _, r := range results {
		ops += r.Ops
	}
	mem := benchMemEnd(objs, bytes, ops)
	fmt.Fprintf(os.Stderr, "%s: peak RSS %.1f MiB, %.1f allocations (%.0f bytes) per operation, over the %d operations of all results (this process: subject and load generator together, which RSS cannot split; billing demo reports billing serve's own)\n",
		sc.Name, float64(mem.PeakRSSBytes)/(1<<20), mem.AllocsPerOp, mem.AllocBytesPerOp, ops)
	return printBench(os.Stdout, sc.Name, results, mem, *asJSON)
}

func printBench(w io.Writer, scenario string, results []benchResult, mem benchMemory, asJSON bool) error {
	if asJSON {
		return json.NewEncoder(w).Encode(struct {
			Scenario string        `json:"scenario"`
			Results  []benchResult `json:"results"`
			Memory   benchMemory   `json:"memory"`
		}{scenario, results, mem})
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "%s\tops/s\tp50 ms\tp99 ms\tops\tratio\t\n", scenario)
	for _, r := range results {
		ratio := "-"
		if r.Ratio > 0 {
			ratio = fmt.Sprintf("%.2f", r.Ratio)
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.2f\t%.2f\t%d\t%s\t\n", r.Name, r.OpsPerSec, r.P50Ms, r.P99Ms, r.Ops, ratio)
	}
	return tw.Flush()
}

// scratchSchemas creates schemas named prefix_<random>_<i> for i in [0, n)
// on the server behind dbURL, so that a benchmark never touches the tables
// of the database it is pointed at, and returns a URL per schema (with
// search_path and the extra run-time parameters set) and a func that drops
// them all.
func scratchSchemas(ctx context.Context, dbURL, prefix string, n int, params map[string]string) ([]string, func(), error) {
	admin, err := cli.Connect(ctx, dbURL)
	if err != nil {
		return nil, nil, err
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	base := prefix + "_" + hex.EncodeToString(b[:])
	var created []string
	drop := func() {
		for _, s := range created {
			_, _ = admin.Exec(context.WithoutCancel(ctx), "DROP SCHEMA IF EXISTS "+s+" CASCADE")
		}
		admin.Close()
	}
	var urls []string
	for i := range n {
		schema := fmt.Sprintf("%s_%d", base, i)
		if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
			drop()
			return nil, nil, fmt.Errorf("create scratch schema: %w", err)
		}
		created = append(created, schema)
		u, err := url.Parse(dbURL)
		if err != nil {
			drop()
			return nil, nil, cli.Usagef("database URL is malformed")
		}
		q := u.Query()
		q.Set("search_path", schema)
		for k, v := range params {
			q.Set(k, v)
		}
		u.RawQuery = q.Encode()
		urls = append(urls, u.String())
	}
	return urls, drop, nil
}

// latencyResult turns per-operation latencies in milliseconds into a
// result; ops/s is ops over elapsed.
func latencyResult(name string, latMs []float64, ops int, elapsed time.Duration) benchResult {
	slices.Sort(latMs)
	pct := func(p float64) float64 {
		if len(latMs) == 0 {
			return 0
		}
		return latMs[int(p*float64(len(latMs)-1))]
	}
	return benchResult{Name: name, OpsPerSec: float64(ops) / elapsed.Seconds(), P50Ms: pct(0.50), P99Ms: pct(0.99), Ops: ops}
}
