package simulator

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestApplyVLLMArgv(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		want    Options
		wantErr string
	}{
		{
			name: "unit argv of the reference profile",
			args: strings.Fields("serve Qwen/Qwen3-Coder-30B-A3B-Instruct-AWQ --served-model-name qwen3-coder " +
				"--host 0.0.0.0 --port 8001 --gpu-memory-utilization 0.92 --max-model-len 65536 --max-num-seqs 4 " +
				"--enable-auto-tool-choice --tool-call-parser qwen3_xml --quantization awq_marlin --kv-cache-dtype fp8"),
			want: Options{Model: "Qwen/Qwen3-Coder-30B-A3B-Instruct-AWQ", ServedName: "qwen3-coder", Host: "0.0.0.0",
				Port: 8001, GPUMemoryUtilization: 0.92, MaxModelLen: 65536, MaxNumSeqs: 4, EnableAutoToolChoice: true,
				ToolCallParser: "qwen3_xml", Quantization: "awq_marlin", KVCacheDType: "fp8"},
		},
		{
			name: "equals form and no serve",
			args: []string{"m", "--port=9000", "--gpu-memory-utilization=0.5", "--served-model-name=alias", "--max_model_len=8192"},
			want: Options{Model: "m", Port: 9000, GPUMemoryUtilization: 0.5, ServedName: "alias", MaxModelLen: 8192},
		},
		{
			name: "unknown flags with values and switches are skipped",
			args: strings.Fields("serve --dtype auto --trust-remote-code --tensor-parallel-size 1 m --enforce-eager --swap-space 4 --no-enable-prefix-caching --seed -1 --port 8002"),
			want: Options{Model: "m", Port: 8002},
		},
		{
			name: "model via --model and short quantization",
			args: []string{"--model", "m", "-q", "awq", "-O3", "-tp", "2"},
			want: Options{Model: "m", Quantization: "awq"},
		},
		{
			name: "human readable max model len",
			args: []string{"m", "--max-model-len", "32k"},
			want: Options{Model: "m", MaxModelLen: 32000},
		},
		{
			name: "binary suffix",
			args: []string{"m", "--max-model-len", "32K"},
			want: Options{Model: "m", MaxModelLen: 32768},
		},
		{
			name: "boolean with explicit value",
			args: []string{"m", "--enable-auto-tool-choice=false"},
			want: Options{Model: "m"},
		},
		{
			name: "several served names",
			args: strings.Fields("serve m --served-model-name a b c --port 1"),
			want: Options{Model: "m", ServedName: "a", ServedNameAliases: []string{"b", "c"}, Port: 1},
		},
		{
			name: "served names swallow a later model, as argparse does",
			args: strings.Fields("serve --served-model-name a m"),
			want: Options{ServedName: "a", ServedNameAliases: []string{"m"}},
		},
		{
			name: "unknown trailing switch",
			args: []string{"m", "--some-new-switch"},
			want: Options{Model: "m"},
		},
		{name: "bad port", args: []string{"m", "--port", "eighty"}, wantErr: "--port"},
		{name: "port out of range", args: []string{"m", "--port=70000"}, wantErr: "--port"},
		{name: "utilisation above one", args: []string{"m", "--gpu-memory-utilization", "1.5"}, wantErr: "--gpu-memory-utilization"},
		{name: "utilisation not a number", args: []string{"m", "--gpu-memory-utilization", "lots"}, wantErr: "--gpu-memory-utilization"},
		{name: "max num seqs zero", args: []string{"m", "--max-num-seqs", "0"}, wantErr: "--max-num-seqs"},
		{name: "max model len garbage", args: []string{"m", "--max-model-len", "3x"}, wantErr: "--max-model-len"},
		{name: "max model len fraction", args: []string{"m", "--max-model-len", "1.5"}, wantErr: "--max-model-len"},
		{name: "missing value", args: []string{"m", "--port"}, wantErr: "--port needs a value"},
		{name: "value looks like a flag", args: []string{"m", "--served-model-name", "--port", "1"}, wantErr: "--served-model-name needs a value"},
		{name: "two models", args: []string{"a", "b"}, wantErr: "unexpected extra positional"},
		{name: "bad boolean", args: []string{"m", "--enable-auto-tool-choice=maybe"}, wantErr: "--enable-auto-tool-choice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got Options
			err := got.ApplyVLLMArgv(tt.args)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want one mentioning %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if got.Model != tt.want.Model || got.ServedName != tt.want.ServedName || got.Host != tt.want.Host ||
				got.Port != tt.want.Port || got.GPUMemoryUtilization != tt.want.GPUMemoryUtilization ||
				got.MaxModelLen != tt.want.MaxModelLen || got.MaxNumSeqs != tt.want.MaxNumSeqs ||
				got.EnableAutoToolChoice != tt.want.EnableAutoToolChoice || got.ToolCallParser != tt.want.ToolCallParser ||
				got.Quantization != tt.want.Quantization || got.KVCacheDType != tt.want.KVCacheDType ||
				strings.Join(got.ServedNameAliases, ",") != strings.Join(tt.want.ServedNameAliases, ",") {
				t.Fatalf("got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestApplyVLLMArgvKeepsUnsetFields(t *testing.T) {
	o := Options{Flavor: FlavorVLLM, Port: 1234, LoadTime: 7, SimDir: "/x"}
	if err := o.ApplyVLLMArgv([]string{"serve", "m"}); err != nil {
		t.Fatal(err)
	}
	if o.Port != 1234 || o.LoadTime != 7 || o.SimDir != "/x" || o.Flavor != FlavorVLLM {
		t.Fatalf("fields not given in argv changed: %+v", o)
	}
}

func TestParseHumanInt(t *testing.T) {
	tests := []struct {
		in   string
		want int
		ok   bool
	}{
		{"4096", 4096, true}, {"1k", 1000, true}, {"1K", 1024, true}, {"25.6k", 25600, true},
		{"1m", 1000000, true}, {"2M", 2 << 20, true}, {"0", 0, false}, {"-5", 0, false},
		{"k", 0, false}, {"", 0, false}, {"1.5", 0, false}, {"0.0001k", 0, false}, {"9g", 0, false},
	}
	for _, tt := range tests {
		got, err := parseHumanInt(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("parseHumanInt(%q) = %d, %v; want %d ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}

func FuzzApplyVLLMArgv(f *testing.F) {
	f.Add("serve m --port 8000 --gpu-memory-utilization 0.92 --max-model-len 32k")
	f.Add("--served-model-name=x --max-num-seqs=4 m --enable-auto-tool-choice --tool-call-parser qwen3_xml")
	f.Add("-q awq -O3 -- m")
	f.Add("m --port=-1 --seed -3 --no-enable-prefix-caching=true")
	f.Fuzz(func(t *testing.T, line string) {
		if !utf8.ValidString(line) {
			return
		}
		var o Options
		err := o.ApplyVLLMArgv(strings.Fields(line))
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error message")
			}
			return
		}
		if o.Port < 0 || o.Port > 65535 {
			t.Fatalf("accepted port %d", o.Port)
		}
		if o.GPUMemoryUtilization < 0 || o.GPUMemoryUtilization > 1 {
			t.Fatalf("accepted utilisation %v", o.GPUMemoryUtilization)
		}
		if o.MaxModelLen < 0 || o.MaxNumSeqs < 0 {
			t.Fatalf("accepted negative sizes %d %d", o.MaxModelLen, o.MaxNumSeqs)
		}
	})
}
