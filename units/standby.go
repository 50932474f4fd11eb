package units

import (
	"fmt"
	"slices"
	"strings"
)

// Standby is what a switch away from a profile does with its backend when
// the next profile runs on the other unit. Stopping the unit (off, the
// default) is the safest and the slowest way back: a vLLM cold start takes
// tens of seconds to minutes. Standby keeps the unit running with its GPU
// memory given back, so the way back is a wake of seconds:
//
//   - sleep1: vLLM sleep level 1 — weights offloaded to host RAM, KV cache
//     discarded; wake copies the weights back (needs host RAM for them).
//   - sleep2: vLLM sleep level 2 — weights and KV cache discarded; wake
//     reloads the weights (from the page cache) but keeps the process, CUDA
//     graphs and compile caches.
//   - unload: Ollama unloads the model (keep_alive 0); the server holds no
//     GPU memory until the next load.
//   - auto: the Supervisor picks at switch time the cheapest mode that is
//     safe (vLLM: level 1 when host RAM holds the weights with margin, else
//     level 2; Ollama: unload) and says why in an event.
//
// A backend in standby still holds a residual (vLLM keeps its CUDA context
// and some allocations): the Supervisor measures it per profile and
// enforces that at most one backend holds more than its residual.
type Standby string

// The standby modes; "" reads as StandbyOff.
const (
	StandbyOff    Standby = "off"
	StandbyAuto   Standby = "auto"
	StandbySleep1 Standby = "sleep1"
	StandbySleep2 Standby = "sleep2"
	StandbyUnload Standby = "unload"
)

// EnvVLLMDevMode makes vLLM serve its sleep-mode endpoints (/sleep,
// /wake_up, /is_sleeping); without it they do not exist. gpuhost sets it
// only for profiles with standby, whose server listens on loopback only
// (VLLMArgs adds --host 127.0.0.1), because the same switch also exposes
// vLLM's other development endpoints.
const EnvVLLMDevMode = "VLLM_SERVER_DEV_MODE"

// standbyModes are the modes each engine can do.
var standbyModes = map[Backend][]Standby{
	VLLM:   {StandbyOff, StandbyAuto, StandbySleep1, StandbySleep2},
	Ollama: {StandbyOff, StandbyAuto, StandbyUnload},
}

// Enabled reports whether a switch away keeps the unit running in standby.
func (s Standby) Enabled() bool { return s != "" && s != StandbyOff }

// StandbyEnabled reports whether the profile goes into standby rather than
// being stopped when a switch goes to the other backend unit.
func (p Profile) StandbyEnabled() bool { return p.Standby.Enabled() }

// validateStandby names what is wrong with the profile's standby key.
func (p Profile) validateStandby() string {
	modes, ok := standbyModes[p.Backend]
	if !ok || p.Standby == "" || slices.Contains(modes, p.Standby) {
		return ""
	}
	names := make([]string, len(modes))
	for i, m := range modes {
		names[i] = string(m)
	}
	return fmt.Sprintf("%q is not a standby mode for %s (one of: %s)", p.Standby, p.Backend, strings.Join(names, ", "))
}

// CheckStandbyFit is the id of the check that the profile still fits next
// to the other backend's standby residual.
const CheckStandbyFit = "profile.standby_fit"

// standbyFitChecks: with the other backend in standby, its residual stays
// on the card. vLLM refuses to start unless gpu_memory_utilization × total
// is free, so the residual must fit in the rest; an Ollama model must fit
// in what the residual leaves. No check without a residual to count.
func standbyFitChecks(p Profile, gpu GPUFacts) []Check {
	if gpu.ReservedMiB == 0 || gpu.TotalMiB == 0 {
		return nil
	}
	c := Check{ID: CheckStandbyFit, Value: fmt.Sprintf("%d MiB reserved", gpu.ReservedMiB)}
	if p.Backend == VLLM {
		u := effectiveUtil(p)
		left := uint64((1 - u) * float64(gpu.TotalMiB))
		if left < gpu.ReservedMiB {
			c.Severity = SeverityFail
			c.Message = fmt.Sprintf("gpu_memory_utilization %s leaves %d MiB of %d, less than the other backend's standby residual of %d MiB: vLLM refuses to start while the other sleeps",
				fmtFloat(u), left, gpu.TotalMiB, gpu.ReservedMiB)
			c.Fix = fmt.Sprintf("lower vllm.gpu_memory_utilization to at most %s, or set the other backend's standby to off",
				fmtFloat(float64(gpu.TotalMiB-gpu.ReservedMiB)/float64(gpu.TotalMiB)-0.005))
			return []Check{c}
		}
		c.Severity = SeverityOK
		c.Message = fmt.Sprintf("leaves %d MiB beside the other backend's standby residual of %d MiB", left-gpu.ReservedMiB, gpu.ReservedMiB)
		return []Check{c}
	}
	if p.Params.TotalParamsB == 0 {
		return nil
	}
	weights, _, kv := EstimateVRAM(p)
	need := (weights + kv + VRAMOverheadBytes) / (1 << 20)
	room := float64(gpu.TotalMiB - min(gpu.TotalMiB, gpu.ReservedMiB))
	if need > room {
		c.Severity = SeverityFail
		c.Message = fmt.Sprintf("needs ~%.0f MiB but the other backend's standby residual leaves %.0f MiB: Ollama would offload layers to the CPU", need, room)
		c.Fix = "lower ollama.num_ctx, use a smaller quantisation, or set the other backend's standby to off"
		return []Check{c}
	}
	c.Severity = SeverityOK
	c.Message = fmt.Sprintf("needs ~%.0f MiB of the %.0f MiB the other backend's standby residual leaves", need, room)
	return []Check{c}
}
