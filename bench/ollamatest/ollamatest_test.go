package ollamatest

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestStart serves the tiny model with the real Ollama and checks the
// facts the bench tests rely on: version, exactly num_predict tokens
// (never EOS), the server's timings and the context length in /api/ps.
func TestStart(t *testing.T) {
	url, model := Start(t)
	if BuildDuration > 0 {
		t.Logf("built ollama %s in %s", Version, BuildDuration.Round(time.Second))
	}
	var v struct{ Version string }
	getJSON(t, url+"/api/version", &v)
	if v.Version != Version {
		t.Fatalf("version %q, want %s", v.Version, Version)
	}
	for _, n := range []int{1, 50, 300} {
		body, _ := json.Marshal(map[string]any{"model": model, "prompt": "The quick brown fox", "stream": false,
			"options": map[string]any{"num_predict": n}})
		resp, err := http.Post(url+"/api/generate", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var g struct {
			Response     string `json:"response"`
			DoneReason   string `json:"done_reason"`
			EvalCount    int    `json:"eval_count"`
			EvalDuration int64  `json:"eval_duration"`
			PromptEval   int    `json:"prompt_eval_count"`
		}
		err = json.NewDecoder(resp.Body).Decode(&g)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if g.EvalCount != n || g.DoneReason != "length" || (n > 1 && g.EvalDuration <= 0) || g.PromptEval == 0 {
			t.Fatalf("num_predict %d: eval_count %d, done_reason %q, eval_duration %d", n, g.EvalCount, g.DoneReason, g.EvalDuration)
		}
		for _, r := range g.Response {
			if r < ' ' || r > '~' {
				t.Fatalf("non-printable output %q", g.Response)
			}
		}
	}
	var ps struct {
		Models []struct {
			Name          string `json:"name"`
			ContextLength int    `json:"context_length"`
			SizeVRAM      int64  `json:"size_vram"`
		} `json:"models"`
	}
	getJSON(t, url+"/api/ps", &ps)
	if len(ps.Models) != 1 || ps.Models[0].Name != model+":latest" || ps.Models[0].ContextLength != 4096 || ps.Models[0].SizeVRAM != 0 {
		t.Fatalf("/api/ps = %+v", ps)
	}
}

func getJSON(t *testing.T, url string, out any) {
	t.Helper()
	c := &http.Client{Timeout: 30 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}

// TestBuildMissingPrerequisite: a build without a C++ compiler is a
// missing prerequisite (skipped tests), not a broken build.
func TestBuildMissingPrerequisite(t *testing.T) {
	t.Setenv("CXX", "/nonexistent/g++")
	skip, err := Build(context.Background(), filepath.Join(t.TempDir(), "ollama"))
	if err == nil || !skip || !strings.Contains(err.Error(), "C/C++ compiler") {
		t.Fatalf("skip %v, err %v", skip, err)
	}
}

func TestMissingPrereqPatterns(t *testing.T) {
	for out, want := range map[string]bool{
		"llama/llama.cpp/common/json-schema-to-grammar.h:4:10: fatal error: nlohmann/json_fwd.hpp: No such file or directory": true,
		`cgo: C compiler "gcc" not found: exec: "gcc": executable file not found in $PATH`:                                    true,
		"go: github.com/x/y@v1: Get \"https://proxy.golang.org/...\": dial tcp: lookup proxy.golang.org: no such host":        true,
		"llama.cpp:12: error: 'foo' was not declared in this scope":                                                           false,
	} {
		if got := missingPrereq.MatchString(out); got != want {
			t.Errorf("%q: %v, want %v", out, got, want)
		}
	}
}

// TestIncludeDir: the stand-in header is where the build expects it.
func TestIncludeDir(t *testing.T) {
	h := filepath.Join(IncludeDir(), "miniaudio", "miniaudio.h")
	b, err := os.ReadFile(h)
	if err != nil {
		t.Fatal(err)
	}
	for _, fn := range []string{"ma_decoder_init_memory", "ma_decoder_get_length_in_pcm_frames", "ma_decoder_read_pcm_frames",
		"ma_decoder_uninit", "ma_decoder_config_init", "ma_encoder_init_file"} {
		if !bytes.Contains(b, []byte(fn)) {
			t.Errorf("stand-in header lacks %s", fn)
		}
	}
}

// TestPickVersion: only a verified release is built; an unknown one is an
// error naming the variable, never a silent fallback.
func TestPickVersion(t *testing.T) {
	for _, tc := range []struct {
		env, want string
		err       bool
	}{
		{"", Versions[0], false},
		{Versions[len(Versions)-1], Versions[len(Versions)-1], false},
		{"0.32.15", Versions[0], true},
	} {
		got, err := pickVersion(tc.env)
		if got != tc.want || (err != nil) != tc.err {
			t.Errorf("pickVersion(%q) = %q, %v", tc.env, got, err)
		}
		if err != nil && !strings.Contains(err.Error(), VersionEnv) {
			t.Errorf("error %q does not name %s", err, VersionEnv)
		}
	}
}
