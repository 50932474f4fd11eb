package bench

import (
	"encoding/xml"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

func wellFormed(t *testing.T, svg []byte) {
	t.Helper()
	d := xml.NewDecoder(strings.NewReader(string(svg)))
	for {
		_, err := d.Token()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v\n%s", err, svg)
		}
	}
}

func chartResult(i int, driver, profile string, prefill, decode float64) Result {
	at := time.Date(2026, 1, 1+i, 12, 0, 0, 0, time.UTC)
	return Result{SchemaVersion: 1, ID: NewID(at, profile), Status: StatusOK, StartedAt: at,
		Fingerprint: Fingerprint{Driver: driver, Profile: profile, Backend: "ollama", BackendVersion: "0.17.4"},
		Prefill:     []Prefill{{TargetTokens: 2048, TokS: NewStat([]float64{prefill})}},
		Decode:      []Decode{{Tokens: 128, TokS: NewStat([]float64{decode})}, {Tokens: 512, TokS: NewStat([]float64{decode * 0.95})}}}
}

func TestChartSVG(t *testing.T) {
	// The reference box: driver 535 → 610 made prefill 3.5× faster (732 →
	// 2545 tok/s) and decode 24 % faster.
	rs := []Result{
		chartResult(2, "535.104.05", "llama", 740, 80),
		chartResult(0, "535.104.05", "llama", 732, 81),
		chartResult(1, "535.104.05", "llama", 735, 80),
		chartResult(3, "610.43.02", "llama", 2545, 100),
		chartResult(4, "610.43.02", `<script>alert(1)</script>`, 2550, 101),
		{SchemaVersion: 1, ID: "20260110T000000Z-failed", Status: StatusFailed}, // no figures: left out
	}
	svg := ChartSVG(rs)
	wellFormed(t, svg)
	s := string(svg)
	for _, want := range []string{
		"prefill tok/s", "decode tok/s", "2048 prompt tokens", "128 tokens", "512 tokens",
		"535.104.05 · llama", "610.43.02 · llama", // point labels: driver · profile
		"driver 535.104.05 → 610.43.02", // the step is marked
		"&lt;script&gt;",
		"2026-01-01 12:00",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("chart lacks %q", want)
		}
	}
	if strings.Contains(s, "<script>") {
		t.Error("profile name not escaped")
	}
	if n := strings.Count(s, "<circle"); n != 5*3 {
		t.Errorf("%d points, want 15 (5 results × 3 series)", n)
	}
	if n := strings.Count(s, "stroke-dasharray"); n != 2 { // one rule per panel
		t.Errorf("%d driver rules, want 2", n)
	}
	// Points are in time order: the first labelled point is the oldest result.
	if i, j := strings.Index(s, "20260101T120000Z"), strings.Index(s, "20260102T120000Z"); i < 0 || j < 0 || i > j {
		t.Error("results not in start order")
	}

	empty := ChartSVG(nil)
	wellFormed(t, empty)
	if !strings.Contains(string(empty), "no bench results yet") {
		t.Errorf("empty chart: %s", empty)
	}
}

func TestNiceScale(t *testing.T) {
	for _, c := range []struct{ v, max, step float64 }{{2545, 3000, 500}, {101, 120, 20}, {0.3, 0.35, 0.05}, {0, 1, 0.25}} {
		m, s := niceScale(c.v)
		if !near(m, c.max, 1e-9) || !near(s, c.step, 1e-9) || m < c.v {
			t.Errorf("niceScale(%v) = %v, %v; want %v, %v", c.v, m, s, c.max, c.step)
		}
	}
}
