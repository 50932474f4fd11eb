package backend

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"gpuhost/units"
)

// Ollama is the protocol of an Ollama server: /api/version answers as soon
// as it listens, a generate request loads a model, /api/ps lists the loaded
// ones.
type Ollama struct {
	p      units.Profile
	client *http.Client
	base   string
}

// NewOllama returns the Ollama protocol for profile p served at baseURL.
func NewOllama(p units.Profile, client *http.Client, baseURL string) *Ollama {
	return &Ollama{p: p, client: client, base: baseURL}
}

// HealthURL is Ollama's /api/version.
func (o *Ollama) HealthURL() string { return o.base + units.HealthPath(units.Ollama) }

// Health asks /api/version once.
func (o *Ollama) Health(ctx context.Context) error { return health(ctx, o.client, o.HealthURL()) }

// Load asks Ollama to load the model now (an empty generate request, with
// the profile's keep_alive, default -1: keep it loaded), so the first
// client request does not pay the load time.
func (o *Ollama) Load(ctx context.Context) (string, error) {
	p := o.p
	keep := p.Ollama.KeepAlive
	if keep == "" {
		keep = "-1"
	}
	var keepAlive any = keep
	if n, err := strconv.Atoi(keep); err == nil {
		keepAlive = n
	}
	body, _ := json.Marshal(map[string]any{"model": p.Model, "keep_alive": keepAlive, "stream": false})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, o.base+"/api/generate", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := o.client.Do(req)
	if err != nil {
		return "", fmt.Errorf("load %s: %w", p.Model, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("load %s: status %d: %s", p.Model, resp.StatusCode, strings.TrimSpace(string(data)))
	}
	var out struct {
		DoneReason string `json:"done_reason"`
	}
	_ = json.Unmarshal(data, &out)
	return fmt.Sprintf("loaded %s (done_reason %q)", p.Model, out.DoneReason), nil
}

// Verify checks that /api/ps lists the profile's model as loaded, and
// reports its size_vram.
func (o *Ollama) Verify(ctx context.Context) (map[string]any, error) {
	detail, names, found, err := o.loaded(ctx)
	if err != nil {
		return nil, err
	}
	if !found {
		return detail, fmt.Errorf("ollama has %v loaded, not %q", names, o.p.Model)
	}
	return detail, nil
}

// loaded reads /api/ps: whether the profile's model is loaded (with its
// size_vram in detail), and the names of all loaded models.
func (o *Ollama) loaded(ctx context.Context) (detail map[string]any, names []string, found bool, err error) {
	detail = map[string]any{}
	var ps struct {
		Models []struct {
			Name     string `json:"name"`
			Model    string `json:"model"`
			SizeVRAM int64  `json:"size_vram"`
		} `json:"models"`
	}
	if err := GetJSON(ctx, o.client, o.base+"/api/ps", &ps); err != nil {
		return nil, nil, false, err
	}
	for _, m := range ps.Models {
		names = append(names, m.Name)
		if SameOllamaModel(m.Name, o.p.Model) || SameOllamaModel(m.Model, o.p.Model) {
			found = true
			detail["size_vram"] = m.SizeVRAM
		}
	}
	return detail, names, found, nil
}

// SameOllamaModel compares Ollama model names the way Ollama does: a name
// without a tag means ":latest".
func SameOllamaModel(a, b string) bool {
	norm := func(s string) string {
		if !strings.Contains(s, ":") {
			return s + ":latest"
		}
		return s
	}
	return a != "" && norm(a) == norm(b)
}

var (
	_ Backend = (*Ollama)(nil)
	_ Loader  = (*Ollama)(nil)
)
