package chaos

import (
	"fmt"
	"html"
	"io"
	"path/filepath"
	"sort"
	"strings"
)

// RunConfig is what a run was given, enough to repeat it (Command).
type RunConfig struct {
	Seed            int64    `json:"seed"`
	Broker          string   `json:"broker"`
	OutboxMode      string   `json:"outbox_mode"`
	DataLayer       string   `json:"data_layer"`
	Orders          int      `json:"orders"`
	Payments        int      `json:"payments"`
	Instances       int      `json:"instances"`
	Concurrency     int      `json:"concurrency"`
	Kills           int      `json:"kills"`
	Terms           int      `json:"terms"`
	BrokerRestarts  int      `json:"broker_restarts"`
	PGRestarts      int      `json:"pg_restarts"`
	NetCuts         int      `json:"net_cuts"`
	DropRate        float64  `json:"drop_rate"`
	FailRate        float64  `json:"fail_rate"`
	DeclineRate     float64  `json:"decline_rate"`
	ProduceFailRate float64  `json:"produce_fail_rate"`
	DuplicateRate   float64  `json:"duplicate_rate"`
	ClientDropRate  float64  `json:"client_drop_rate"`
	LoadDuration    string   `json:"load_duration"`
	Quiescence      string   `json:"quiescence"`
	Failpoints      bool     `json:"failpoints"`
	FailpointHits   int      `json:"failpoint_hits,omitempty"`
	Unsafe          string   `json:"unsafe,omitempty"`
	Env             []string `json:"env,omitempty"`
	// Command is the billing chaos command line of this run.
	Command string `json:"command"`
}

func runConfig(c *Config) RunConfig {
	rc := RunConfig{
		Seed: c.Seed, Broker: c.brokerName(), OutboxMode: c.OutboxMode, DataLayer: c.DataLayer, Orders: c.Orders, Payments: c.Payments,
		Instances: c.Instances, Concurrency: c.Concurrency, Kills: c.Kills, Terms: c.Terms,
		BrokerRestarts: c.BrokerRestarts, PGRestarts: c.PGRestarts, NetCuts: c.NetCuts,
		DropRate: c.DropRate, FailRate: c.FailRate, DeclineRate: c.DeclineRate, ProduceFailRate: c.ProduceFailRate,
		DuplicateRate: c.DuplicateRate, ClientDropRate: c.ClientDropRate,
		LoadDuration: c.LoadDuration.String(), Quiescence: c.Quiescence.String(),
		Failpoints: c.Failpoints, Unsafe: c.Unsafe,
	}
	if c.Failpoints {
		rc.FailpointHits = c.FailpointHits
	}
	for _, kv := range c.Env {
		// Only the mode knobs: a store URL names a server of this machine.
		if k, _, _ := strings.Cut(kv, "="); k == "IDEMPOTENCY_STORE" || k == "KAFKA_CLIENT" {
			rc.Env = append(rc.Env, kv)
		}
	}
	broker := c.Broker
	if broker == "" {
		broker = BrokerKafka
	}
	cmd := fmt.Sprintf("billing chaos --seed %d --broker %s --outbox-mode %s --data-layer %s --orders %d --payments %d --instances %d --concurrency %d"+
		" --kills %d --terms %d --broker-restarts %d --pg-restarts %d --net-cuts %d"+
		" --drop-rate %g --fail-rate %g --decline-rate %g --produce-fail-rate %g --duration %v --quiescence %v",
		c.Seed, broker, c.OutboxMode, c.DataLayer, c.Orders, c.Payments, c.Instances, c.Concurrency,
		c.Kills, c.Terms, c.BrokerRestarts, c.PGRestarts, c.NetCuts,
		c.DropRate, c.FailRate, c.DeclineRate, c.ProduceFailRate, c.LoadDuration, c.Quiescence)
	if c.Failpoints {
		cmd += fmt.Sprintf(" --failpoints --failpoint-hits %d", c.FailpointHits)
	}
	if c.Unsafe != "" {
		cmd += " --unsafe=" + c.Unsafe
	}
	if strings.HasPrefix(rc.Broker, "kafka/") {
		cmd = "KAFKA_CLIENT=" + strings.TrimPrefix(rc.Broker, "kafka/") + " " + cmd
	}
	rc.Command = cmd
	return rc
}

