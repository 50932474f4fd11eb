package api

import "time"

// Event is one observable thing the Supervisor did or saw: a switch step
// starting or ending (with its duration), a state change, a reconciliation.
// Events feed the SSE stream, the CLI's live switch output and the log.
type Event struct {
	Seq        uint64         `json:"seq"`
	Time       time.Time      `json:"time"`
	Kind       string         `json:"kind"` // switch, step, state, reconcile
	SwitchID   string         `json:"switch_id,omitempty"`
	Profile    string         `json:"profile,omitempty"`
	Step       string         `json:"step,omitempty"`
	Status     string         `json:"status,omitempty"` // started, done, failed, info
	DurationMS float64        `json:"duration_ms,omitempty"`
	Message    string         `json:"message,omitempty"`
	Journal    []string       `json:"journal,omitempty"`
	Detail     map[string]any `json:"detail,omitempty"`
}
