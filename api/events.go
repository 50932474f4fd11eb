package api

import "time"

// Event is one observable thing the Supervisor did or saw: a switch step
// starting or ending (with its duration), a state change, a reconciliation.
// Events feed the SSE stream, the CLI's live switch output, the panel, the
// Telegram notices, the metrics, the activity history and the log. Kind says
// what it is about, Status how it went; both are typed so that every reader
// matches the same constants and the wire format (the strings below) is
// written in one place.
type Event struct {
	Seq        uint64         `json:"seq"`
	Time       time.Time      `json:"time"`
	Kind       EventKind      `json:"kind"`
	SwitchID   string         `json:"switch_id,omitempty"`
	Profile    string         `json:"profile,omitempty"`
	Step       string         `json:"step,omitempty"`
	Status     EventStatus    `json:"status,omitempty"`
	DurationMS float64        `json:"duration_ms,omitempty"`
	Message    string         `json:"message,omitempty"`
	Journal    []string       `json:"journal,omitempty"`
	Detail     map[string]any `json:"detail,omitempty"`
}

// EventKind says what an Event is about. The strings are the wire format
// of /api/events (SSE), /api/switch/{id} and the event log; the panel's
// script matches some of them.
type EventKind string

// The kinds of events, with who emits them and what they mean.
const (
	// EventSwitch is a switch as a whole, emitted by the Supervisor's
	// switch: StatusStarted when requested, StatusInfo when it rolls back
	// (Profile is the profile it rolls back to), StatusDone (DurationMS is
	// the total) or StatusFailed at its end. SwitchID is set.
	EventSwitch EventKind = "switch"
	// EventStep is one step of a switch (Step names it: the Step
	// constants, with StepRollback before a rollback's steps):
	// StatusStarted, then StatusDone or StatusFailed with DurationMS, and
	// StatusInfo for a step that only reports (standby). SwitchID is set.
	EventStep EventKind = "step"
	// EventState is a change of the Supervisor's derived state (Detail
	// "phase", "unit"), including a backend that left active without
	// gpuhost asking.
	EventState EventKind = "state"
	// EventReconcile is the Supervisor's decision at start-up: which
	// profile it restores, or that a paused profile stays stopped.
	EventReconcile EventKind = "reconcile"
	// EventUnit is a backend unit's systemd state change as the watcher
	// saw it (Detail "unit", "active_state", "sub_state", DetailLog).
	EventUnit EventKind = "unit"
	// EventHand is an action the operator took by hand outside gpuhost (a
	// `systemctl restart`/`start`/`stop` of a backend unit) that the
	// Supervisor noticed and follows (Detail "unit", "action"); StatusInfo.
	EventHand EventKind = "hand"
	// EventCrash is a backend that exited or failed without gpuhost asking
	// (DetailUnit, DetailReason, DetailLog, "restarts_in_window");
	// StatusFailed. The crash-loop guard answers it with EventHeal.
	EventCrash EventKind = "crash"
	// EventHeal is the crash-loop guard's answer to a crash: StatusDone
	// when the restarted backend serves again, StatusFailed when it gave
	// up (Journal holds the unit's last lines).
	EventHeal EventKind = "heal"
	// EventPaused says the active backend was stopped cleanly by hand:
	// nothing is wanted until `gpuhost heal` or a switch (DetailUnit,
	// "action" stop); StatusInfo.
	EventPaused EventKind = "paused"
	// EventStandby is a change to a backend in standby outside a switch
	// (it stopped, or it was adopted into standby); StatusInfo.
	EventStandby EventKind = "standby"
	// EventExclusion is the exclusion rule acting: a unit that ran beside
	// the active one was adopted, put into standby or stopped (StatusDone),
	// or a unit in standby holds more than its residual (StatusFailed).
	// DetailDrift names the finding, DetailUnit the unit.
	EventExclusion EventKind = "exclusion"
	// EventDrift is the watcher finding the active backend not as gpuhost
	// made it (asleep behind its back, a foreign model loaded): StatusDone
	// when put right, StatusFailed when not. DetailDrift names the finding.
	EventDrift EventKind = "drift"
	// EventWakeCheck is a woken (or, with "cold" true, cold-started)
	// backend that failed its check against the profile's reference
	// answer and speed (DetailReason says which part); StatusFailed. The
	// switch restarts a woken one cold.
	EventWakeCheck EventKind = "wake_check"
	// EventBench is a line of progress from a benchmark the daemon runs.
	EventBench EventKind = "bench"
)

