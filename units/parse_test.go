package units

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestParseVLLMArgv(t *testing.T) {
	full := VLLMSettings{
		Model: "Qwen/Q", ServedName: "coder", Port: 8000,
		Flags: VLLMFlags{GPUMemoryUtilization: 0.92, MaxNumSeqs: 32, MaxModelLen: 32768, EnableAutoToolChoice: true, ToolCallParser: "qwen3_xml"},
	}
	tail := []string{"--gpu-memory-utilization", "0.92", "--max-num-seqs", "32", "--max-model-len", "32768",
		"--enable-auto-tool-choice", "--tool-call-parser", "qwen3_xml", "--served-model-name", "coder", "--port", "8000"}
	with := func(prefix ...string) []string { return append(slices.Clip(prefix), tail...) }

	tests := []struct {
		name string
		argv []string
		want VLLMSettings
	}{
		{"already stripped", with("serve", "Qwen/Q"), full},
		{"venv vllm serve", with("/opt/venv/bin/vllm", "serve", "Qwen/Q"), full},
		{"python module api_server with --model", with("/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "Qwen/Q"), full},
		{"python api_server.py path", with("python", "/src/vllm/entrypoints/openai/api_server.py", "--model=Qwen/Q"), full},
		{"python -m cli main serve", with("python3", "-m", "vllm.entrypoints.cli.main", "serve", "Qwen/Q"), full},
		{"simulator with flags before serve", append(with("/usr/local/bin/gpuhost", "simulate", "vllm", "--sim-dir", "/var/lib/gpuhost/simgpu", "serve", "Qwen/Q"),
			"--load-time", "1.5s", "--vram-mib", "20000"),
			withUnknown(full, "--load-time", "1.5s", "--vram-mib", "20000")},
		{"uv run", with("uv", "run", "vllm", "serve", "Qwen/Q"), full},
		{"no program, flags only", with("--model", "Qwen/Q"), full},
		{"program without subcommand", with("/usr/bin/vllm-server", "--model", "Qwen/Q"), full},
		{"equals form", []string{"vllm", "serve", "Qwen/Q", "--gpu-memory-utilization=0.92", "--max-num-seqs=32", "--max-model-len=32768",
			"--enable-auto-tool-choice", "--tool-call-parser=qwen3_xml", "--served-model-name=coder", "--port=8000"}, full},
		{"underscores", []string{"vllm", "serve", "Qwen/Q", "--gpu_memory_utilization", "0.92", "--max_num_seqs=32", "--max-model-len", "32768",
			"--enable_auto_tool_choice", "--tool_call_parser", "qwen3_xml", "--served_model_name", "coder", "--port", "8000"}, full},
		{"positional model after flags", []string{"vllm", "serve", "--port", "8000", "Qwen/Q"}, VLLMSettings{Model: "Qwen/Q", Port: 8000}},
		{"positional and --model agree", []string{"vllm", "serve", "M", "--model", "M"}, VLLMSettings{Model: "M"}},
		{"served name later called serve", []string{"--model", "M", "--served-model-name", "serve"}, VLLMSettings{Model: "M", ServedName: "serve"}},
		{"-q alias", []string{"vllm", "serve", "M", "-q", "awq"}, VLLMSettings{Model: "M", Flags: VLLMFlags{Quantization: "awq"}}},
		{"kv cache dtype", []string{"vllm", "serve", "M", "--kv-cache-dtype", "fp8_e5m2"}, VLLMSettings{Model: "M", Flags: VLLMFlags{KVCacheDtype: "fp8_e5m2"}}},
		{"bool at end", []string{"vllm", "serve", "M", "--enable-auto-tool-choice"}, VLLMSettings{Model: "M", Flags: VLLMFlags{EnableAutoToolChoice: true}}},
		{"bool negated", []string{"vllm", "serve", "M", "--enable-auto-tool-choice", "--no-enable-auto-tool-choice"}, VLLMSettings{Model: "M"}},
		{"bool equals false", []string{"vllm", "serve", "M", "--enable-auto-tool-choice=false"}, VLLMSettings{Model: "M"}},
		{"bool equals true", []string{"vllm", "serve", "M", "--enable-auto-tool-choice=True"}, VLLMSettings{Model: "M", Flags: VLLMFlags{EnableAutoToolChoice: true}}},
		{"last wins", []string{"vllm", "serve", "M", "--max-num-seqs", "8", "--max-num-seqs=16"}, VLLMSettings{Model: "M", Flags: VLLMFlags{MaxNumSeqs: 16}}},
		{"human readable lengths", []string{"vllm", "serve", "M", "--max-model-len", "32k"}, VLLMSettings{Model: "M", Flags: VLLMFlags{MaxModelLen: 32000}}},
		{"binary suffix", []string{"vllm", "serve", "M", "--max-model-len", "32K"}, VLLMSettings{Model: "M", Flags: VLLMFlags{MaxModelLen: 32768}}},
		{"decimal suffix fraction", []string{"vllm", "serve", "M", "--max-model-len=25.6k"}, VLLMSettings{Model: "M", Flags: VLLMFlags{MaxModelLen: 25600}}},
		{"auto length", []string{"vllm", "serve", "M", "--max-model-len", "auto"}, VLLMSettings{Model: "M", Flags: VLLMFlags{MaxModelLen: -1}}},
		{"negative number is a value", []string{"vllm", "serve", "M", "--max-model-len", "-1"}, VLLMSettings{Model: "M", Flags: VLLMFlags{MaxModelLen: -1}}},
		{"several served names", []string{"vllm", "serve", "M", "--served-model-name", "a", "b", "--port", "1"},
			VLLMSettings{Model: "M", ServedName: "a", ExtraServedNames: []string{"b"}, Port: 1}},
		{"unknown flags kept verbatim", []string{"vllm", "serve", "M", "--tensor-parallel-size", "2", "--host=0.0.0.0", "--enforce-eager", "--port", "1", "-tp", "1"},
			VLLMSettings{Model: "M", Port: 1, Unknown: []string{"--tensor-parallel-size", "2", "--host=0.0.0.0", "--enforce-eager", "-tp", "1"}}},
		{"known boolean does not eat the model", []string{"vllm", "serve", "--trust-remote-code", "M"},
			VLLMSettings{Model: "M", Unknown: []string{"--trust-remote-code"}}},
		{"boolean the simulator knew too does not eat the model", []string{"vllm", "serve", "--allow-credentials", "M"},
			VLLMSettings{Model: "M", Unknown: []string{"--allow-credentials"}}},
		{"stray words after the model", []string{"vllm", "serve", "M", "extra"}, VLLMSettings{Model: "M", Unknown: []string{"extra"}}},
		{"double dash ends options", []string{"vllm", "serve", "M", "--", "--port", "1"}, VLLMSettings{Model: "M", Unknown: []string{"--", "--port", "1"}}},
		{"program only", []string{"/usr/bin/vllm"}, VLLMSettings{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseVLLMArgv(tc.argv)
			if err != nil {
				t.Fatalf("ParseVLLMArgv(%q): %v", tc.argv, err)
			}
			if !settingsEqual(got, tc.want) {
				t.Errorf("ParseVLLMArgv(%q) =\n%+v\nwant\n%+v", tc.argv, got, tc.want)
			}
		})
	}
}

func withUnknown(s VLLMSettings, u ...string) VLLMSettings {
	s.Unknown = u
	return s
}

func settingsEqual(a, b VLLMSettings) bool {
	return a.Model == b.Model && a.ServedName == b.ServedName && a.Port == b.Port && flagsEqual(a.Flags, b.Flags) &&
		slices.Equal(a.Unknown, b.Unknown) && slices.Equal(a.ExtraServedNames, b.ExtraServedNames)
}

func TestParseVLLMArgvErrors(t *testing.T) {
	tests := []struct {
		name     string
		argv     []string
		wantFlag string // must appear in the error
	}{
		{"empty", nil, "empty argv"},
		{"missing value at end", []string{"vllm", "serve", "M", "--max-num-seqs"}, "--max-num-seqs"},
		{"missing value before flag", []string{"vllm", "serve", "M", "--tool-call-parser", "--port", "1"}, "--tool-call-parser"},
		{"non-numeric seqs", []string{"vllm", "serve", "M", "--max-num-seqs", "many"}, "--max-num-seqs"},
		{"non-numeric seqs equals", []string{"vllm", "serve", "M", "--max_num_seqs=1.5"}, "--max-num-seqs"},
		{"non-numeric util", []string{"vllm", "serve", "M", "--gpu-memory-utilization", "high"}, "--gpu-memory-utilization"},
		{"NaN util", []string{"vllm", "serve", "M", "--gpu-memory-utilization", "NaN"}, "--gpu-memory-utilization"},
		{"port out of range", []string{"vllm", "serve", "M", "--port", "99999"}, "--port"},
		{"bad length", []string{"vllm", "serve", "M", "--max-model-len", "1.5K"}, "--max-model-len"},
		{"bad bool", []string{"vllm", "serve", "M", "--enable-auto-tool-choice=maybe"}, "--enable-auto-tool-choice"},
		{"served name without value", []string{"vllm", "serve", "M", "--served-model-name"}, "--served-model-name"},
		{"two models", []string{"vllm", "serve", "A", "--model", "B"}, `"A"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseVLLMArgv(tc.argv)
			if err == nil {
				t.Fatalf("ParseVLLMArgv(%q) = nil error, want one naming %s", tc.argv, tc.wantFlag)
			}
			if !strings.Contains(err.Error(), tc.wantFlag) {
				t.Errorf("error %q does not name %s", err, tc.wantFlag)
			}
		})
	}
}

// randomProfile draws a valid vLLM profile with a random subset of flags set.
func randomProfile(r *rand.Rand) Profile {
	words := []string{"qwen3_xml", "hermes", "llama3_json", "awq_marlin", "gptq", "fp8", "auto", "x-1", "serve", "a.b/c:d"}
	pick := func() string { return words[r.IntN(len(words))] }
	p := Profile{Backend: VLLM, Model: fmt.Sprintf("org%d/Model-%d", r.IntN(5), r.IntN(100))}
	if r.IntN(2) == 0 {
		p.Model = pick() // includes "serve": the model may look like the subcommand
	}
	if r.IntN(2) == 0 {
		p.ServedName = pick()
	}
	if r.IntN(3) > 0 {
		p.Port = 1 + r.IntN(65535)
	}
	f := &p.VLLM
	if r.IntN(2) == 0 {
		f.GPUMemoryUtilization = 1 - r.Float64() // (0, 1]
	}
	if r.IntN(2) == 0 {
		f.MaxNumSeqs = r.IntN(1024)
	}
	if r.IntN(2) == 0 {
		f.MaxModelLen = r.IntN(1 << 20)
	}
	f.EnableAutoToolChoice = r.IntN(2) == 0
	if r.IntN(2) == 0 {
		f.ToolCallParser = VLLMToolCallParsers[r.IntN(len(VLLMToolCallParsers))]
	}
	if r.IntN(2) == 0 {
		f.Quantization = pick()
	}
	if r.IntN(2) == 0 {
		f.KVCacheDtype = pick()
	}
	unknown := []string{"--enforce-eager", "--enable-prefix-caching", "--trust-remote-code", "--seed", "--tensor-parallel-size", "-tp", "--max-logprobs", "--no-enable-prefix-caching"}
	for n := r.IntN(4); n > 0; n-- {
		flag := unknown[r.IntN(len(unknown))]
		switch r.IntN(3) {
		case 0:
			f.ExtraArgs = append(f.ExtraArgs, flag)
		case 1:
			f.ExtraArgs = append(f.ExtraArgs, flag, strconv.Itoa(r.IntN(100)))
		default:
			f.ExtraArgs = append(f.ExtraArgs, flag+"="+pick())
		}
	}
	return p
}

// toEqualsForm rewrites managed `--flag value` pairs as `--flag=value`.
func toEqualsForm(argv []string, r *rand.Rand) []string {
	var out []string
	for i := 0; i < len(argv); i++ {
		w := argv[i]
		name, _, hasVal := splitFlag(w)
		kf, ok := lookupFlag(name)
		if isFlagWord(w) && ok && !hasVal && kf.kind != kindBool && i+1 < len(argv) && r.IntN(2) == 0 {
			out = append(out, w+"="+argv[i+1])
			i++
			continue
		}
		out = append(out, w)
	}
	return out
}

// TestVLLMArgsRoundTrip is the property: for any valid profile,
// ParseVLLMArgv(prefix + VLLMArgs(p)) gives back exactly the profile's settings,
// in both `--flag value` and `--flag=value` forms and behind any program prefix.
func TestVLLMArgsRoundTrip(t *testing.T) {
	prefixes := [][]string{
		nil,
		{"/opt/venv/bin/vllm"},
		{"/usr/local/bin/gpuhost", "simulate", "vllm", "--sim-dir", "/var/lib/gpuhost/simgpu"},
		{"uv", "run", "vllm"},
	}
	for _, seed := range []uint64{1, 2, 3} {
		r := rand.New(rand.NewPCG(seed, seed*7919))
		for i := 0; i < 1500; i++ {
			p := randomProfile(r)
			// Port 0 (omitted) is invalid in a config but must still round-trip.
			if errs := slices.DeleteFunc(p.Validate(), func(e FieldError) bool { return e.Key == "port" && p.Port == 0 }); len(errs) > 0 {
				t.Fatalf("seed %d iter %d: generator made an invalid profile %+v: %v", seed, i, p, errs)
			}
			argv := VLLMArgs(p)
			if i%2 == 1 {
				argv = toEqualsForm(argv, r)
			}
			argv = append(slices.Clip(prefixes[r.IntN(len(prefixes))]), argv...)
			got, err := ParseVLLMArgv(argv)
			if err != nil {
				t.Fatalf("seed %d iter %d: ParseVLLMArgv(%q): %v", seed, i, argv, err)
			}
			wantFlags := p.VLLM
			wantFlags.ExtraArgs = nil
			want := VLLMSettings{Model: p.Model, ServedName: p.ServedModelName(), Port: p.Port, Flags: wantFlags, Unknown: append([]string{"--host", "127.0.0.1"}, p.VLLM.ExtraArgs...)}
			if !settingsEqual(got, want) {
				t.Fatalf("seed %d iter %d: round trip of %q\ngot  %+v\nwant %+v", seed, i, argv, got, want)
			}
			wantP := p
			wantP.VLLM.ExtraArgs = append(AddedVLLMArgs(p), p.VLLM.ExtraArgs...)
			if d := Drift(wantP, got); d != nil {
				t.Fatalf("seed %d iter %d: Drift after a round trip = %+v, want none", seed, i, d)
			}
		}
	}
}

func FuzzParseVLLMArgv(f *testing.F) {
	join := func(a []string) string { return strings.Join(a, "\x00") }
	f.Add(join(VLLMArgs(qwenCoder())))
	f.Add(join([]string{"python3", "-m", "vllm.entrypoints.openai.api_server", "--model=M", "--max-model-len", "32K"}))
	f.Add(join([]string{"gpuhost", "simulate", "vllm", "--sim-dir", "/d", "serve", "M", "--served-model-name", "a", "b", "--", "x"}))
	f.Add(join([]string{"serve", "-q", "--no-enable-auto-tool-choice=1", "--max-model-len=9.99t"}))
	f.Fuzz(func(t *testing.T, s string) {
		argv := strings.Split(s, "\x00")
		got, err := ParseVLLMArgv(argv)
		if err != nil {
			return
		}
		// Every input word is accounted for at most once: nothing invented.
		if len(got.Unknown) > len(argv) {
			t.Fatalf("Unknown %q longer than argv %q", got.Unknown, argv)
		}
		_ = Drift(Profile{Backend: VLLM, Model: got.Model}, got)
	})
}

func TestDrift(t *testing.T) {
	want := qwenCoder()
	want.VLLM.ExtraArgs = []string{"--enable-prefix-caching", "--tensor-parallel-size", "1"}
	liveOf := func(p Profile) VLLMSettings {
		s, err := ParseVLLMArgv(VLLMArgs(p))
		if err != nil {
			t.Fatalf("ParseVLLMArgv: %v", err)
		}
		return s
	}
	tests := []struct {
		name string
		want Profile
		live func() VLLMSettings
		diff []Difference
	}{
		{"identical", want, func() VLLMSettings { return liveOf(want) }, nil},
		{"extra args in another order and form", want, func() VLLMSettings {
			s := liveOf(want)
			s.Unknown = []string{"--tensor_parallel_size=1", "--host=127.0.0.1", "--enable-prefix-caching"}
			return s
		}, nil},
		{"simulator flags ignored", want, func() VLLMSettings {
			s := liveOf(want)
			s.Unknown = append(s.Unknown, "--load-time", "1s", "--vram-mib=100", "--prefill-tps", "5", "--decode-tps", "6")
			return s
		}, nil},
		{"util raised to 0.96", want, func() VLLMSettings {
			s := liveOf(want)
			s.Flags.GPUMemoryUtilization = 0.96
			return s
		}, []Difference{{"--gpu-memory-utilization", "0.92", "0.96"}}},
		{"unset equals vLLM default", Profile{Backend: VLLM, Model: "M", Port: 8000, VLLM: VLLMFlags{GPUMemoryUtilization: 0.9, KVCacheDtype: "auto"}},
			func() VLLMSettings { return VLLMSettings{Model: "M", Unknown: []string{"--host", "127.0.0.1"}} }, nil},
		// A server started without --host (by an older gpuhost, or by hand)
		// listens on every interface: that is drift, and a restart fixes it.
		{"no --host: every interface", Profile{Backend: VLLM, Model: "M"},
			func() VLLMSettings { return VLLMSettings{Model: "M"} }, []Difference{{"--host", "127.0.0.1", "(absent)"}}},
		{"several differences", want, func() VLLMSettings {
			return VLLMSettings{Model: "other/model", ServedName: "x", ExtraServedNames: []string{"y"}, Port: 8001,
				Flags:   VLLMFlags{MaxModelLen: -1, ToolCallParser: "hermes", Quantization: "awq", KVCacheDtype: "fp8"},
				Unknown: []string{"--enforce-eager", "--tensor-parallel-size", "2"}}
		}, []Difference{
			{"model", want.Model, "other/model"},
			{"--served-model-name", want.Model, "x y"},
			{"--port", "8000", "8001"},
			{"--gpu-memory-utilization", "0.92", "0.9"},
			{"--max-num-seqs", "32", "(vLLM default)"},
			{"--max-model-len", "32768", "auto"},
			{"--enable-auto-tool-choice", "true", "false"},
			{"--tool-call-parser", "qwen3_xml", "hermes"},
			{"--quantization", "(auto-detected)", "awq"},
			{"--kv-cache-dtype", "auto", "fp8"},
			{"--enable-prefix-caching", "(set)", "(absent)"},
			{"--enforce-eager", "(absent)", "(set)"},
			{"--host", "127.0.0.1", "(absent)"},
			{"--tensor-parallel-size", "1", "2"},
		}},
		{"not vllm", llamaOllama(), func() VLLMSettings { return VLLMSettings{Model: "x"} }, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// As the doctor asks: what VLLMArgs adds is wanted too.
			want := tc.want
			want.VLLM.ExtraArgs = append(AddedVLLMArgs(tc.want), tc.want.VLLM.ExtraArgs...)
			got := Drift(want, tc.live())
			if len(got) == 0 && len(tc.diff) == 0 {
				return
			}
			sortDiff := func(d []Difference) []Difference {
				d = slices.Clone(d)
				slices.SortFunc(d, func(a, b Difference) int { return strings.Compare(a.Flag, b.Flag) })
				return d
			}
			if !reflect.DeepEqual(sortDiff(got), sortDiff(tc.diff)) {
				t.Errorf("Drift() =\n%+v\nwant\n%+v", got, tc.diff)
			}
		})
	}
}

// TestIsVLLMBoolFlag: the one table of vLLM switches (units and the
// simulator's argv parser both read it), by bare long name.
func TestIsVLLMBoolFlag(t *testing.T) {
	for _, tt := range []struct {
		name string
		want bool
	}{
		{"trust-remote-code", true},
		{"enable-auto-tool-choice", true},
		{"allow-credentials", true},         // was only in the simulator's table
		{"use-tqdm-on-load", true},          // was only in the simulator's table
		{"disable-async-output-proc", true}, // was only in the simulator's table
		{"--trust-remote-code", false},      // without dashes
		{"no-enable-prefix-caching", false},
		{"max-model-len", false},
		{"tensor-parallel-size", false},
		{"", false},
	} {
		if got := IsVLLMBoolFlag(tt.name); got != tt.want {
			t.Errorf("IsVLLMBoolFlag(%q) = %v, want %v", tt.name, got, tt.want)
		}
	}
}
