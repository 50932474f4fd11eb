package appliance

import (
	"context"

	"gpuhost/api"
	"gpuhost/units"
)

// Profiles lists the configured profiles, marking the active one.
func (s *Supervisor) Profiles() []api.ProfileInfo {
	st := s.State()
	var out []api.ProfileInfo
	for _, name := range s.cfg.ProfileNames() {
		p := s.cfg.Profiles[name]
		bc := s.cfg.BackendFor(p.Backend)
		out = append(out, api.ProfileInfo{
			Name: name, Backend: p.Backend, Model: p.Model, ServedName: p.ServedName, Port: p.Port,
			Unit: bc.Unit, Active: st.Phase == api.PhaseActive && st.Profile == name, Args: units.BackendArgs(*p, bc.Simulated),
			AutoToolChoice: p.VLLM.EnableAutoToolChoice, ToolCallParser: p.VLLM.ToolCallParser, Standby: p.Standby,
		})
		if v, ok := s.apis.Load(name); ok {
			out[len(out)-1].APIs = v.([]string)
		}
		if p.Params.TotalParamsB > 0 {
			mp := p.Params
			out[len(out)-1].ModelParams = &mp
		}
		if p.Backend == units.Ollama {
			out[len(out)-1].Context = p.Ollama.NumCtx
		} else {
			out[len(out)-1].Context = p.VLLM.MaxModelLen
		}
	}
	return out
}

// Status gathers state, GPU and units; a failing component shows as an
// error field, never as a failed request.
func (s *Supervisor) Status(ctx context.Context) api.Status {
	out := api.Status{State: s.State(), Profiles: s.Profiles(), Units: []api.UnitStatus{}, LastSwitch: s.LastSwitch(), Telegram: s.TelegramStatus()}
	if snap, err := s.snapshot(ctx); err != nil {
		out.GPUError = err.Error()
	} else {
		out.GPU = &snap
	}
	if bs, err := s.backends(ctx); err == nil {
		for _, b := range bs {
			out.Units = append(out.Units, b.status)
		}
	}
	return out
}
