package api

import (
	"context"
	"fmt"
	"strings"

	"gpuhost/nvml"
	"gpuhost/units"
)

// APIError is the JSON body of every error answer: a short error and a
// detail that names what was wrong, plus optional structured context.
type APIError struct {
	Error  string `json:"error"`
	Detail string `json:"detail"`
	Extra  any    `json:"extra,omitempty"`
}

// Status is the answer of GET /api/status and `gpuhost status`.
type Status struct {
	State    State          `json:"state"`
	GPU      *nvml.Snapshot `json:"gpu,omitempty"`
	GPUError string         `json:"gpu_error,omitempty"`
	// GPUs is every GPU with who holds memory on it (absent when the GPU
	// facts are unavailable).
	GPUs     []GPUStatus   `json:"gpus,omitempty"`
	Units    []UnitStatus  `json:"units"`
	Profiles []ProfileInfo `json:"profiles"`
	// LastSwitch is the most recent finished switch, if any.
	LastSwitch *SwitchSummary `json:"last_switch,omitempty"`
	// Telegram is the bot's health; absent when telegram.enabled is false.
	Telegram *TelegramStatus `json:"telegram,omitempty"`
}

// ProfileInfo is a profile as listed to clients.
type ProfileInfo struct {
	Name       string        `json:"name"`
	Backend    units.Backend `json:"backend"`
	Model      string        `json:"model"`
	ServedName string        `json:"served_name"`
	Port       int           `json:"port"`
	Unit       string        `json:"unit"`
	// GPUs is where the profile runs as configured: "[0]", "[0, 1]" or
	// "auto".
	GPUs   string   `json:"gpus"`
	Active bool     `json:"active"`
	Args   []string `json:"args"`
	// Context is the configured context length in tokens (vLLM
	// max_model_len, Ollama num_ctx); 0: the backend's default.
	Context int `json:"context,omitempty"`
	// AutoToolChoice and ToolCallParser: vLLM's enable_auto_tool_choice and
	// tool_call_parser (without both a request with tools is refused).
	AutoToolChoice bool   `json:"auto_tool_choice,omitempty"`
	ToolCallParser string `json:"tool_call_parser,omitempty"`
	// ModelParams is the profile's model_params (absent when unknown), so
	// a client benchmarking through the daemon can draw the roofline.
	ModelParams *units.ModelParams `json:"model_params,omitempty"`
	// Standby is the profile's standby mode ("" or "off": stopped when
	// switched away).
	Standby units.Standby `json:"standby,omitempty"`
	// APIs are the /v1 APIs the profile's backend served when it was last
	// verified (chat, messages, count_tokens, responses); absent when it
	// has not run since the daemon started.
	APIs []string `json:"apis,omitempty"`
}

// StatusLine is the one-line summary for systemd's STATUS= and the log,
// e.g. "active: qwen3-coder (vllm) · 18.4/24.0 GiB".
func StatusLine(st State, snap *nvml.Snapshot) string {
	var b strings.Builder
	switch st.Phase {
	case PhaseActive:
		fmt.Fprintf(&b, "active: %s (%s)", st.Profile, st.Backend)
	case PhaseSwitching:
		fmt.Fprintf(&b, "switching to %s: %s", st.Target, st.Step)
	case PhaseFailed:
		fmt.Fprintf(&b, "failed: %s", st.Error)
	default:
		b.WriteString("idle")
	}
	if snap != nil {
		if d, ok := snap.Device0(); ok {
			fmt.Fprintf(&b, " · %.1f/%.1f GiB", float64(d.MemoryUsedMiB)/1024, float64(d.MemoryTotalMiB)/1024)
		}
	}
	return b.String()
}

// DoctorFunc runs the doctor for the API (the serve command wires it with
// the daemon's GPU and unit connections).
type DoctorFunc func(ctx context.Context, profile string) DoctorReport

// SwitchRequest is the body of POST /api/switch.
type SwitchRequest struct {
	Profile string `json:"profile"`
	Force   bool   `json:"force"`
	// Wait makes the request return when the switch has finished.
	Wait bool `json:"wait"`
}

// HealRequest is the body of POST /api/heal, which starts the wanted
// profile again (the last wanted, else the one stopped by hand) and resets
// the crash count; it answers like POST /api/switch.
type HealRequest struct {
	// Wait makes the request return when the switch has finished.
	Wait bool `json:"wait"`
}

// SwitchAccepted answers a started switch.
type SwitchAccepted struct {
	SwitchID string `json:"switch_id"`
	Profile  string `json:"profile"`
	// Events is where to follow it (SSE), starting after the last event
	// that preceded the switch.
	Events string `json:"events"`
	State  *State `json:"state,omitempty"`
}
