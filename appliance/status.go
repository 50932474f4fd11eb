package appliance

import (
	"context"
	"slices"

	"gpuhost/api"
	"gpuhost/config"
	"gpuhost/nvml"
	"gpuhost/systemd"
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
			Unit: bc.Unit, GPUs: p.GPUs.String(), Active: st.Phase == api.PhaseActive && st.Profile == name, Args: units.BackendArgs(*p, bc.Simulated),
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
	bs, err := s.backends(ctx)
	if err == nil {
		for _, b := range bs {
			out.Units = append(out.Units, b.status)
		}
	}
	if out.GPU != nil {
		out.GPUs = gpuStatuses(*out.GPU, bs, s.cfg)
	}
	return out
}

// gpuStatuses is every GPU of snap with its holders matched to the backend
// units by cgroup, and the profiles the config places on it.
func gpuStatuses(snap nvml.Snapshot, bs []backendState, cfg *config.Config) []api.GPUStatus {
	out := make([]api.GPUStatus, 0, len(snap.Devices))
	for _, d := range snap.Devices {
		g := api.GPUStatus{Index: d.Index, UUID: d.UUID, Name: d.Name, PCIBusID: d.PCIBusID,
			MemoryUsedMiB: d.MemoryUsedMiB, MemoryTotalMiB: d.MemoryTotalMiB, Holders: []api.GPUHolder{}}
		for _, p := range d.Processes {
			h := api.GPUHolder{PID: p.PID, Name: p.Name, UsedMiB: p.UsedMiB}
			for _, b := range bs {
				if b.status.Active() && systemd.InUnits(p.PID, b.status) {
					h.Unit, h.Profile = b.unit, b.profile
					break
				}
			}
			g.Holders = append(g.Holders, h)
		}
		for _, name := range cfg.ProfileNames() {
			if slices.Contains(cfg.Profiles[name].GPUs.Resolved(), d.Index) {
				g.Profiles = append(g.Profiles, name)
			}
		}
		out = append(out, g)
	}
	return out
}
