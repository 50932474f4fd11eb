package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/promql/parser"
)

// gpuLabels are dcgm-exporter's labels that tell a box's GPUs apart; the
// daemon's per-GPU series carry them too.
var gpuLabels = []string{"gpu", "UUID"}

// perGPU reports whether a series has one value per GPU: the DCGM_FI_*
// series, gpuhost_gpu_memory_held_bytes, and the rules recorded from them
// (per-GPU rules are named instance_gpu…, as their labels are).
func perGPU(name string) bool {
	return strings.HasPrefix(name, "DCGM_FI_") || name == "gpuhost_gpu_memory_held_bytes" ||
		strings.HasPrefix(name, "instance_gpu") || name == "gpuhost:gpu_memory_used:ratio"
}

// selected are the metric names a PromQL node selects.
func selected(n parser.Node) []string {
	var names []string
	parser.Inspect(n, func(node parser.Node, _ []parser.Node) error {
		if vs, ok := node.(*parser.VectorSelector); ok && vs.Name != "" {
			names = append(names, vs.Name)
		}
		return nil
	})
	return names
}

func anyPerGPU(names []string) bool { return slices.ContainsFunc(names, perGPU) }

// keepsGPU reports whether a grouping (by or without) keeps gpu and UUID.
func keepsGPU(grouping []string, without bool) bool {
	for _, l := range gpuLabels {
		if slices.Contains(grouping, l) == without {
			return false
		}
	}
	return true
}

// gpuCheck parses one expression and returns the per-GPU series it keeps
// apart by GPU (under an aggregation by gpu and UUID) and what would mix
// GPUs up: an aggregation over a per-GPU series that drops gpu or UUID, or
// a vector match between per-GPU series that does not match on them.
func gpuCheck(e expr) (byGPU []string, problems []string) {
	ast, err := promql.ParseExpr(substitute(e.text))
	if err != nil {
		return nil, []string{fmt.Sprintf("%s: %q: %v", e.where, e.text, err)}
	}
	parser.Inspect(ast, func(node parser.Node, _ []parser.Node) error {
		switch n := node.(type) {
		case *parser.AggregateExpr:
			names := selected(n.Expr)
			switch {
			case !anyPerGPU(names):
			case n.Op == parser.TOPK || n.Op == parser.BOTTOMK || n.Op == parser.LIMITK || n.Op == parser.LIMIT_RATIO:
				// These keep every label of the series they pick.
			case !keepsGPU(n.Grouping, n.Without):
				problems = append(problems, fmt.Sprintf("%s: %s over a per-GPU series drops gpu or UUID (grouping %v, without %v): %q",
					e.where, n.Op, n.Grouping, n.Without, e.text))
			case !n.Without:
				byGPU = append(byGPU, names...)
			}
		case *parser.BinaryExpr:
			vm := n.VectorMatching
			if vm == nil || !anyPerGPU(selected(n.LHS)) || !anyPerGPU(selected(n.RHS)) {
				return nil
			}
			if (vm.On || len(vm.MatchingLabels) > 0) && !keepsGPU(vm.MatchingLabels, !vm.On) {
				problems = append(problems, fmt.Sprintf("%s: %s between per-GPU series does not match on gpu and UUID (%v): %q",
					e.where, n.Op, vm.MatchingLabels, e.text))
			}
		}
		return nil
	})
	return byGPU, problems
}

// TestGPUCheckCatches: the per-GPU check is not vacuous.
func TestGPUCheckCatches(t *testing.T) {
	tests := []struct {
		text, want, byGPU string
	}{
		{`sum by (instance, gpu, UUID) (gpuhost_gpu_memory_held_bytes{instance=~"$host"})`, "", "gpuhost_gpu_memory_held_bytes"},
		{`sum by (instance) (gpuhost_switches_total)`, "", ""},
		{`DCGM_FI_DEV_FB_USED / (DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE)`, "", ""},
		{`topk(1, DCGM_FI_DEV_GPU_TEMP)`, "", ""},
		{`sum without (unit) (gpuhost_gpu_memory_held_bytes)`, "", ""},
		{`sum by (instance) (DCGM_FI_DEV_FB_USED)`, "drops gpu or UUID", ""},
		{`sum(gpuhost_gpu_memory_held_bytes)`, "drops gpu or UUID", ""},
		{`max by (instance, gpu) (DCGM_FI_DEV_FB_USED)`, "drops gpu or UUID", ""},
		{`sum without (gpu) (DCGM_FI_DEV_POWER_USAGE)`, "drops gpu or UUID", ""},
		{`instance_gpu:gpuhost_gpu_memory_held_bytes:sum / on (instance) DCGM_FI_DEV_FB_USED`, "does not match on gpu and UUID", ""},
		{`DCGM_FI_DEV_FB_USED / ignoring (UUID) DCGM_FI_DEV_FB_FREE`, "does not match on gpu and UUID", ""},
		{`DCGM_FI_DEV_FB_USED / on (instance, gpu, UUID) DCGM_FI_DEV_FB_FREE`, "", ""},
	}
	for _, tc := range tests {
		byGPU, problems := gpuCheck(expr{"test", tc.text})
		got := strings.Join(problems, "; ")
		if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
			t.Errorf("%s: problems %q, want %q", tc.text, got, tc.want)
		}
		if strings.Join(byGPU, ",") != tc.byGPU {
			t.Errorf("%s: by GPU %v, want %q", tc.text, byGPU, tc.byGPU)
		}
	}
}

