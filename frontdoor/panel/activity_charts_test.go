package panel

import (
	"strings"
	"testing"
	"time"

	"gpuhost/internal/activity"
)

// TestBuildCharts: an hour of samples becomes at most maxPoints points a
// chart; a sample without the GPU breaks the GPU lines (not the rate
// lines); a switch is a band inside the chart, a running one reaching now.
func TestBuildCharts(t *testing.T) {
	to := time.Date(2025, 1, 1, 13, 0, 0, 0, time.UTC)
	w := activity.Window{From: to.Add(-time.Hour), To: to, Interval: 2 * time.Second}
	for i := range 1800 {
		s := activity.Sample{Time: w.From.Add(time.Duration(i+1) * 2 * time.Second), GPU: true, UsedMiB: 12288, TotalMiB: 24576,
			UtilPct: 50, PowerW: 200, TempC: 60, RequestsPerS: 1, TokensPerS: 100}
		if i >= 900 && i < 910 { // 20 s without the GPU: one whole bucket and more
			s = activity.Sample{Time: s.Time, RequestsPerS: 1, TokensPerS: 100}
		}
		w.Samples = append(w.Samples, s)
	}
	w.Switches = []activity.Switch{
		{ID: "a", Profile: "llama", Start: to.Add(-30 * time.Minute), End: to.Add(-29 * time.Minute), Status: "done"},
		{ID: "b", Profile: "coder", Start: to.Add(-time.Second), Status: "started"},
	}
	cv := buildCharts(w, "1h")
	if len(cv.Charts) != len(metrics) || cv.Samples != 1800 {
		t.Fatalf("%d charts, %d samples", len(cv.Charts), cv.Samples)
	}
	for _, ch := range cv.Charts {
		points := strings.Count(ch.Line, "M") + strings.Count(ch.Line, "L")
		if points > maxPoints || points < maxPoints/2 {
			t.Errorf("%s: %d points, want at most %d", ch.ID, points, maxPoints)
		}
		pieces := strings.Count(ch.Line, "M")
		gpu := ch.ID != "rps" && ch.ID != "tps"
		if gpu && pieces != 2 || !gpu && pieces != 1 {
			t.Errorf("%s: %d pieces, want %d", ch.ID, pieces, map[bool]int{true: 2, false: 1}[gpu])
		}
	}
	vram := cv.Charts[0]
	if vram.ID != "vram" || vram.Now != "12.0 GiB" || vram.Top != "of 24.0 GiB" || vram.Ref == "" {
		t.Errorf("vram chart %+v", vram)
	}
	if len(cv.Switches) != 2 || cv.Switches[0].X != "300.0" || cv.Switches[0].W != "10.0" || cv.Switches[0].Class != "mark mark-done" {
		t.Errorf("done switch %+v", cv.Switches[0])
	}
	if b := cv.Switches[1]; b.Status != "running" || b.X != "598.0" || b.W != "2.0" {
		t.Errorf("running switch %+v", b)
	}
	if empty := buildCharts(activity.Window{From: w.From, To: to, Interval: 2 * time.Second}, "1h"); empty.Charts[0].Now != "–" || empty.Charts[0].Line != "" {
		t.Errorf("empty window %+v", empty.Charts[0])
	}
}
