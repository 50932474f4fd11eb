package simulator

import (
	"math"
	"strings"
	"testing"
	"time"
)

func TestOptionsDefaults(t *testing.T) {
	tests := []struct {
		name  string
		in    Options
		check func(t *testing.T, o Options)
	}{
		{"vllm defaults", Options{Flavor: FlavorVLLM, Model: "m"}, func(t *testing.T, o Options) {
			if o.Host != "127.0.0.1" || o.Port != 8000 || o.ServedName != "m" || o.VRAMMiB != 20000 || o.MaxModelLen != 32768 ||
				o.MaxNumSeqs != 256 || o.PrefillTPS != 2500 || o.DecodeTPS != 150 || o.Version != "0.11.0" || o.NaturalTokens != 64 {
				t.Fatalf("%+v", o)
			}
		}},
		{"vllm VRAM follows utilisation of a 4090", Options{Flavor: FlavorVLLM, Model: "m", GPUMemoryUtilization: 0.5}, func(t *testing.T, o Options) {
			if o.VRAMMiB != 12282 {
				t.Fatalf("VRAM %d", o.VRAMMiB)
			}
		}},
		{"explicit VRAM wins", Options{Flavor: FlavorVLLM, Model: "m", GPUMemoryUtilization: 0.5, VRAMMiB: 100}, func(t *testing.T, o Options) {
			if o.VRAMMiB != 100 {
				t.Fatalf("VRAM %d", o.VRAMMiB)
			}
		}},
		{"ollama defaults and tags", Options{Flavor: FlavorOllama, Model: "qwen3", Models: []string{"qwen3:latest", " gemma3:4b ", "", "hf.co/org/model"}}, func(t *testing.T, o Options) {
			if o.Port != 11434 || o.VRAMMiB != 6000 || o.MaxModelLen != 4096 || o.MaxNumSeqs != 1 || o.Version != "0.17.4" ||
				o.KeepAlive != 5*time.Minute || strings.Join(o.Models, ",") != "qwen3:latest,gemma3:4b,hf.co/org/model:latest" {
				t.Fatalf("%+v", o)
			}
		}},
		{"vllm sleep mode defaults", Options{Flavor: FlavorVLLM, Model: "m"}, func(t *testing.T, o Options) {
			// 20000 MiB: a quarter is the KV cache, 512 the residual, the rest weights.
			if o.SleepResidualMiB != 512 || o.WeightsMiB != 15000-512 || o.H2DGBps != 25 || o.ReloadGBps != 3 || o.DevMode || o.EnableSleepMode {
				t.Fatalf("%+v", o)
			}
		}},
		{"tiny VRAM caps the residual", Options{Flavor: FlavorVLLM, Model: "m", VRAMMiB: 100}, func(t *testing.T, o Options) {
			if o.SleepResidualMiB != 100 || o.WeightsMiB != 0 {
				t.Fatalf("residual %d weights %d", o.SleepResidualMiB, o.WeightsMiB)
			}
		}},
		{"explicit sizes", Options{Flavor: FlavorVLLM, Model: "m", VRAMMiB: 1000, SleepResidualMiB: 100, WeightsMiB: 900}, func(t *testing.T, o Options) {
			if o.SleepResidualMiB != 100 || o.WeightsMiB != 900 {
				t.Fatalf("residual %d weights %d", o.SleepResidualMiB, o.WeightsMiB)
			}
		}},
		{"ollama with no models is allowed", Options{Flavor: FlavorOllama}, func(t *testing.T, o Options) {
			if len(o.Models) != 0 {
				t.Fatalf("%v", o.Models)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := tt.in.withDefaults()
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, o)
		})
	}
}