// EventKinds lists every kind, in the order documented above.
func EventKinds() []EventKind {
	return []EventKind{EventSwitch, EventStep, EventState, EventReconcile, EventUnit, EventHand,
		EventCrash, EventHeal, EventPaused, EventStandby, EventExclusion, EventDrift, EventWakeCheck, EventBench}
}

// EventStatus says how the thing an Event reports went; "" for kinds that
// carry none (state, reconcile, unit, bench).
type EventStatus string

// The statuses of events.
const (
	// StatusStarted: a switch or a step began.
	StatusStarted EventStatus = "started"
	// StatusDone: it ended well (or a finding was put right).
	StatusDone EventStatus = "done"
	// StatusFailed: it ended badly (or a finding stays).
	StatusFailed EventStatus = "failed"
	// StatusInfo: a report that neither starts nor ends anything.
	StatusInfo EventStatus = "info"
)

// EventStatuses lists every status.
func EventStatuses() []EventStatus {
	return []EventStatus{StatusStarted, StatusDone, StatusFailed, StatusInfo}
}

// Done reports whether s ends what it reports: done or failed.
func (s EventStatus) Done() bool { return s == StatusDone || s == StatusFailed }

// Steps of a switch (Event.Step of EventStep events), in
// the order a switch runs them; a switch runs only those it needs. The
// panel, bench, the activity history and /v1/models read them.
const (
	StepDrain       = "drain"        // requests in flight on what is in the way may finish
	StepStandby     = "standby"      // what is in the way goes to sleep instead of stopping
	StepStop        = "stop"         // what is in the way stops
	StepVRAMRelease = "vram_release" // the driver gave the memory back
	StepWake        = "wake"         // the target in standby wakes: no cold start
	StepConfigure   = "configure"    // the target's unit is written
	StepStart       = "start"        // the target's unit starts: a cold start
	StepReady       = "ready"        // the target answers its health check
	StepLoadModel   = "load_model"   // Ollama loads the model
	StepVerify      = "verify"       // the target serves the model, memory as expected
	StepWakeCheck   = "wake_check"   // the answer to the reference prompt is as recorded
	// StepRollback prefixes the steps of a rollback to the previous
	// profile ("rollback.wake"): they are not the target's.
	StepRollback = "rollback."
)

// Steps lists the step names above, without the rollback prefix.
func Steps() []string {
	return []string{StepDrain, StepStandby, StepStop, StepVRAMRelease, StepWake, StepConfigure, StepStart,
		StepReady, StepLoadModel, StepVerify, StepWakeCheck}
}

// Keys of Event.Detail that readers in other packages look up. Producers
// may add other keys; these are the ones the panel, the metrics, Telegram
// and the activity history depend on.
const (
	// DetailUnit is the backend unit an event is about.
	DetailUnit = "unit"
	// DetailReason is why a backend crashed (systemd's result: "signal",
	// "exit-code", …) or why a wake check failed: a metric label.
	DetailReason = "reason"
	// DetailLog is the command that shows the unit's log.
	DetailLog = "log"
	// DetailDrift names a watcher finding (stray_unit, asleep,
	// foreign_model, standby_awake, several_active, verify_failed, and the
	// box's per-GPU wrong_gpu and gpu_shared): a metric label.
	DetailDrift = "drift"
	// DetailUsedMiB and DetailTotalMiB are GPU memory figures (used by
	// the vram_release and verify steps, held by a unit).
	DetailUsedMiB = "used_mib"
	// DetailGPU is the NVML index of the GPU an event is about.
	DetailGPU      = "gpu"
	DetailTotalMiB = "total_mib"
	// DetailDrained and DetailCut count the requests the drain step let
	// finish and the ones it cut.
	DetailDrained = "drained"
	DetailCut     = "cut"
)

// DetailKeys lists the Detail keys above.
func DetailKeys() []string {
	return []string{DetailUnit, DetailReason, DetailLog, DetailDrift, DetailUsedMiB, DetailTotalMiB, DetailGPU, DetailDrained, DetailCut}
}
