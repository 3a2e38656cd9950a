package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idemkit/idem/examples/billing/chaos"
	"github.com/idemkit/idem/internal/testbin"
	"github.com/idemkit/idem/internal/testdb"
)

var (
	idemOnce sync.Once
	idemPath string
	idemErr  error
)

// idemBinary builds the idem binary (devkafka, paysim) once, without the
// race detector: the chaos runs below are long enough as it is.
func idemBinary(t *testing.T) string {
	t.Helper()
	idemOnce.Do(func() {
		dir, err := os.MkdirTemp("", "billing-report-idem-")
		if err != nil {
			idemErr = err
			return
		}
		idemPath, idemErr = testbin.Build(dir, "idem", "github.com/idemkit/idem/cmd/idem", false)
	})
	if idemErr != nil {
		t.Fatal(idemErr)
	}
	return idemPath
}

// browser opens path (a file) in headless Chromium and returns a context
// to drive it.
func browser(t *testing.T, path string) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1400, 1000),
		chromedp.Flag("no-proxy-server", true))
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(acancel)
	bctx, bcancel := chromedp.NewContext(actx)
	t.Cleanup(bcancel)
	bctx, tcancel := context.WithTimeout(bctx, 2*time.Minute)
	t.Cleanup(tcancel)
	if err := chromedp.Do(bctx, chromedp.Navigate("file://"+path), chromedp.WaitVisible(chromedp.CSS(`#verdict`))); err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	return bctx
}

func evalT[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js))
	if err != nil {
		t.Fatalf("evaluate %s: %v", js, err)
	}
	return v
}

// external matches a reference to anything outside the page: a src or
// href to another host, a stylesheet or a script file.
// demoRSS is the summary's memory line.
var demoRSS = regexp.MustCompile(`billing serve peak RSS ([0-9.]+) MiB \(billing-1 `)

var external = regexp.MustCompile(`(?i)(src|href)="(https?:)?//|<link |<script [^>]*src=`)

// billing demo prints PASS and the path of its HTML report, which opens in
// Chromium with the verdict first, linearizable yes and every kill on the
// timeline; the page refers to nothing outside itself. A screenshot goes
// to IDEM_CHAOS_REPORT_SCREENSHOT (docs/chaos-report.png is one).
func TestDemoReportInBrowser(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "demo.html")
	stdout, stderr, code := runBilling(t, []string{"DATABASE_URL=" + testdb.URL(), "IDEM_BIN=" + idemBinary(t), "KAFKA_BROKERS="},
		"demo", "--orders", "30", "--payments", "15", "--duration", "10s", "--seed", "5", "--report", path)
	if code != 0 || !strings.Contains(stdout, "PASS") {
		t.Fatalf("demo: exit %d\n%s\n%s", code, stdout, stderr)
	}
	if !strings.Contains(stdout, "report: "+path) {
		t.Errorf("demo did not print the report's path: %s", stdout)
	}
	page, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if m := external.Find(page); m != nil {
		t.Errorf("the page refers outside itself: %s", m)
	}
	ctx := browser(t, path)
	if v := evalT[string](t, ctx, `document.getElementById("verdict").textContent`); v != "PASS" {
		t.Errorf("verdict %q, want PASS", v)
	}
	if v := evalT[string](t, ctx, `document.getElementById("linearizable").textContent`); v != "yes" {
		t.Errorf("linearizable %q, want yes", v)
	}
	// billing serve's peak RSS, the same in the summary and on the page,
	// and one a Go service can have.
	m := demoRSS.FindStringSubmatch(stdout)
	if m == nil {
		t.Errorf("the summary has no billing serve peak RSS line:\n%s", stdout)
	} else if mb, _ := strconv.ParseFloat(m[1], 64); mb <= 1 || mb >= 4096 {
		t.Errorf("billing serve peak RSS %s MiB, want between 1 MiB and 4 GiB", m[1])
	}
	if b := evalT[string](t, ctx, `document.getElementById("billing-rss").dataset.peakRssBytes`); b == "" {
		t.Error("the page has no billing serve memory")
	} else if n, _ := strconv.ParseInt(b, 10, 64); n <= 1<<20 || n >= 4<<30 || (m != nil && !strings.Contains(evalT[string](t, ctx, `document.getElementById("billing-rss").textContent`), m[1]+" MiB")) {
		t.Errorf("the page's billing serve peak RSS: %s bytes, %q", b, evalT[string](t, ctx, `document.getElementById("billing-rss").textContent`))
	}
	// The demo's 2 kills and 1 term, with their restarts, on the first chart.
	if n := evalT[int](t, ctx, `document.querySelectorAll("#chart-posts line.mark-kill").length`); n != 2 {
		t.Errorf("%d kills on the timeline, want 2", n)
	}
	if n := evalT[int](t, ctx, `document.querySelectorAll("#chart-posts line.mark-term").length`); n != 1 {
		t.Errorf("%d terms on the timeline, want 1", n)
	}
	if n := evalT[int](t, ctx, `document.querySelectorAll("#chart-posts line.mark-restart").length`); n < 3 {
		t.Errorf("%d restarts on the timeline, want 3 or more", n)
	}
	// Charges reached paysim, and the POSTs drew bars.
	if n := evalT[int](t, ctx, `document.querySelectorAll("#chart-charges rect[fill='#1a7f37']").length`); n < 2 {
		t.Errorf("%d seconds with charges at paysim drawn", n)
	}
	if n := evalT[int](t, ctx, `document.querySelectorAll("#chart-posts rect[fill='#1f77b4']").length`); n < 5 {
		t.Errorf("%d seconds with fresh POSTs drawn", n)
	}
	if cmd := evalT[string](t, ctx, `document.getElementById("command").textContent`); !strings.Contains(cmd, "--seed 5 ") || !strings.Contains(cmd, "--kills 2 ") {
		t.Errorf("the repeat command %q lacks the seed or the kills", cmd)
	}
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	if len(shot) < 1000 || string(shot[1:4]) != "PNG" {
		t.Fatalf("screenshot is not a PNG (%d bytes)", len(shot))
	}
	out := os.Getenv("IDEM_CHAOS_REPORT_SCREENSHOT")
	if out == "" {
		out = filepath.Join(os.TempDir(), "billing-chaos-report.png")
	}
	if err := os.WriteFile(out, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", out)
}

