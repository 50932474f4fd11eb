package units

import (
	"maps"
	"slices"
	"strings"
	"testing"
)

func TestVLLMArgs(t *testing.T) {
	tests := []struct {
		name string
		p    Profile
		want []string
	}{
		{
			name: "reference profile",
			p:    qwenCoder(),
			want: []string{"serve", "cpatonn/Qwen3-Coder-30B-A3B-Instruct-AWQ-4bit",
				"--gpu-memory-utilization", "0.92", "--max-num-seqs", "32", "--max-model-len", "32768",
				"--enable-auto-tool-choice", "--tool-call-parser", "qwen3_xml",
				"--served-model-name", "cpatonn/Qwen3-Coder-30B-A3B-Instruct-AWQ-4bit", "--port", "8000", "--host", "127.0.0.1"},
		},
		{
			name: "every flag plus extra args",
			p: Profile{Backend: VLLM, Model: "M", ServedName: "S", Port: 9000, VLLM: VLLMFlags{
				GPUMemoryUtilization: 0.9, MaxNumSeqs: 8, MaxModelLen: 4096, EnableAutoToolChoice: true,
				ToolCallParser: "hermes", Quantization: "awq_marlin", KVCacheDtype: "fp8",
				ExtraArgs: []string{"--enable-prefix-caching", "--tensor-parallel-size", "1"}}},
			want: []string{"serve", "M", "--gpu-memory-utilization", "0.9", "--max-num-seqs", "8", "--max-model-len", "4096",
				"--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--quantization", "awq_marlin",
				"--kv-cache-dtype", "fp8", "--served-model-name", "S", "--port", "9000", "--host", "127.0.0.1",
				"--enable-prefix-caching", "--tensor-parallel-size", "1"},
		},
		{
			name: "zero values omitted",
			p:    Profile{Backend: VLLM, Model: "M"},
			want: []string{"serve", "M", "--served-model-name", "M", "--host", "127.0.0.1"},
		},
		{
			name: "float in shortest exact form",
			p:    Profile{Backend: VLLM, Model: "M", Port: 1, VLLM: VLLMFlags{GPUMemoryUtilization: 0.925}},
			want: []string{"serve", "M", "--gpu-memory-utilization", "0.925", "--served-model-name", "M", "--port", "1", "--host", "127.0.0.1"},
		},
		{
			name: "loopback --host in extra args kept, not doubled",
			p:    Profile{Backend: VLLM, Model: "M", VLLM: VLLMFlags{ExtraArgs: []string{"--host=::1"}}},
			want: []string{"serve", "M", "--served-model-name", "M", "--host=::1"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := VLLMArgs(tc.p); !slices.Equal(got, tc.want) {
				t.Errorf("VLLMArgs() =\n%q\nwant\n%q", got, tc.want)
			}
		})
	}
}

func TestSimAndBackendArgs(t *testing.T) {
	sim := SimOpts{LoadTime: "1.5s", PrefillTPS: 2545.5, DecodeTPS: 60, VRAMMiB: 20000}
	v := qwenCoder()
	v.Sim = sim
	o := llamaOllama()
	o.Sim = SimOpts{DecodeTPS: 80}

	tests := []struct {
		name      string
		got, want []string
	}{
		{"sim args vllm", SimArgs(v), []string{"--load-time", "1.5s", "--prefill-tps", "2545.5", "--decode-tps", "60", "--vram-mib", "20000"}},
		{"sim args zero vllm", SimArgs(qwenCoder()), nil},
		{"sim args ollama adds model", SimArgs(o), []string{"--decode-tps", "80", "--model", "llama3.1:8b"}},
		{"backend vllm real", BackendArgs(v, false), VLLMArgs(v)},
		{"backend vllm simulated", BackendArgs(v, true), append(VLLMArgs(v), SimArgs(v)...)},
		{"backend ollama real", BackendArgs(o, false), []string{"serve"}},
		{"backend ollama simulated", BackendArgs(o, true), []string{"serve", "--decode-tps", "80", "--model", "llama3.1:8b"}},
		{"backend unknown", BackendArgs(Profile{Backend: "tgi", Model: "x"}, true), nil},
	}
	for _, tc := range tests {
		if !slices.Equal(tc.got, tc.want) {
			t.Errorf("%s: got %q, want %q", tc.name, tc.got, tc.want)
		}
	}
}