// markColors are the timeline's colours per mark kind.
var markColors = map[string]string{
	"kill": "#d62728", "term": "#ff7f0e", "restart": "#2ca02c", "broker": "#9467bd",
	"pg": "#8c564b", "net": "#e377c2", "failpoint": "#17becf", "exit": "#7f7f7f",
}

var markNames = []struct{ kind, name string }{
	{"kill", "SIGKILL"}, {"term", "SIGTERM"}, {"restart", "restart"}, {"broker", "broker restart"},
	{"pg", "PostgreSQL crash"}, {"net", "net cut"}, {"failpoint", "failpoint hit"}, {"exit", "exit on its own"},
}

// WriteHTML writes the report as one self-contained HTML page: the
// verdict, the violations (each linked to its second on the timeline),
// the timeline of the run in inline SVG and the configuration. lin is the
// file name of porcupine's visualization beside the page ("" for none).
func (r *Report) WriteHTML(w io.Writer, lin string) error {
	var b strings.Builder
	e := html.EscapeString
	verdict, cls := "PASS", "pass"
	switch {
	case r.Pass && r.Unsafe != "":
		verdict, cls = "INCONCLUSIVE", "fail"
	case !r.Pass:
		verdict, cls = "FAIL", "fail"
	}
	fmt.Fprintf(&b, `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>billing chaos: %s, seed %d</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;max-width:1400px}
h1{margin:.2em 0}.pass{color:#1a7f37}.fail{color:#cf222e}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px;text-align:left;vertical-align:top}
code{background:#f4f4f4;padding:1px 4px}svg{display:block;margin:.3em 0 1em}
.chart text{font-size:11px;fill:#555}.legend span{display:inline-block;margin-right:1em}
.sw{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:middle}
#hover{position:fixed;background:#fff;border:1px solid #888;padding:2px 6px;font-size:12px;display:none;pointer-events:none}
</style></head><body>
`, verdict, r.Seed)
	fmt.Fprintf(&b, "<h1 id=\"verdict\" class=\"%s\">%s</h1>\n", cls, verdict)
	lz := r.Linearizable
	if lz == "" {
		lz = "not checked"
	}
	fmt.Fprintf(&b, "<p>seed %d, %s, outbox %s%s · %d POSTs answered in %d requests · linearizable: <b id=\"linearizable\">%s</b>",
		r.Seed, e(r.Broker), e(r.Config.OutboxMode), unsafeNote(r.Unsafe), r.Operations, r.Requests, e(lz))
	if l := r.Linearizability; l != nil {
		fmt.Fprintf(&b, " (%d attempts of %d keys)", l.Ops, l.Keys)
		if lin != "" {
			fmt.Fprintf(&b, ` · <a id="porcupine" href="%s">the smallest failing key history (%s), visualized</a>`, e(lin), e(l.FailingKey))
		}
	}
	b.WriteString("</p>\n")

	// Violations.
	fmt.Fprintf(&b, "<h2>Violations (%d)</h2>\n", len(r.Violations))
	if len(r.Violations) == 0 {
		b.WriteString("<p>none</p>\n")
	} else {
		b.WriteString("<table id=\"violations\"><tr><th>at</th><th>kind</th><th>subject</th><th>detail</th></tr>\n")
		for _, v := range r.Violations {
			fmt.Fprintf(&b, "<tr><td><a class=\"vlink\" href=\"#t-%d\">%.1fs</a></td><td>%s</td><td>%s</td><td>%s</td></tr>\n",
				r.second(v.At), v.At, e(v.Kind), e(v.Subject), e(v.Detail))
		}
		b.WriteString("</table>\n")
	}
	if l := r.Linearizability; l != nil && len(l.Failing) > 0 {
		fmt.Fprintf(&b, "<h3>Smallest failing key history: %s</h3>\n<ol>", e(l.FailingKey))
		for _, line := range describeHistory(l.Failing) {
			fmt.Fprintf(&b, "<li><code>%s</code></li>", e(line))
		}
		b.WriteString("</ol>\n")
	}

	// Faults and times.
	b.WriteString("<h2>Faults and times</h2>\n<table>\n")
	fmt.Fprintf(&b, "<tr><th>instances</th><td>%d SIGKILL, %d SIGTERM (%d unclean), %d restarts (%d start retries), %d exits on their own</td></tr>\n",
		r.Kills, r.Terms, r.UncleanTerms, r.Restarts, r.StartRetries, r.SelfExits)
	fmt.Fprintf(&b, "<tr><th>infrastructure</th><td>%d broker restarts, %d PostgreSQL crashes, %d net cuts (%d connections reset)</td></tr>\n",
		r.BrokerRestarts, r.PGRestarts, r.NetCuts, r.NetCutConns)
	if f := r.Failpoints; f != nil {
		var hit []string
		for _, name := range sortedKeys(f.Hits) {
			if f.Hits[name] > 0 {
				hit = append(hit, fmt.Sprintf("%s %d", name, f.Hits[name]))
			}
		}
		missed := "none"
		if len(f.Missed) > 0 {
			missed = strings.Join(f.Missed, ", ")
		}
		fmt.Fprintf(&b, "<tr><th>failpoint windows hit</th><td id=\"fp-hit\">%s</td></tr>\n<tr><th>missed (fewer than %d hits)</th><td id=\"fp-missed\">%s</td></tr>\n",
			e(strings.Join(hit, ", ")), f.Target, e(missed))
	}
	fmt.Fprintf(&b, "<tr><th>times</th><td>load %.1fs, quiescence %.1fs; the idle ledger watched %.1fs (longest redelivery timer %s, %d late changes)</td></tr>\n",
		r.LoadSeconds, r.QuiescenceSeconds, r.LedgerWatchSeconds, e(r.LongestTimer), r.LedgerLateChanges)
	fmt.Fprintf(&b, "<tr><th>answers</th><td>%d retries, %d dropped by the client, %d concurrent duplicates, %d transport errors, %d 5xx; p50 %.1f ms, p99 %.1f ms</td></tr>\n",
		r.ClientRetries, r.ClientDrops, r.Duplicates, r.TransportErrors, r.Status5xx, r.LatencyP50Ms, r.LatencyP99Ms)
	if m := r.Memory; m != nil {
		fmt.Fprintf(&b, "<tr><th>billing serve memory</th><td id=\"billing-rss\" data-peak-rss-bytes=\"%d\">%s</td></tr>\n", m.PeakRSSBytes, e(m.describe()))
	}
	fmt.Fprintf(&b, "<tr><th>audit</th><td>%d confirmed orders + %d payments: %d CHARGED, %d FAILED; %d ledger charges, %d declines; %d outbox events of %d aggregates against %d records</td></tr>\n</table>\n",
		r.ConfirmedOrders, r.AcceptedPayments, r.Charged, r.Failed, r.LedgerCharges, r.LedgerDeclines, r.KafkaEvents, r.KafkaAggregates, r.KafkaRecords)

	if tl := r.Timeline; tl != nil {
		r.writeTimeline(&b, tl)
	}

	// Configuration.
	c := r.Config
	b.WriteString("<h2>Configuration</h2>\n<p>Repeat with <code id=\"command\">" + e(c.Command) + "</code>")
	if len(c.Env) > 0 {
		b.WriteString(" and billing's environment <code>" + e(strings.Join(c.Env, " ")) + "</code>")
	}
	b.WriteString("</p>\n<table>")
	rows := [][2]string{
		{"seed", fmt.Sprint(c.Seed)}, {"broker", c.Broker}, {"outbox", c.OutboxMode}, {"data layer", c.DataLayer},
		{"sizes", fmt.Sprintf("%d orders, %d payments, %d instances, %d workers, load over %s, quiescence up to %s", c.Orders, c.Payments, c.Instances, c.Concurrency, c.LoadDuration, c.Quiescence)},
		{"faults", fmt.Sprintf("%d kills, %d terms, %d broker restarts, %d PostgreSQL crashes, %d net cuts, failpoints %v (%d hits each)", c.Kills, c.Terms, c.BrokerRestarts, c.PGRestarts, c.NetCuts, c.Failpoints, c.FailpointHits)},
		{"rates", fmt.Sprintf("paysim drop %g, fail %g, decline %g; produce fail %g; client duplicate %g, drop %g", c.DropRate, c.FailRate, c.DeclineRate, c.ProduceFailRate, c.DuplicateRate, c.ClientDropRate)},
		{"unsafe", orNone(c.Unsafe)},
	}
	for _, row := range rows {
		fmt.Fprintf(&b, "<tr><th>%s</th><td>%s</td></tr>", e(row[0]), e(row[1]))
	}
	b.WriteString("</table>\n<div id=\"hover\"></div>\n")
	// Hover: the title of the element under the pointer, at once.
	b.WriteString(`<script>
var h=document.getElementById("hover");
document.addEventListener("mousemove",function(ev){var t=ev.target.closest("[data-tip]");
if(!t){h.style.display="none";return}h.textContent=t.getAttribute("data-tip");h.style.display="block";
h.style.left=(ev.clientX+12)+"px";h.style.top=(ev.clientY+12)+"px"});
</script>
</body></html>
`)
	_, err := io.WriteString(w, b.String())
	return err
}