func TestOptionsErrors(t *testing.T) {
	tests := []struct {
		in   Options
		want string
	}{
		{Options{}, "flavor is required"},
		{Options{Flavor: "tgi"}, `unknown flavor "tgi"`},
		{Options{Flavor: FlavorVLLM}, "needs a model"},
		{Options{Flavor: FlavorVLLM, Model: "m", Port: 70000}, "port 70000"},
		{Options{Flavor: FlavorVLLM, Model: "m", GPUMemoryUtilization: 1.2}, "utilization 1.2"},
		{Options{Flavor: FlavorVLLM, Model: "m", DecodeTPS: -1}, "decode rate"},
		{Options{Flavor: FlavorVLLM, Model: "m", LoadTime: -time.Second}, "load time"},
		{Options{Flavor: FlavorVLLM, Model: "m", EnableAutoToolChoice: true}, "--enable-auto-tool-choice requires --tool-call-parser"},
		{Options{Flavor: FlavorOllama, MaxNumSeqs: -2}, "max num seqs"},
		{Options{Flavor: FlavorVLLM, Model: "m", VRAMMiB: 1000, SleepResidualMiB: 1001}, "sleep residual 1001 MiB"},
		{Options{Flavor: FlavorVLLM, Model: "m", SleepResidualMiB: -1}, "sleep residual -1 MiB"},
		{Options{Flavor: FlavorVLLM, Model: "m", WeightsMiB: -1}, "negative weights"},
		{Options{Flavor: FlavorVLLM, Model: "m", VRAMMiB: 1000, WeightsMiB: 600, SleepResidualMiB: 500}, "exceed the VRAM claim of 1000 MiB"},
		{Options{Flavor: FlavorVLLM, Model: "m", H2DGBps: -3}, "host-to-device rate"},
		{Options{Flavor: FlavorVLLM, Model: "m", ReloadGBps: math.Inf(1)}, "weight reload rate"},
		{Options{Flavor: FlavorVLLM, Model: "m", Jitter: 0.5}, "rate jitter 0.5: want 0 to 0.3"},
		{Options{Flavor: FlavorVLLM, Model: "m", Jitter: math.NaN()}, "rate jitter NaN"},
	}
	for _, tt := range tests {
		_, err := tt.in.withDefaults()
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("withDefaults(%+v) = %v, want error containing %q", tt.in, err, tt.want)
		}
	}
}

func TestNormalizeTag(t *testing.T) {
	for in, want := range map[string]string{
		"qwen3": "qwen3:latest", "qwen3:8b": "qwen3:8b", "hf.co/a/b": "hf.co/a/b:latest",
		"host:5000/lib/m": "host:5000/lib/m:latest", "host:5000/lib/m:q4": "host:5000/lib/m:q4", "": "",
	} {
		if got := normalizeTag(in); got != want {
			t.Errorf("normalizeTag(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestMetricFormatting(t *testing.T) {
	if got := labels([][2]string{{"z", "1"}, {"a", `q"b\c` + "\n"}}); got != `{a="q\"b\\c\n",z="1"}` {
		t.Fatalf("labels = %s", got)
	}
	for in, want := range map[float64]string{0: "0.0", 3: "3.0", 0.25: "0.25", 1e20: "1e+20"} {
		if got := num(in); got != want {
			t.Errorf("num(%v) = %s, want %s", in, got, want)
		}
	}
}

func TestPlanTokens(t *testing.T) {
	tests := []struct {
		natural, max, min int
		ignoreEOS         bool
		want              int
		finish            string
	}{
		{64, -1, 0, false, 64, "stop"},
		{64, 10, 0, false, 10, "length"},
		{64, 64, 0, false, 64, "length"},
		{64, 100, 0, true, 100, "length"},
		{64, 100, 80, false, 80, "stop"},
		{64, 0, 0, false, 0, "length"},
	}
	for _, tt := range tests {
		got, finish := planTokens(tt.natural, tt.max, tt.min, tt.ignoreEOS)
		if got != tt.want || finish != tt.finish {
			t.Errorf("planTokens(%d,%d,%d,%v) = %d %s, want %d %s", tt.natural, tt.max, tt.min, tt.ignoreEOS, got, finish, tt.want, tt.finish)
		}
	}
}

// TestJitter: the per-request factors scatter by the configured standard
// deviation around 1, the same seed gives the same sequence, and a draw
// never halves or more than one-and-a-half times a rate.
func TestJitter(t *testing.T) {
	a, b := newJitter(0.02, 7), newJitter(0.02, 7)
	var sum, sq float64
	const n = 4000
	for i := 0; i < n; i++ {
		f := a.factor()
		if g := b.factor(); g != f {
			t.Fatalf("draw %d: %v vs %v with the same seed", i, f, g)
		}
		sum += f
		sq += f * f
	}
	mean := sum / n
	sd := math.Sqrt(sq/n - mean*mean)
	if math.Abs(mean-1) > 0.002 || sd < 0.018 || sd > 0.022 {
		t.Errorf("mean %.4f, sd %.4f; want 1 and 0.02", mean, sd)
	}
	wide := newJitter(maxJitter, 1)
	for i := 0; i < n; i++ {
		if f := wide.factor(); f < 0.5 || f > 1.5 {
			t.Fatalf("factor %v outside [0.5, 1.5]", f)
		}
	}
	p := pacer{prefillTPS: 100, decodeTPS: 10}
	if p.jittered(nil) != p {
		t.Error("no jitter changed the rates")
	}
}
