package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"gpuhost/api"
	"gpuhost/internal/apishape"
	"gpuhost/units"
)

// Model status values in GET /v1/models.
const (
	StatusLoaded    = "loaded"     // the active backend serves it now
	StatusLoading   = "loading"    // a switch to its profile is running
	StatusNotLoaded = "not_loaded" // configured; a switch (or auto_switch) loads it
)

// ModelCard is one entry of GET /v1/models: the OpenAI model object plus
// gpuhost's fields. Aliases appear both in Aliases and as their own entries
// (AliasOf set), so a client that only lists ids can pick them.
type ModelCard struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	// Root is the underlying model (Hugging Face id or Ollama tag).
	Root string `json:"root,omitempty"`
	// MaxModelLen is the context length in tokens (vLLM's own field name):
	// for the loaded vLLM model as the backend reports it, otherwise the
	// profile's max_model_len or Ollama num_ctx; absent when unknown.
	MaxModelLen int           `json:"max_model_len,omitempty"`
	Status      string        `json:"status"`
	Profile     string        `json:"profile"`
	Backend     units.Backend `json:"backend"`
	Aliases     []string      `json:"aliases,omitempty"`
	AliasOf     string        `json:"alias_of,omitempty"`
	// Gpuhost says, for a router in front of several boxes, whether the
	// model serves now, sleeps (and how fast it wakes) or must cold-start.
	Gpuhost *Readiness `json:"gpuhost,omitempty"`
}

// ModelList is the body of GET /v1/models.
type ModelList struct {
	Object string      `json:"object"`
	Data   []ModelCard `json:"data"`
}

func (p *Proxy) handleModels(c echo.Context) error {
	ctx, cancel := context.WithTimeout(c.Request().Context(), 3*time.Second)
	defer cancel()
	return c.JSON(http.StatusOK, p.Models(ctx))
}

// handleModel answers GET /v1/models/{id} (ids may contain '/').
func (p *Proxy) handleModel(c echo.Context) error {
	id := c.Param("*")
	ctx, cancel := context.WithTimeout(c.Request().Context(), 3*time.Second)
	defer cancel()
	list := p.Models(ctx)
	for _, m := range list.Data {
		if m.ID == id {
			return c.JSON(http.StatusOK, m)
		}
	}
	e := p.modelError(http.StatusNotFound, "model_not_found", fmt.Sprintf("unknown model %q", id), p.profiles(), p.sup.State())
	writeError(c.Response(), e, apishape.Other)
	return nil
}

// Models lists every configured model: the loaded ones first (one per
// lane, GPU 0's first), then the others by name. Profiles that share a served name appear once (as the
// active one if either is active).
func (p *Proxy) Models(ctx context.Context) ModelList {
	profiles := p.profiles()
	st := p.sup.State()
	// Every lane (GPU set) serves on its own: each lane's current model
	// is listed with that lane's state.
	states := []api.State{st}
	if len(st.Lanes) > 0 {
		states = st.Lanes
	}
	stateOf := func(name string) api.State {
		if p.lanes != nil {
			return p.lanes.of(name).State()
		}
		return st
	}
	out := ModelList{Object: "list", Data: []ModelCard{}}
	seen := map[string]bool{}
	add := func(prof *units.Profile, status string, st api.State) {
		cur := currentProfile(st)
		served := prof.ServedModelName()
		if seen[served] {
			return
		}
		card := ModelCard{ID: served, Object: "model", Created: p.created, OwnedBy: "gpuhost", Root: prof.Model,
			Status: status, Profile: prof.Name, Backend: prof.Backend, MaxModelLen: profileContext(prof),
			Gpuhost: p.readiness(prof.Name, st, cur)}
		if status == StatusLoaded {
			card.Created = st.Since.Unix()
			if n := p.liveModelLen(ctx, prof, st); n > 0 {
				card.MaxModelLen = n
			}
		}
		var aliases []ModelCard
		for _, a := range prof.Aliases {
			if seen[a] || a == served {
				continue
			}
			card.Aliases = append(card.Aliases, a)
			ac := card
			ac.ID, ac.Aliases, ac.AliasOf = a, nil, served
			aliases = append(aliases, ac)
		}
		for _, id := range append([]string{served}, card.Aliases...) {
			seen[id] = true
		}
		out.Data = append(out.Data, card)
		out.Data = append(out.Data, aliases...)
	}
	for _, ls := range states {
		if prof := profiles[currentProfile(ls)]; prof != nil {
			switch {
			case ls.Phase == api.PhaseActive && ls.Step == "":
				add(prof, StatusLoaded, ls)
			default:
				add(prof, StatusLoading, ls)
			}
		}
	}
	for _, name := range sortedNames(profiles) {
		add(profiles[name], StatusNotLoaded, stateOf(name))
	}
	return out
}

// profileContext is the context length a profile configures (0 = the
// backend's default, unknown here).
func profileContext(prof *units.Profile) int {
	if prof.Backend == units.Ollama {
		return prof.Ollama.NumCtx
	}
	return prof.VLLM.MaxModelLen
}

// liveModelLen asks the running vLLM for its max_model_len (it may differ
// from the profile: vLLM picks the model's own when none is configured). The
// answer is cached for the life of that backend.
func (p *Proxy) liveModelLen(ctx context.Context, prof *units.Profile, st api.State) int {
	if prof.Backend != units.VLLM {
		return 0
	}
	key := prof.Name + "@" + st.Since.String()
	p.lenMu.Lock()
	n, ok := p.lenCache[key]
	p.lenMu.Unlock()
	if ok {
		return n
	}
	n, err := fetchModelLen(ctx, p.transport, "http://"+backendHost(prof)+"/v1/models", prof.ServedModelName())
	if err != nil {
		p.log.Debug("ask the backend for max_model_len", "profile", prof.Name, "err", err)
		return 0
	}
	p.lenMu.Lock()
	if len(p.lenCache) > 64 {
		clear(p.lenCache) // one entry per backend start; keep it from growing forever
	}
	p.lenCache[key] = n
	p.lenMu.Unlock()
	return n
}

// fetchModelLen reads max_model_len of served from a vLLM /v1/models.
func fetchModelLen(ctx context.Context, rt http.RoundTripper, url, served string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, fmt.Errorf("GET %s: %w", url, err)
	}
	resp, err := (&http.Client{Transport: rt}).Do(req)
	if err != nil {
		return 0, fmt.Errorf("GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET %s: status %d", url, resp.StatusCode)
	}
	var list struct {
		Data []struct {
			ID          string `json:"id"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&list); err != nil {
		return 0, fmt.Errorf("GET %s: decode: %w", url, err)
	}
	var ids []string
	for _, m := range list.Data {
		if m.ID == served {
			return m.MaxModelLen, nil
		}
		ids = append(ids, m.ID)
	}
	return 0, fmt.Errorf("GET %s: %q not among %s", url, served, strings.Join(ids, ", "))
}
