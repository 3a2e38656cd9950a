package main

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/idemkit/idem/internal/testdb"
)

// svgCircle is a point of a scale SVG as the bench writes it.
type svgCircle struct {
	CX, CY float64
	Size   int
	Ops    float64
}

// parseScaleSVG reads data as XML (failing on anything malformed), checks
// the root is an <svg> with a polyline, and returns its points.
func parseScaleSVG(t *testing.T, data []byte) []svgCircle {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(data))
	var (
		circles  []svgCircle
		root     string
		polyline bool
	)
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v\n%s", err, data)
		}
		se, ok := tok.(xml.StartElement)
		if !ok {
			continue
		}
		if root == "" {
			root = se.Name.Local
			if se.Name.Space != "http://www.w3.org/2000/svg" {
				t.Errorf("root namespace %q", se.Name.Space)
			}
		}
		switch se.Name.Local {
		case "polyline":
			polyline = true
		case "circle":
			var c svgCircle
			for _, a := range se.Attr {
				var err error
				switch a.Name.Local {
				case "cx":
					c.CX, err = strconv.ParseFloat(a.Value, 64)
				case "cy":
					c.CY, err = strconv.ParseFloat(a.Value, 64)
				case "data-size":
					c.Size, err = strconv.Atoi(a.Value)
				case "data-ops":
					c.Ops, err = strconv.ParseFloat(a.Value, 64)
				}
				if err != nil {
					t.Fatalf("circle attribute %s=%q: %v", a.Name.Local, a.Value, err)
				}
			}
			circles = append(circles, c)
		}
	}
	if root != "svg" || !polyline {
		t.Fatalf("root %q, polyline %v: not a scale curve\n%s", root, polyline, data)
	}
	return circles
}

// TestScaleSVG draws a known curve and checks the picture: well-formed,
// one point per size at the right place (x grows with the size, y falls
// as ops/s grow, inside the plot), text escaped.
func TestScaleSVG(t *testing.T) {
	t.Parallel()
	pts := []scalePoint{{0, 1000, 1}, {1_000_000, 950, 0.95}, {10_000_000, 500, 0.5}}
	data := scaleSVG("a<b&c", "ops/s", pts)
	got := parseScaleSVG(t, data)
	if len(got) != len(pts) {
		t.Fatalf("%d circles, want %d", len(got), len(pts))
	}
	plotBottom, plotRight := float64(svgH-svgBott), float64(svgW-svgRight)
	for i, c := range got {
		if c.Size != pts[i].Size || c.Ops != pts[i].OpsPerSec {
			t.Errorf("point %d: data %d/%v, want %d/%v", i, c.Size, c.Ops, pts[i].Size, pts[i].OpsPerSec)
		}
		if c.CX < svgLeft || c.CX > plotRight || c.CY < svgTop || c.CY > plotBottom {
			t.Errorf("point %d at (%v, %v): outside the plot", i, c.CX, c.CY)
		}
	}
	if got[0].CX != svgLeft || got[2].CX != plotRight {
		t.Errorf("x of the first and last sizes: %v, %v; want the plot's edges %v, %v", got[0].CX, got[2].CX, float64(svgLeft), plotRight)
	}
	// 1 M of 10 M is a tenth of the way along.
	if want := svgLeft + (plotRight-svgLeft)/10; got[1].CX < want-0.1 || got[1].CX > want+0.1 {
		t.Errorf("x of 1 M: %v, want %v", got[1].CX, want)
	}
	if !(got[0].CY < got[1].CY && got[1].CY < got[2].CY) {
		t.Errorf("y does not follow ops/s: %v %v %v", got[0].CY, got[1].CY, got[2].CY)
	}
	if !bytes.Contains(data, []byte("a&lt;b&amp;c")) || !bytes.Contains(data, []byte("(0.95)")) {
		t.Errorf("title not escaped or ratio label missing:\n%s", data)
	}
	// One point alone is drawn too, in the middle.
	if one := parseScaleSVG(t, scaleSVG("x", "ops/s", pts[:1])); len(one) != 1 {
		t.Errorf("one point: %d circles", len(one))
	}
}

// TestBenchScaleJSON runs the scenario end to end with tiny sizes against
// PostgreSQL: every curve at every size, each purge deleting exactly the
// expired rows, ratios to the empty size, one well-formed SVG per curve
// carrying the results' figures, the scratch schemas gone afterwards, and
// bad --sizes rejected with exit status 2.
func TestBenchScaleJSON(t *testing.T) {
	t.Parallel()
	db := testdb.New(t, testdb.Empty())
	dir := t.TempDir()
	stdout, stderr, code := runIdem(t, []string{"DATABASE_URL=" + db.URL}, "bench", "scale", "--json",
		"--sizes", "0,2000", "--seconds", "1", "--clients", "4", "--events", "1500", "--purge-rows", "700", "--svg", dir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var out struct {
		Scenario string        `json:"scenario"`
		Results  []benchResult `json:"results"`
	}
	if err := json.Unmarshal([]byte(stdout), &out); err != nil {
		t.Fatalf("stdout is not one JSON object: %v\n%s", err, stdout)
	}
	if out.Scenario != "scale" || len(out.Results) != 2*len(benchScaleCurves) {
		t.Fatalf("unexpected results: %+v", out)
	}
	byName := map[string]benchResult{}
	for _, r := range out.Results {
		byName[r.Name] = r
	}
	for _, c := range benchScaleCurves {
		for _, size := range []int{0, 2000} {
			r, ok := byName[scaleName(c, size)]
			if !ok {
				t.Fatalf("no result %s", scaleName(c, size))
			}
			if r.OpsPerSec <= 0 || r.Ratio <= 0 || r.P99Ms < r.P50Ms {
				t.Errorf("%s: %+v", r.Name, r)
			}
			switch c {
			case "relay":
				if r.Ops != 1500 {
					t.Errorf("%s: %d events, want 1500", r.Name, r.Ops)
				}
			case "purge-idempotency", "purge-outbox", "purge-inbox":
				if r.Ops != 700 {
					t.Errorf("%s: %d rows deleted, want 700", r.Name, r.Ops)
				}
			}
			if size == 0 && r.Ratio != 1 {
				t.Errorf("%s: ratio %v, want 1 (the base)", r.Name, r.Ratio)
			}
		}
		data, err := os.ReadFile(filepath.Join(dir, "scale-"+c+".svg"))
		if err != nil {
			t.Fatal(err)
		}
		pts := parseScaleSVG(t, data)
		if len(pts) != 2 {
			t.Fatalf("%s: %d points, want 2", c, len(pts))
		}
		for i, size := range []int{0, 2000} {
			want := byName[scaleName(c, size)].OpsPerSec
			if pts[i].Size != size || pts[i].Ops < want-0.5 || pts[i].Ops > want+0.5 {
				t.Errorf("%s point %d: %d rows %v ops/s, want %d rows %v", c, i, pts[i].Size, pts[i].Ops, size, want)
			}
		}
	}
	var left int
	if err := db.Pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'bench_scale_%'`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d scratch schemas left behind", left)
	}
	for _, bad := range []string{"", "x", "0,-1", "1000,10", "0,0"} {
		if _, stderr, code := runIdem(t, nil, "bench", "scale", "--sizes", bad); code != 2 {
			t.Errorf("--sizes %q: exit %d (%s), want 2", bad, code, stderr)
		}
	}
}
