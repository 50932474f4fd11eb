package api

import "time"

// UnitStatus is what the Supervisor and the status views need to know about a
// unit, read from systemd's D-Bus properties. Fields a unit type does not
// have (MainPID of a target) are zero.
type UnitStatus struct {
	// Name is the unit's primary name (an alias resolves to it).
	Name string `json:"name"`
	// LoadState: "loaded", "not-found", "masked", "bad-setting", "error".
	LoadState string `json:"load_state"`
	// ActiveState: "active", "activating", "deactivating", "reloading",
	// "inactive", "failed", "maintenance", "refreshing".
	ActiveState string `json:"active_state"`
	// SubState is the type-specific state ("running", "start-pre", "dead", ...).
	SubState string `json:"sub_state"`
	// Result of the last run of a service: "success", "exit-code", "signal",
	// "core-dump", "timeout", "oom-kill", ...
	Result       string `json:"result"`
	FragmentPath string `json:"fragment_path"`
	MainPID      int    `json:"main_pid"`
	// NRestarts counts automatic restarts (Restart=) since the last manual
	// start.
	NRestarts    int    `json:"n_restarts"`
	ControlGroup string `json:"control_group"`
	// ExecStart holds one command line per ExecStart= line: the resolved
	// program path followed by the arguments (argv[1:]), i.e. what runs, so
	// it can be compared with a profile's argv. A "@" line's custom argv[0]
	// is not included.
	ExecStart   [][]string `json:"exec_start"`
	Conflicts   []string   `json:"conflicts"`
	DropInPaths []string   `json:"drop_in_paths"`
	// ActiveEnterTimestamp is when the unit last became active; zero if it
	// never did.
	ActiveEnterTimestamp time.Time `json:"active_enter_timestamp"`
}

// Active reports whether the unit is, or is about to be or still is, running
// its processes: "active", "activating", "deactivating", "reloading" and
// "refreshing" are; "inactive", "failed" and "maintenance" are not. For an
// inference backend this answers "may it hold the GPU?": a unit that is
// still starting or stopping may, so the Supervisor must not start another
// one yet.
func (u UnitStatus) Active() bool {
	switch u.ActiveState {
	case "active", "activating", "deactivating", "reloading", "refreshing":
		return true
	}
	return false
}
