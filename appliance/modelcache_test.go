package appliance

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/config"
	"gpuhost/systemd"
	"gpuhost/units"
)

// put writes files below root (name → content; a "->target" content makes
// a symlink, as the hub cache links snapshots to blobs).
func put(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if target, ok := strings.CutPrefix(content, "->"); ok {
			if err := os.Symlink(target, p); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

const rev = "0123456789abcdef0123456789abcdef01234567"

// hfRepo is a hub cache entry for Org/Tiny at rev with files in its
// snapshot (and refs/main naming rev).
func hfRepo(files map[string]string) map[string]string {
	out := map[string]string{"models--Org--Tiny/refs/main": rev + "\n"}
	for n, c := range files {
		out["models--Org--Tiny/snapshots/"+rev+"/"+n] = c
	}
	return out
}

func TestHFModelCache(t *testing.T) {
	index := `{"metadata":{},"weight_map":{"a.w":"model-00001-of-00002.safetensors","b.w":"model-00002-of-00002.safetensors","c.w":"model-00002-of-00002.safetensors"}}`
	for _, tt := range []struct {
		name     string
		files    map[string]string
		model    string
		revision string
		missing  string // "" = complete
	}{
		{"single file", hfRepo(map[string]string{"config.json": "{}", "tokenizer.json": "{}", "model.safetensors": "w"}), "Org/Tiny", "", ""},
		{"sharded with index", hfRepo(map[string]string{"config.json": "{}", "tokenizer.model": "t", "model.safetensors.index.json": index,
			"model-00001-of-00002.safetensors": "w", "model-00002-of-00002.safetensors": "w"}), "Org/Tiny", "", ""},
		{"a shard missing", hfRepo(map[string]string{"config.json": "{}", "tokenizer.json": "{}", "model.safetensors.index.json": index,
			"model-00001-of-00002.safetensors": "w"}), "Org/Tiny", "", "model-00002-of-00002.safetensors"},
		{"shard links to a blob still downloading", hfRepo(map[string]string{"config.json": "{}", "tokenizer.json": "{}",
			"model.safetensors": "->../../blobs/abc"}), "Org/Tiny", "", "weights (*.safetensors)"},
		{"shard linked to its blob", func() map[string]string {
			m := hfRepo(map[string]string{"config.json": "{}", "tokenizer.json": "{}", "model.safetensors": "->../../blobs/abc"})
			m["models--Org--Tiny/blobs/abc"] = "w"
			return m
		}(), "Org/Tiny", "", ""},
		{"no config", hfRepo(map[string]string{"tokenizer.json": "{}", "model.safetensors": "w"}), "Org/Tiny", "", "config.json"},
		{"no tokenizer", hfRepo(map[string]string{"config.json": "{}", "tokenizer_config.json": "{}", "model.safetensors": "w"}), "Org/Tiny", "", "a tokenizer"},
		{"tiktoken tokenizer", hfRepo(map[string]string{"config.json": "{}", "qwen.tiktoken": "t", "model.safetensors": "w"}), "Org/Tiny", "", ""},
		{"WordPiece tokenizer", hfRepo(map[string]string{"config.json": "{}", "vocab.txt": "t", "model.safetensors": "w"}), "Org/Tiny", "", ""},
		{"no weights", hfRepo(map[string]string{"config.json": "{}", "tokenizer.json": "{}"}), "Org/Tiny", "", "weights"},
		{"not fetched", nil, "Org/Tiny", "", "the repository folder"},
		{"no refs/main", map[string]string{"models--Org--Tiny/snapshots/" + rev + "/config.json": "{}"}, "Org/Tiny", "", "refs/main and its snapshot"},
		{"revision by commit", map[string]string{"models--Org--Tiny/snapshots/" + rev + "/config.json": "{}",
			"models--Org--Tiny/snapshots/" + rev + "/tokenizer.json": "{}", "models--Org--Tiny/snapshots/" + rev + "/model.safetensors": "w"}, "Org/Tiny", rev, ""},
		{"other model", hfRepo(map[string]string{"config.json": "{}", "tokenizer.json": "{}", "model.safetensors": "w"}), "Org/Other", "", "the repository folder"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			hub := t.TempDir()
			put(t, hub, tt.files)
			res, err := hfModel(hub, tt.model, tt.revision)
			if err != nil {
				t.Fatal(err)
			}
			got := strings.Join(res.Missing, "; ")
			if (tt.missing == "") != (got == "") || !strings.Contains(got, tt.missing) {
				t.Errorf("missing %q, want %q (path %s)", got, tt.missing, res.Path)
			}
		})
	}
}

func TestHFHubDir(t *testing.T) {
	for _, tt := range []struct {
		env  map[string]string
		want string
	}{
		{nil, "/h/.cache/huggingface/hub"},
		{map[string]string{"XDG_CACHE_HOME": "/x"}, "/x/huggingface/hub"},
		{map[string]string{"XDG_CACHE_HOME": "/x", "HF_HOME": "/hf"}, "/hf/hub"},
		{map[string]string{"HF_HOME": "/hf", "HF_HUB_CACHE": "/cache"}, "/cache"},
	} {
		if got := hfHubDir(tt.env, "/h"); got != tt.want {
			t.Errorf("hfHubDir(%v) = %s, want %s", tt.env, got, tt.want)
		}
	}
}

// ollamaStore writes a manifest for name with blobs of the given sizes
// (a negative size: the blob is missing; the manifest says -size).
func ollamaStore(t *testing.T, store, manifestRel string, sizes ...int) {
	t.Helper()
	type blob struct {
		MediaType string `json:"mediaType"`
		Digest    string `json:"digest"`
		Size      int    `json:"size"`
	}
	var m struct {
		SchemaVersion int    `json:"schemaVersion"`
		Config        blob   `json:"config"`
		Layers        []blob `json:"layers"`
	}
	m.SchemaVersion = 2
	files := map[string]string{}
	for i, s := range sizes {
		b := blob{MediaType: "application/vnd.ollama.image.model", Digest: "sha256:" + strings.Repeat(string(rune('a'+i)), 64), Size: max(s, -s)}
		if s >= 0 {
			files["blobs/sha256-"+strings.Repeat(string(rune('a'+i)), 64)] = strings.Repeat("x", s)
		}
		if i == 0 {
			m.Config = b
		} else {
			m.Layers = append(m.Layers, b)
		}
	}
	raw, _ := json.Marshal(m)
	files[manifestRel] = string(raw)
	put(t, store, files)
}

func TestOllamaModelCache(t *testing.T) {
	lib := "manifests/registry.ollama.ai/library/"
	for _, tt := range []struct {
		name, model, manifest string
		sizes                 []int
		missing               string
	}{
		{"complete", "llama3.1:8b", lib + "llama3.1/8b", []int{3, 10, 5}, ""},
		{"default tag", "tiny", lib + "tiny/latest", []int{3, 10}, ""},
		{"namespace", "someone/tiny:q4", "manifests/registry.ollama.ai/someone/tiny/q4", []int{3, 10}, ""},
		{"host", "example.com:5000/ns/tiny:q4", "manifests/example.com:5000/ns/tiny/q4", []int{3, 10}, ""},
		{"blob missing", "llama3.1:8b", lib + "llama3.1/8b", []int{3, -10}, "blob sha256:bbbb"},
		{"not pulled", "llama3.1:8b", lib + "llama3.1/70b", []int{3, 10}, "the manifest"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			store := t.TempDir()
			ollamaStore(t, store, tt.manifest, tt.sizes...)
			res, err := ollamaModel(store, tt.model)
			if err != nil {
				t.Fatal(err)
			}
			got := strings.Join(res.Missing, "; ")
			if (tt.missing == "") != (got == "") || !strings.Contains(got, tt.missing) {
				t.Errorf("missing %q, want %q (manifest %s)", got, tt.missing, res.Path)
			}
		})
	}
	t.Run("truncated blob", func(t *testing.T) {
		store := t.TempDir()
		ollamaStore(t, store, lib+"tiny/latest", 3, 10)
		put(t, store, map[string]string{})
		if err := os.WriteFile(filepath.Join(store, "blobs", "sha256-"+strings.Repeat("b", 64)), []byte("xx"), 0o644); err != nil {
			t.Fatal(err)
		}
		res, _ := ollamaModel(store, "tiny")
		if len(res.Missing) != 1 || !strings.Contains(res.Missing[0], "2 of 10 bytes") {
			t.Errorf("missing %q, want the short blob", res.Missing)
		}
	})
}