// An --unsafe=key run's page: FAIL, linearizable no with porcupine's view
// of the smallest failing key history beside it, and every violation
// linked to a moment of the timeline that exists; the kill is on it.
func TestChaosUnsafeKeyReportInBrowser(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "unsafe.html")
	stdout, stderr, code := runBilling(t, []string{"DATABASE_URL=" + testdb.URL(), "IDEM_BIN=" + idemBinary(t), "KAFKA_BROKERS="},
		"chaos", "--unsafe=key", "--json", "--report", path,
		"--orders", "10", "--payments", "20", "--instances", "2", "--kills", "1", "--terms", "0",
		"--broker-restarts", "0", "--drop-rate", "0.2", "--fail-rate", "0", "--seed", "7", "--duration", "5s")
	if code != 1 {
		t.Fatalf("exit %d, want 1\n%s", code, stderr)
	}
	var rep chaos.Report
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
		t.Fatalf("stdout is not one JSON report: %v", err)
	}
	if rep.WorkDir != "" {
		defer os.RemoveAll(rep.WorkDir)
	}
	if rep.Linearizable != "no" || rep.Kills != 1 || len(rep.Violations) == 0 {
		t.Fatalf("linearizable %q, %d kills, %d violations", rep.Linearizable, rep.Kills, len(rep.Violations))
	}
	lin := filepath.Join(dir, chaos.LinearizabilityFile(path))
	if b, err := os.ReadFile(lin); err != nil || !strings.Contains(string(b), "<html") {
		t.Fatalf("porcupine's visualization %s: %v", lin, err)
	}
	ctx := browser(t, path)
	if v := evalT[string](t, ctx, `document.getElementById("verdict").textContent`); v != "FAIL" {
		t.Errorf("verdict %q, want FAIL", v)
	}
	if v := evalT[string](t, ctx, `document.getElementById("linearizable").textContent`); v != "no" {
		t.Errorf("linearizable %q, want no", v)
	}
	if href := evalT[string](t, ctx, `document.getElementById("porcupine").getAttribute("href")`); href != filepath.Base(lin) {
		t.Errorf("the page links %q for the failing history, want %q", href, filepath.Base(lin))
	}
	links := evalT[int](t, ctx, `document.querySelectorAll("#violations a.vlink").length`)
	if links != len(rep.Violations) {
		t.Errorf("%d violation links for %d violations", links, len(rep.Violations))
	}
	dangling := evalT[[]string](t, ctx, `Array.from(document.querySelectorAll("#violations a.vlink")).map(a => a.getAttribute("href")).filter(h => !h.startsWith("#t-") || document.getElementById(h.slice(1)) === null)`)
	if len(dangling) > 0 {
		t.Errorf("violation links to no moment of the timeline: %v", dangling)
	}
	// Following a link lands on its second.
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS(`#violations a.vlink`))); err != nil {
		t.Fatal(err)
	}
	if h := evalT[string](t, ctx, `location.hash`); !strings.HasPrefix(h, "#t-") {
		t.Errorf("after the click the page is at %q", h)
	}
	if n := evalT[int](t, ctx, `document.querySelectorAll("#chart-posts line.mark-kill").length`); n != 1 {
		t.Errorf("%d kills on the timeline, want 1", n)
	}
}

// billing chaos --matrix over one row per axis value (CI's subset; make
// chaos-matrix runs every row): each row runs and passes with linearizable
// yes. Both WAL rows are on brokers other than franz-go: billing ran the
// table relay for kafka-go and NATS whatever OUTBOX_MODE said (the
// kafkago/wal row lost all its events), and the harness refused NATS with
// the WAL outbox.
func TestChaosMatrixSubset(t *testing.T) {
	t.Parallel()
	rows := []string{"franz/table/postgres", "kafkago/wal/redis", "nats/wal/postgres"}
	stdout, stderr, code := runBilling(t, []string{"DATABASE_URL=" + testdb.URL(), "IDEM_BIN=" + idemBinary(t), "KAFKA_BROKERS="},
		"chaos", "--matrix", "--matrix-rows", strings.Join(rows, ","),
		"--orders", "16", "--payments", "8", "--instances", "2", "--kills", "1", "--terms", "1", "--broker-restarts", "0",
		"--duration", "5s", "--seed", "9")
	if code != 0 {
		t.Fatalf("matrix: exit %d\n%s\n%s", code, stdout, stderr)
	}
	t.Log(stdout)
	for _, row := range rows {
		re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(row) + `\s+48\s+1\s+1\s+\d+\s+0\s+yes\s+\d+s\s+PASS$`)
		if !re.MatchString(stdout) {
			t.Errorf("no passing row %s (48 POSTs, 1 kill, 1 term, 0 violations, linearizable yes) in\n%s", row, stdout)
		}
	}
	// A skipped row ends its table line with "skipped" (the reports'
	// "redeliveries skipped" is not one).
	if regexp.MustCompile(`(?m)^[a-z]+/[a-z]+/[a-z]+\s.*\sskipped$`).MatchString(stdout) {
		t.Errorf("a row was skipped:\n%s", stdout)
	}
}