func unsafeNote(u string) string {
	if u == "" {
		return ""
	}
	return ", UNSAFE: " + html.EscapeString(u) + " protection off"
}

func orNone(s string) string {
	if s == "" {
		return "none (all protections on)"
	}
	return s
}

// second is the timeline second of a moment, within the timeline.
func (r *Report) second(at float64) int {
	n := 0
	if r.Timeline != nil {
		n = len(r.Timeline.Seconds) - 1
	}
	return min(max(int(at), 0), max(n, 0))
}

const (
	chartW  = 1200.0 // plot width
	chartH  = 110.0  // plot height
	chartL  = 50.0   // left margin (axis labels)
	chartHd = 16.0   // top margin (title)
)

// series is one line or bar set of a chart.
type chartSeries struct {
	name, color string
	v           []float64 // per second; < 0: unknown
	bars        bool
}

// writeTimeline writes the charts, one below the other on one time axis,
// with every mark drawn across each, and one anchor per second (t-N).
func (r *Report) writeTimeline(b *strings.Builder, tl *Timeline) {
	n := len(tl.Seconds)
	if n == 0 {
		return
	}
	col := chartW / float64(n)
	x := func(t float64) float64 { return chartL + t*col }
	b.WriteString("<h2 id=\"timeline\">Timeline</h2>\n<p class=\"legend\">")
	for _, m := range markNames {
		fmt.Fprintf(b, "<span><i class=\"sw\" style=\"background:%s\"></i>%s</span>", markColors[m.kind], m.name)
	}
	fmt.Fprintf(b, "</p><p>load %.0fs–%.0fs, quiescence until %.0fs; hover a mark or a second for details.</p>\n", tl.LoadStart, tl.LoadEnd, tl.QuiescenceEnd)

	get := func(f func(s Second) float64) []float64 {
		v := make([]float64, n)
		for i, s := range tl.Seconds {
			v[i] = f(s)
		}
		return v
	}
	charts := []struct {
		id, title string
		series    []chartSeries
	}{
		{"posts", "POST attempts per second (stacked)", []chartSeries{
			{"fresh", "#1f77b4", get(func(s Second) float64 { return float64(s.Fresh) }), true},
			{"retried", "#ff7f0e", get(func(s Second) float64 { return float64(s.Retried) }), true},
			{"duplicate at once", "#9467bd", get(func(s Second) float64 { return float64(s.Duplicate) }), true},
			{"reuse probes", "#bcbd22", get(func(s Second) float64 { return float64(s.Probes) }), true},
		}},
		{"latency", "POST latency, ms (retries included)", []chartSeries{
			{"p50", "#2ca02c", get(func(s Second) float64 { return nonzero(s.P50Ms) }), false},
			{"p99", "#d62728", get(func(s Second) float64 { return nonzero(s.P99Ms) }), false},
		}},
		{"errors", "failed answers per second (stacked)", []chartSeries{
			{"5xx", "#d62728", get(func(s Second) float64 { return float64(s.Status5xx) }), true},
			{"no answer", "#7f7f7f", get(func(s Second) float64 { return float64(s.NoAnswer) }), true},
			{"dropped by the client", "#bcbd22", get(func(s Second) float64 { return float64(s.Dropped) }), true},
		}},
		{"pipeline", "outbox backlog and consumer lag (records)", r.pipelineSeries(tl, get)},
		{"charges", "charges per second at paysim", []chartSeries{
			{"charges", "#1a7f37", get(func(s Second) float64 { return s.Charges }), true},
		}},
	}
	for ci, ch := range charts {
		h := chartHd + chartH + 18
		fmt.Fprintf(b, `<svg class="chart" id="chart-%s" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" xmlns="http://www.w3.org/2000/svg">`,
			ch.id, chartL+chartW+10, h, chartL+chartW+10, h)
		fmt.Fprintf(b, `<text x="%.0f" y="12" style="font-weight:bold;fill:#222">%s</text>`, chartL, html.EscapeString(ch.title))
		lx := chartL + 330
		for _, s := range ch.series {
			fmt.Fprintf(b, `<rect x="%.0f" y="3" width="10" height="10" fill="%s"/><text x="%.0f" y="12">%s</text>`, lx, s.color, lx+13, html.EscapeString(s.name))
			lx += 20 + 7*float64(len(s.name))
		}
		top := 0.0
		stacked := len(ch.series) > 0 && ch.series[0].bars
		for i := range n {
			if stacked {
				sum := 0.0
				for _, s := range ch.series {
					sum += max(s.v[i], 0)
				}
				top = max(top, sum)
			} else {
				for _, s := range ch.series {
					top = max(top, s.v[i])
				}
			}
		}
		top = niceCeil(top)
		y := func(v float64) float64 { return chartHd + chartH - v/top*chartH }
		fmt.Fprintf(b, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="#999"/>`, chartL, y(0), chartL+chartW, y(0))
		fmt.Fprintf(b, `<text x="%.0f" y="%.1f" text-anchor="end">%s</text><text x="%.0f" y="%.1f" text-anchor="end">0</text>`,
			chartL-4, y(top)+4, fmtNum(top), chartL-4, y(0))
		if stacked {
			base := make([]float64, n)
			for _, s := range ch.series {
				for i, v := range s.v {
					if v <= 0 {
						continue
					}
					fmt.Fprintf(b, `<rect x="%.2f" y="%.2f" width="%.2f" height="%.2f" fill="%s"/>`,
						x(float64(i)), y(base[i]+v), max(col-0.3, 0.3), y(base[i])-y(base[i]+v), s.color)
					base[i] += v
				}
			}
		} else {
			for _, s := range ch.series {
				var pts []string
				flush := func() {
					if len(pts) > 0 {
						fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`, s.color, strings.Join(pts, " "))
					}
					pts = pts[:0]
				}
				for i, v := range s.v {
					if v < 0 {
						flush()
						continue
					}
					pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(float64(i)+0.5), y(v)))
				}
				flush()
			}
		}
		// Seconds ticks along the axis.
		step := niceStep(float64(n) / 12)
		for t := 0.0; t < float64(n); t += step {
			fmt.Fprintf(b, `<text x="%.1f" y="%.0f" text-anchor="middle">%.0fs</text>`, x(t), chartHd+chartH+14, t)
		}
		// Load and quiescence.
		for _, p := range []struct {
			at    float64
			label string
		}{{tl.LoadStart, "load starts"}, {tl.LoadEnd, "load ends"}, {tl.QuiescenceEnd, "quiescent"}} {
			if p.at > 0 {
				fmt.Fprintf(b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#000" stroke-dasharray="4 3" data-tip="%s at %.1fs"/>`,
					x(p.at), chartHd, x(p.at), chartHd+chartH, p.label, p.at)
			}
		}
		// One hover column per second: the first chart's are the anchors.
		for i, s := range tl.Seconds {
			tip := fmt.Sprintf("%ds: %d fresh, %d retried, %d duplicate; p50 %.0f ms, p99 %.0f ms; %d 5xx, %d unanswered, %d dropped",
				s.T, s.Fresh, s.Retried, s.Duplicate, s.P50Ms, s.P99Ms, s.Status5xx, s.NoAnswer, s.Dropped)
			if s.OutboxBacklog >= 0 {
				tip += fmt.Sprintf("; outbox backlog %.0f", s.OutboxBacklog)
			}
			for gi, l := range s.Lag {
				if gi < len(tl.Groups) {
					tip += fmt.Sprintf("; %s lag %d", tl.Groups[gi], l)
				}
			}
			if s.Charges >= 0 {
				tip += fmt.Sprintf("; %.0f charges", s.Charges)
			}
			id := ""
			if ci == 0 {
				id = fmt.Sprintf(` id="t-%d"`, i)
			}
			fmt.Fprintf(b, `<rect%s class="sec" x="%.2f" y="%.0f" width="%.2f" height="%.0f" fill="transparent" data-tip="%s"><title>%s</title></rect>`,
				id, x(float64(i)), chartHd, col, chartH, html.EscapeString(tip), html.EscapeString(tip))
		}
		// The marks, over everything.
		for mi, m := range tl.Marks {
			tip := fmt.Sprintf("%.1fs %s", m.At, m.Label)
			id := ""
			if ci == 0 {
				id = fmt.Sprintf(` id="mark-%d"`, mi)
			}
			fmt.Fprintf(b, `<line%s class="mark mark-%s" x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="%s" stroke-width="2" data-tip="%s"><title>%s</title></line>`,
				id, m.Kind, x(m.At), chartHd, x(m.At), chartHd+chartH, markColors[m.Kind], html.EscapeString(tip), html.EscapeString(tip))
		}
		b.WriteString("</svg>\n")
	}
	// The marks as a list too, for search and for people without a mouse.
	b.WriteString("<details><summary>every mark</summary><ul>")
	marks := append([]Mark(nil), tl.Marks...)
	sort.SliceStable(marks, func(i, j int) bool { return marks[i].At < marks[j].At })
	for _, m := range marks {
		fmt.Fprintf(b, "<li><a href=\"#t-%d\">%.1fs</a> %s</li>", r.second(m.At), m.At, html.EscapeString(m.Label))
	}
	b.WriteString("</ul></details>\n")
}