func TestEnvFile(t *testing.T) {
	v := qwenCoder()
	v.Sim = SimOpts{LoadTime: "2s"}
	o := llamaOllama()
	oDefault := llamaOllama()
	oDefault.Ollama = OllamaOpts{}
	vOpen := qwenCoder()
	vOpen.Network = NetworkOpen
	vOffline := qwenCoder()
	vOffline.Network = NetworkOffline
	oOpen := llamaOllama()
	oOpen.Network = NetworkOpen
	vllmOffline := map[string]string{"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
	ollamaOffline := map[string]string{"OLLAMA_NO_CLOUD": "1", "DO_NOT_TRACK": "1"}
	with := func(a, b map[string]string) map[string]string {
		m := maps.Clone(a)
		maps.Copy(m, b)
		return m
	}

	tests := []struct {
		name      string
		p         Profile
		simulated bool
		want      map[string]string
	}{
		{"vllm", v, false, with(vllmOffline, map[string]string{
			EnvProfile: "coder",
			EnvArgs:    strings.Join(VLLMArgs(v), " "),
		})},
		{"vllm simulated", v, true, with(vllmOffline, map[string]string{
			EnvProfile: "coder",
			EnvArgs:    strings.Join(VLLMArgs(v), " ") + " --load-time 2s",
		})},
		{"vllm network offline", vOffline, false, with(vllmOffline, map[string]string{
			EnvProfile: "coder",
			EnvArgs:    strings.Join(VLLMArgs(v), " "),
		})},
		{"vllm network open", vOpen, false, map[string]string{
			EnvProfile: "coder",
			EnvArgs:    strings.Join(VLLMArgs(v), " "),
		}},
		{"ollama", o, false, with(ollamaOffline, map[string]string{
			EnvProfile: "llama", EnvArgs: "serve", EnvOllamaHost: "127.0.0.1:11434",
			EnvOllamaKeep: "-1", EnvOllamaContext: "8192",
		})},
		{"ollama defaults", oDefault, true, with(ollamaOffline, map[string]string{
			EnvProfile: "llama", EnvArgs: "serve --model llama3.1:8b", EnvOllamaHost: "127.0.0.1:11434", EnvOllamaKeep: "-1",
		})},
		{"ollama network open", oOpen, false, map[string]string{
			EnvProfile: "llama", EnvArgs: "serve", EnvOllamaHost: "127.0.0.1:11434",
			EnvOllamaKeep: "-1", EnvOllamaContext: "8192",
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			text := EnvFile(tc.p, tc.simulated)
			got := ParseEnvFile(text)
			if !maps.Equal(got, tc.want) {
				t.Errorf("ParseEnvFile(EnvFile()) = %q, want %q\nfile:\n%s", got, tc.want, text)
			}
			// What systemd's `$GPUHOST_ARGS` splitting yields must be the argv.
			if words := strings.Fields(got[EnvArgs]); !slices.Equal(words, BackendArgs(tc.p, tc.simulated)) {
				t.Errorf("split GPUHOST_ARGS = %q, want %q", words, BackendArgs(tc.p, tc.simulated))
			}
		})
	}
}

func TestEnvQuoteRoundTrip(t *testing.T) {
	for _, v := range []string{"", "plain", "a b", `a"b`, `a\b`, "a$b", "a`b", "it's", "  lead and trail  ", "line1\nline2",
		"#notacomment", ";x", "ünïcödé", `\`, `"`, "tab\there", "trailing\\"} {
		text := "K=" + envQuote(v) + "\n"
		if got := ParseEnvFile(text)["K"]; got != v {
			t.Errorf("envQuote(%q) = %s, parsed back as %q", v, envQuote(v), got)
		}
	}
}

// TestParseEnvFile pins systemd's EnvironmentFile rules (systemd.exec(5)).
func TestParseEnvFile(t *testing.T) {
	tests := []struct {
		name, text string
		want       map[string]string
	}{
		{"bare", "A=1\nB=two words\n", map[string]string{"A": "1", "B": "two words"}},
		{"whitespace trimmed around key and bare value", "  A = x y  \n", map[string]string{"A": "x y"}},
		{"comments", "# c\n; c\nA=1\n", map[string]string{"A": "1"}},
		{"no equals ignored", "JUNK\nA=1\n", map[string]string{"A": "1"}},
		{"invalid names ignored", "1A=x\nA-B=y\nOK_1=z\n", map[string]string{"OK_1": "z"}},
		{"single quotes verbatim", `A='x \n "y"'` + "\n", map[string]string{"A": `x \n "y"`}},
		{"double quote escapes", `A="q\"b\\s\$d\` + "`" + `e\x"` + "\n", map[string]string{"A": `q"b\s$d` + "`" + `e\x`}},
		{"quoted spans lines", "A=\"l1\nl2\"\nB=3\n", map[string]string{"A": "l1\nl2", "B": "3"}},
		{"bare backslash escapes", `A=a\ b\\c` + "\n", map[string]string{"A": `a b\c`}},
		{"bare continuation", "A=one \\\ntwo\n", map[string]string{"A": "one two"}},
		{"quotes inside bare value kept", `A=x"y"` + "\n", map[string]string{"A": `x"y"`}},
		{"empty value", "A=\nB=\"\"\n", map[string]string{"A": "", "B": ""}},
		{"last wins", "A=1\nA=2\n", map[string]string{"A": "2"}},
		{"no trailing newline", "A=1", map[string]string{"A": "1"}},
		{"unterminated quote kept", "A=\"abc", map[string]string{"A": "abc"}},
		{"crlf", "A=1\r\nB=2\r\n", map[string]string{"A": "1", "B": "2"}},
		{"comment with trailing backslash", "# c \\\nA=1\n", map[string]string{"A": "1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := ParseEnvFile(tc.text); !maps.Equal(got, tc.want) {
				t.Errorf("ParseEnvFile(%q) = %q, want %q", tc.text, got, tc.want)
			}
		})
	}
}

func FuzzParseEnvFile(f *testing.F) {
	f.Add("A=1\nB=\"x y\"\n")
	f.Add("A='a\nb'\n# c\\\nB=\\\n")
	f.Add(EnvFile(qwenCoder(), true))
	f.Fuzz(func(t *testing.T, text string) {
		m := ParseEnvFile(text)
		for k := range m {
			if !envNameValid(k) {
				t.Fatalf("invalid name %q accepted", k)
			}
		}
		// Whatever a value is, envQuote must write it so it reads back.
		for k, v := range m {
			if got := ParseEnvFile(k + "=" + envQuote(v))[k]; got != v {
				t.Fatalf("envQuote(%q) read back as %q", v, got)
			}
		}
	})
}

// What gpuhost adds for standby, read back from the argv it renders,
// drifts from nothing: the doctor counts it as wanted.
func TestAddedVLLMArgsAreNotDrift(t *testing.T) {
	for _, tt := range []struct {
		name    string
		standby Standby
		extra   []string
		want    string
	}{
		{"no standby", StandbyOff, nil, "--host 127.0.0.1"},
		{"standby", StandbySleep1, nil, "--enable-sleep-mode --host 127.0.0.1"},
		{"own host", StandbyAuto, []string{"--host=0.0.0.0"}, "--enable-sleep-mode"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := Profile{Name: "p", Backend: VLLM, Model: "m", Port: 8001, Standby: tt.standby, VLLM: VLLMFlags{ExtraArgs: tt.extra}}
			added := AddedVLLMArgs(p)
			if got := strings.Join(added, " "); got != tt.want {
				t.Fatalf("AddedVLLMArgs = %q, want %q", got, tt.want)
			}
			live, err := ParseVLLMArgv(append([]string{"vllm"}, VLLMArgs(p)...))
			if err != nil {
				t.Fatal(err)
			}
			want := p
			want.VLLM.ExtraArgs = append(added, p.VLLM.ExtraArgs...)
			if d := Drift(want, live); len(d) != 0 {
				t.Errorf("drift with the added flags counted as wanted: %+v", d)
			}
			if d := Drift(p, live); len(added) > 0 && len(d) == 0 {
				t.Error("without counting them, the added flags must show as drift (else the test proves nothing)")
			}
		})
	}
}