// unitFiles is a Units that reports only a unit's fragment and drop-ins.
type unitFiles struct{ fragment, dropIn string }

func (unitFiles) Start(context.Context, string) error { return nil }
func (unitFiles) Stop(context.Context, string) error  { return nil }
func (u unitFiles) Unit(_ context.Context, name string) (api.UnitStatus, error) {
	st := api.UnitStatus{Name: name, LoadState: "loaded", FragmentPath: u.fragment}
	if u.dropIn != "" {
		st.DropInPaths = []string{u.dropIn}
	}
	return st, nil
}
func (unitFiles) Subscribe(context.Context, ...string) (<-chan systemd.UnitEvent, error) {
	return nil, errors.New("not here")
}

// cacheConfig is a config with a real (not simulated) vLLM and Ollama
// backend run as the current user.
func cacheConfig(t *testing.T, extra string) *config.Config {
	t.Helper()
	me, err := user.Current()
	if err != nil {
		t.Skip(err)
	}
	y := `
state_dir: ` + t.TempDir() + `
backends:
  vllm: {user: ` + me.Username + `}
  ollama: {user: ` + me.Username + `}
profiles:
  tiny:
    backend: vllm
    model: Org/Tiny
    port: 8000
  small:
    backend: ollama
    model: tiny:q4
    port: 11434
` + extra
	cfg, err := config.Parse("test", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestModelCacheCheck: the check finds the store through the unit's
// Environment= (a drop-in's HF_HOME / OLLAMA_MODELS) and its User=, fails
// on a miss with the command that fetches the model as that user, and only
// warns where it cannot tell or where the backend may download.
func TestModelCacheCheck(t *testing.T) {
	dir := t.TempDir()
	hfHome, models := filepath.Join(dir, "hf"), filepath.Join(dir, "ollama")
	put(t, filepath.Join(hfHome, "hub"), hfRepo(map[string]string{"config.json": "{}", "tokenizer.json": "{}", "model.safetensors": "w"}))
	ollamaStore(t, models, "manifests/registry.ollama.ai/library/tiny/q4", 3, 10)
	me, _ := user.Current()
	put(t, dir, map[string]string{
		"vllm.service":        "[Service]\nUser=" + me.Username + "\nEnvironment=HF_HUB_OFFLINE=1 \"HF_HOME=" + hfHome + "\"\n",
		"ollama.service":      "[Service]\nUser=" + me.Username + "\n",
		"ollama.service.d/ov": "[Service]\nEnvironment=OLLAMA_MODELS=" + models + "\n",
		"plain.service":       "[Service]\nUser=" + me.Username + "\nEnvironment=HOME=" + filepath.Join(dir, "empty") + "\n",
		// HF_HOME from an environment file, which wins over Environment=.
		"envfile.service": "[Service]\nEnvironment=HF_HOME=/nowhere\nEnvironmentFile=-" + filepath.Join(dir, "absent.env") +
			"\nEnvironmentFile=" + filepath.Join(dir, "vllm.env") + "\n",
		"vllm.env": "# gpuhost's and the operator's\nHF_HUB_OFFLINE=1\nHF_HOME=\"" + hfHome + "\"\n",
	})
	frag := func(n string) string { return filepath.Join(dir, n) }
	for _, tt := range []struct {
		name     string
		extra    string
		profile  string
		unit     Units
		severity units.Severity
		want     []string
	}{
		{"vllm in the cache", "", "tiny", unitFiles{fragment: frag("vllm.service")}, units.SeverityOK, []string{"Org/Tiny is complete", rev, "1 weight file"}},
		{"vllm in the cache of an environment file", "", "tiny", unitFiles{fragment: frag("envfile.service")}, units.SeverityOK, []string{"Org/Tiny is complete", hfHome}},
		{"ollama in the store of a drop-in", "", "small", unitFiles{frag("ollama.service"), frag("ollama.service.d/ov")}, units.SeverityOK, []string{"tiny:q4 is complete", "manifest and 2 blob(s)"}},
		{"vllm missing", "", "tiny", unitFiles{fragment: frag("plain.service")}, units.SeverityFail,
			[]string{"Org/Tiny is not complete", "missing the repository folder", "no network to fetch it", "sudo -u " + me.Username + " env HOME=" + filepath.Join(dir, "empty") + " HF_HOME=" + filepath.Join(dir, "empty", ".cache", "huggingface") + " hf download Org/Tiny"}},
		{"ollama missing", "", "small", unitFiles{fragment: frag("plain.service")}, units.SeverityFail,
			[]string{"tiny:q4 is not complete", "missing the manifest", "OLLAMA_MODELS=" + filepath.Join(dir, "empty", ".ollama", "models"), "ollama pull tiny:q4"}},
		{"missing, but the profile may download", "backends:\n  vllm: {network: open}\n", "tiny", unitFiles{fragment: frag("plain.service")}, units.SeverityFail, nil},
		{"simulated", "", "tiny", nil, units.SeverityOK, []string{"simulated backend: no model cache to check"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := cacheConfig(t, "")
			if tt.name == "simulated" {
				cfg.Backends.VLLM.Simulated = true
			}
			if tt.extra != "" {
				cfg.Backends.VLLM.Network = units.NetworkOpen
				cfg.Profiles["tiny"].Network = units.NetworkOpen
				tt.severity, tt.want = units.SeverityWarn, []string{"will try to download it at start", "hf download Org/Tiny"}
			}
			c := modelCacheCheck(context.Background(), cfg, tt.unit, cfg.Profiles[tt.profile])
			text := c.Message + " | fix: " + c.Fix
			if c.ID != CheckModelCache || c.Severity != tt.severity {
				t.Errorf("check %s %s, want %s %s: %s", c.ID, c.Severity, CheckModelCache, tt.severity, text)
			}
			for _, w := range tt.want {
				if !strings.Contains(text, w) {
					t.Errorf("check says %q, want %q in it", text, w)
				}
			}
		})
	}
}

// TestSwitchToMissingModelIsRefused: a switch to a real (not simulated)
// vLLM profile whose model is not in its user's cache is refused before
// anything starts, with the fetch command; nothing changes state.
func TestSwitchToMissingModelIsRefused(t *testing.T) {
	me, err := user.Current()
	if err != nil {
		t.Skip(err)
	}
	f := newProcFixtureYAML(t, func(bin, state string) string {
		y := testConfigYAML(bin, state, "process", "", 18000, 18001, "10ms")
		y = strings.Replace(y, "    simulated: true\n    user: root\n  ollama:", "    user: "+me.Username+"\n  ollama:", 1)
		// Both variants of the served name run the missing model (profiles
		// may share a served name only as variants of one model).
		return strings.ReplaceAll(y, "model: Qwen/Qwen3-Coder-30B-A3B-Instruct\n    served_name: qwen3-coder\n",
			"model: gpuhost-test/never-fetched\n    served_name: qwen3-coder\n")
	})
	if f.cfg.Backends.VLLM.Simulated || f.cfg.Profiles["coder"].Model != "gpuhost-test/never-fetched" {
		t.Fatalf("fixture: vllm simulated %v, model %q", f.cfg.Backends.VLLM.Simulated, f.cfg.Profiles["coder"].Model)
	}
	since := f.sup.LastSeq()
	t0 := time.Now()
	_, _, err = f.sup.Switch(context.Background(), "coder", api.SwitchOptions{})
	took := time.Since(t0)
	var de *api.DoctorError
	if !errors.As(err, &de) {
		t.Fatalf("switch to a model not in the cache: %v, want a doctor refusal", err)
	}
	t.Logf("refused in %.1f ms: %v", float64(took.Microseconds())/1000, de)
	var cache *units.Check
	for i := range de.Checks {
		if de.Checks[i].ID == CheckModelCache {
			cache = &de.Checks[i]
		}
	}
	if cache == nil || !strings.Contains(cache.Fix, "hf download gpuhost-test/never-fetched") {
		t.Fatalf("refusal %v does not carry the model cache check with the fetch command", de.Checks)
	}
	if st := f.sup.State(); st.Phase != api.PhaseIdle {
		t.Errorf("a refused switch changed the state: %+v", st)
	}
	if n := f.sup.LastSeq(); n != since {
		t.Errorf("a refused switch published events (sequence %d → %d), want none", since, n)
	}
}

// TestModelCacheRevisionAndTokenizer: --revision in extra_args picks the
// ref; a --tokenizer from elsewhere is not asked of the snapshot.
func TestModelCacheRevisionAndTokenizer(t *testing.T) {
	dir := t.TempDir()
	hub := filepath.Join(dir, "hf", "hub")
	files := map[string]string{"models--Org--Tiny/refs/v2": rev}
	for n, c := range map[string]string{"config.json": "{}", "model.safetensors": "w"} {
		files["models--Org--Tiny/snapshots/"+rev+"/"+n] = c
	}
	put(t, hub, files)
	put(t, dir, map[string]string{"u.service": "[Service]\nEnvironment=HF_HOME=" + filepath.Join(dir, "hf") + "\n"})
	for _, tt := range []struct {
		extra []string
		want  units.Severity
	}{
		{nil, units.SeverityFail},                          // refs/main is not there
		{[]string{"--revision", "v2"}, units.SeverityFail}, // no tokenizer
		{[]string{"--revision=v2", "--tokenizer", "Org/Tok"}, units.SeverityOK},
	} {
		cfg := cacheConfig(t, "")
		cfg.Profiles["tiny"].VLLM.ExtraArgs = tt.extra
		c := modelCacheCheck(context.Background(), cfg, unitFiles{fragment: filepath.Join(dir, "u.service")}, cfg.Profiles["tiny"])
		if c.Severity != tt.want {
			t.Errorf("extra_args %q: %s %s, want %s", tt.extra, c.Severity, c.Message, tt.want)
		}
	}
}
