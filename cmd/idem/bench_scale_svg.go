package main

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"math"
	"strconv"
)

// scalePoint is one measured size of a curve.
type scalePoint struct {
	Size      int
	OpsPerSec float64
	// Ratio is OpsPerSec over the curve's first point (0: none).
	Ratio float64
}

// The SVG's geometry, in user units.
const (
	svgW, svgH                         = 480, 300
	svgLeft, svgRight, svgTop, svgBott = 72, 24, 44, 52
)

// scaleSVG draws one curve as a small self-contained SVG: the axes (ops/s
// from 0 up, retained rows on a linear scale), a tick and a label per
// measured size, the points joined by a line, each point labelled with its
// ratio to the first. Every point is a circle carrying its figures in
// data-size and data-ops, so that a reader (and the test) can check the
// picture against the results.
func scaleSVG(curve, unit string, pts []scalePoint) []byte {
	var b bytes.Buffer
	esc := func(s string) string {
		var e bytes.Buffer
		_ = xml.EscapeText(&e, []byte(s))
		return e.String()
	}
	plotW, plotH := float64(svgW-svgLeft-svgRight), float64(svgH-svgTop-svgBott)
	minX, maxX, maxY := 0, 0, 0.0
	for i, p := range pts {
		if i == 0 || p.Size < minX {
			minX = p.Size
		}
		maxX = max(maxX, p.Size)
		maxY = max(maxY, p.OpsPerSec)
	}
	maxY = svgNiceCeil(maxY * 1.1)
	x := func(size int) float64 {
		if maxX == minX {
			return svgLeft + plotW/2
		}
		return svgLeft + plotW*float64(size-minX)/float64(maxX-minX)
	}
	y := func(v float64) float64 { return svgTop + plotH - plotH*v/maxY }

	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", svgW, svgH, svgW, svgH)
	fmt.Fprintf(&b, "<title>idem bench scale: %s</title>\n", esc(curve))
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", svgW, svgH)
	fmt.Fprintf(&b, `<text x="%d" y="24" font-size="14" font-weight="bold">%s (%s) against retained rows</text>`+"\n", svgLeft, esc(curve), esc(unit))
	// Axes.
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", svgLeft, svgTop, svgLeft, svgH-svgBott)
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", svgLeft, svgH-svgBott, svgW-svgRight, svgH-svgBott)
	for i := 0; i <= 4; i++ {
		v := maxY * float64(i) / 4
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", svgLeft, y(v), svgW-svgRight, y(v))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", svgLeft-6, y(v)+4, svgHuman(v))
	}
	for _, p := range pts {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="black"/>`+"\n", x(p.Size), svgH-svgBott, x(p.Size), svgH-svgBott+5)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x(p.Size), svgH-svgBott+18, svgHuman(float64(p.Size)))
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">retained rows</text>`+"\n", svgLeft+int(plotW)/2, svgH-10)
	// The line, the points, their ratios.
	if len(pts) > 0 {
		b.WriteString(`<polyline fill="none" stroke="#1f77b4" stroke-width="2" points="`)
		for i, p := range pts {
			if i > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, "%.1f,%.1f", x(p.Size), y(p.OpsPerSec))
		}
		b.WriteString("\"/>\n")
	}
	for _, p := range pts {
		fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="4" fill="#1f77b4" data-size="%d" data-ops="%.0f"><title>%d rows: %.0f %s</title></circle>`+"\n",
			x(p.Size), y(p.OpsPerSec), p.Size, p.OpsPerSec, p.Size, p.OpsPerSec, esc(unit))
		label := svgHuman(p.OpsPerSec)
		if p.Ratio > 0 {
			label += " (" + strconv.FormatFloat(p.Ratio, 'f', 2, 64) + ")"
		}
		anchor := "middle"
		switch {
		case len(pts) > 1 && p.Size == minX:
			anchor = "start"
		case len(pts) > 1 && p.Size == maxX:
			anchor = "end"
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="%s">%s</text>`+"\n", x(p.Size), y(p.OpsPerSec)-9, anchor, esc(label))
	}
	b.WriteString("</svg>\n")
	return b.Bytes()
}

// svgNiceCeil rounds v up to 1, 2 or 5 times a power of ten (1 for v ≤ 0).
func svgNiceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// svgHuman writes 0, 950, 2k, 12.5k, 1.5M, 10M.
func svgHuman(v float64) string {
	trim := func(f float64, suffix string) string { return strconv.FormatFloat(f, 'f', -1, 64) + suffix }
	switch {
	case v >= 1e6:
		return trim(math.Round(v/1e5)/10, "M")
	case v >= 1e3:
		return trim(math.Round(v/1e2)/10, "k")
	default:
		return strconv.FormatFloat(math.Round(v), 'f', -1, 64)
	}
}
