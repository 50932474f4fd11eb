package backend

import (
	"context"
	"fmt"
	"net/http"

	"gpuhost/units"
)

// VLLM is the protocol of a vLLM OpenAI-compatible server: /health answers
// once the engine (and so the model) is up, /v1/models lists the served
// names.
type VLLM struct {
	p      units.Profile
	client *http.Client
	base   string
}

// NewVLLM returns the vLLM protocol for profile p served at baseURL.
func NewVLLM(p units.Profile, client *http.Client, baseURL string) *VLLM {
	return &VLLM{p: p, client: client, base: baseURL}
}

// HealthURL is vLLM's /health.
func (v *VLLM) HealthURL() string { return v.base + units.HealthPath(units.VLLM) }

// Health asks /health once.
func (v *VLLM) Health(ctx context.Context) error { return health(ctx, v.client, v.HealthURL()) }

// Verify checks that /v1/models lists the profile's served_name, and
// reports its max_model_len.
func (v *VLLM) Verify(ctx context.Context) (map[string]any, error) {
	detail := map[string]any{}
	var models struct {
		Data []struct {
			ID          string `json:"id"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	if err := GetJSON(ctx, v.client, v.base+"/v1/models", &models); err != nil {
		return nil, err
	}
	var ids []string
	found := false
	for _, m := range models.Data {
		ids = append(ids, m.ID)
		if m.ID == v.p.ServedName {
			found = true
			detail["max_model_len"] = m.MaxModelLen
		}
	}
	if !found {
		return detail, fmt.Errorf("backend serves %v, not the profile's served_name %q", ids, v.p.ServedName)
	}
	return detail, nil
}

var _ Backend = (*VLLM)(nil)