// target is one query of a Grafana panel.
type target struct {
	panel, expr, legend, format string
	repeatRow                   string // the variable the panel's row repeats by
}

// dashboardTargets are the dashboard's panel queries, each with the
// repeat variable of the row it sits under (Grafana's panel list is flat:
// a panel belongs to the row above it).
func dashboardTargets(t *testing.T, path string) []target {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Type    string `json:"type"`
			Title   string `json:"title"`
			Repeat  string `json:"repeat"`
			Targets []struct {
				Expr         string `json:"expr"`
				LegendFormat string `json:"legendFormat"`
				Format       string `json:"format"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var out []target
	row := ""
	for _, p := range d.Panels {
		if p.Type == "row" {
			row = p.Repeat
			continue
		}
		for _, tg := range p.Targets {
			out = append(out, target{panel: p.Title, expr: tg.Expr, legend: tg.LegendFormat, format: tg.Format, repeatRow: row})
		}
	}
	return out
}

// TestPerGPURulesAndPanels: the recording rules, the alerts and the
// dashboard keep a box's GPUs apart by dcgm-exporter's labels gpu and UUID
// wherever they aggregate or join per-GPU series; there are recording
// rules and panels per GPU for the memory gpuhost's backends hold
// (gpuhost_gpu_memory_held_bytes) and the framebuffer DCGM reports used;
// every time series over a per-GPU series names the GPU in its legend; and
// the dashboard has a row repeated per GPU.
func TestPerGPURulesAndPanels(t *testing.T) {
	byGPU := map[string]map[string]bool{"rules": {}, "dashboard": {}}
	for _, f := range []string{"prometheus/recording.rules.yml", "prometheus/alerts.rules.yml"} {
		es, _ := ruleExprs(t, f)
		for _, e := range es {
			names, problems := gpuCheck(e)
			for _, p := range problems {
				t.Error(p)
			}
			for _, n := range names {
				byGPU["rules"][n] = true
			}
		}
	}
	const dash = "grafana/gpuhost.json"
	repeated := false
	for _, tg := range dashboardTargets(t, dash) {
		names, problems := gpuCheck(expr{dash + ": " + tg.panel, tg.expr})
		for _, p := range problems {
			t.Error(p)
		}
		for _, n := range names {
			byGPU["dashboard"][n] = true
		}
		if anyPerGPU(selected(mustParse(t, tg.expr))) && tg.format != "table" && !strings.Contains(tg.legend, "{{gpu}}") {
			t.Errorf("%s: %q: a per-GPU query whose legend %q does not name {{gpu}}", tg.panel, tg.expr, tg.legend)
		}
		if tg.repeatRow == "gpu" {
			repeated = true
			if !strings.Contains(tg.expr, `gpu=~"$gpu"`) {
				t.Errorf("%s: in the row repeated per GPU, %q does not select gpu=~\"$gpu\"", tg.panel, tg.expr)
			}
		}
	}
	if !repeated {
		t.Errorf("%s has no row repeated per GPU (repeat: gpu)", dash)
	}
	for where, want := range map[string][]string{
		"rules":     {"gpuhost_gpu_memory_held_bytes", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_UTIL"},
		"dashboard": {"gpuhost_gpu_memory_held_bytes", "DCGM_FI_DEV_FB_USED"},
	} {
		for _, n := range want {
			if !byGPU[where][n] {
				t.Errorf("no %s aggregate %s by gpu and UUID", where, n)
			}
		}
	}
}

func mustParse(t *testing.T, text string) parser.Expr {
	t.Helper()
	e, err := promql.ParseExpr(substitute(text))
	if err != nil {
		t.Fatalf("%q: %v", text, err)
	}
	return e
}