func (r *Report) pipelineSeries(tl *Timeline, get func(func(Second) float64) []float64) []chartSeries {
	out := []chartSeries{{"outbox backlog", "#1f77b4", get(func(s Second) float64 { return s.OutboxBacklog }), false}}
	colors := []string{"#ff7f0e", "#2ca02c", "#9467bd"}
	for gi, g := range tl.Groups {
		out = append(out, chartSeries{g + " lag", colors[gi%len(colors)], get(func(s Second) float64 {
			if gi < len(s.Lag) {
				return float64(s.Lag[gi])
			}
			return -1
		}), false})
	}
	return out
}

// nonzero maps 0 (no POST ended in the second) to unknown.
func nonzero(v float64) float64 {
	if v == 0 {
		return -1
	}
	return v
}

func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := 1.0
	for p*10 <= v {
		p *= 10
	}
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func niceStep(v float64) float64 {
	for _, s := range []float64{1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1200} {
		if s >= v {
			return s
		}
	}
	return 3600
}

func fmtNum(v float64) string {
	if v >= 1000 {
		return fmt.Sprintf("%.0fk", v/1000)
	}
	return fmt.Sprintf("%g", v)
}

// LinearizabilityFile is the name of porcupine's visualization written
// beside an HTML report at path.
func LinearizabilityFile(path string) string {
	ext := filepath.Ext(path)
	return strings.TrimSuffix(filepath.Base(path), ext) + ".linearizability.html"
}
