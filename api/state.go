package api

import (
	"fmt"
	"strings"
	"time"

	"gpuhost/units"
)

// Phase is the Supervisor's coarse state.
type Phase string

// Phases of the state machine.
const (
	PhaseIdle      Phase = "idle"
	PhaseSwitching Phase = "switching"
	PhaseActive    Phase = "active"
	PhaseFailed    Phase = "failed"
)

// State is derived from systemd and NVML (and, during a switch, from the
// switch itself); only LastWanted is persisted.
type State struct {
	Phase      Phase         `json:"phase"`
	Profile    string        `json:"profile,omitempty"`
	Backend    units.Backend `json:"backend,omitempty"`
	Unit       string        `json:"unit,omitempty"`
	Target     string        `json:"target,omitempty"`
	Step       string        `json:"step,omitempty"`
	SwitchID   string        `json:"switch_id,omitempty"`
	Error      string        `json:"error,omitempty"`
	LastError  string        `json:"last_error,omitempty"`
	Since      time.Time     `json:"since"`
	LastWanted string        `json:"last_wanted,omitempty"`
	// Paused is the profile whose active backend the operator stopped by
	// hand (a clean `systemctl stop`): nothing is wanted until
	// `gpuhost heal` (which resumes it) or a switch.
	Paused string `json:"paused,omitempty"`
	// NotServing says why the last wanted profile does not serve (a crash
	// loop, a failed switch, nothing running although it is wanted); ""
	// while it serves, while a switch runs, or when nothing is wanted.
	// `gpuhost status` and the doctor fail while it is set.
	NotServing string `json:"not_serving,omitempty"`
	// Standby lists the backends kept running in standby (asleep or
	// unloaded), ready to wake in seconds instead of a cold start.
	Standby []StandbyInfo `json:"standby,omitempty"`
	// Lane and GPUs name the GPU set this state is for, on a box whose
	// profiles run on several GPU sets (lanes); empty on a box of one.
	Lane string `json:"lane,omitempty"`
	GPUs []int  `json:"gpus,omitempty"`
	// Lanes is every lane's own state, GPU 0's first (which is also the
	// state around it), on a box of several lanes.
	Lanes []State `json:"lanes,omitempty"`
}

// StandbyInfo is one backend in standby: which profile it serves once
// woken, how it sleeps, and the GPU memory it still holds.
type StandbyInfo struct {
	Profile string `json:"profile"`
	Unit    string `json:"unit"`
	// Mode is how it sleeps: "sleep1", "sleep2" (vLLM levels) or "unload"
	// (Ollama).
	Mode string `json:"mode"`
	// ResidualMiB is what it holds while asleep, measured with NVML at its
	// first sleep (0 before it was measured).
	ResidualMiB uint64    `json:"residual_mib"`
	Since       time.Time `json:"since"`
}

// SwitchOptions modify a switch request.
type SwitchOptions struct {
	// Force skips the profile's failing doctor checks.
	Force bool
}

// SwitchSummary is the outcome of the most recent switch, for the panel,
// the bot and the metrics.
type SwitchSummary struct {
	ID         string    `json:"id"`
	Profile    string    `json:"profile"`
	OK         bool      `json:"ok"`
	Error      string    `json:"error,omitempty"`
	StartedAt  time.Time `json:"started_at"`
	DurationMS float64   `json:"duration_ms"`
}

// LaneLine is one lane in one line, as `gpuhost status`, the panel, the
// Telegram bot and the MCP tools show what serves on each GPU set:
// "GPU 1: active: llama3-8b (ollama)", "GPU 0: switching to gemma3-27b:
// vram_release", "GPU 0+1: idle", with the profiles its lane keeps in
// standby ("· qwen3-coder in standby (sleep1)") and, while its wanted
// profile does not serve, why ("; NOT SERVING: …").
func LaneLine(l State) string {
	var b strings.Builder
	b.WriteString(l.Lane + ": " + StatusLine(l, nil))
	for _, sb := range l.Standby {
		fmt.Fprintf(&b, " · %s in standby (%s)", sb.Profile, sb.Mode)
	}
	if l.NotServing != "" {
		b.WriteString("; NOT SERVING: " + l.NotServing)
	}
	return b.String()
}
