package systemd

import (
	"time"
)

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

// statusFromProperties builds a UnitStatus from systemd's property map (as
// go-systemd decodes it). Missing or mistyped properties leave the field
// zero: the map comes from outside and must never make us panic.
func statusFromProperties(unit string, props map[string]any) UnitStatus {
	s := UnitStatus{
		Name:         stringProp(props, "Id"),
		LoadState:    stringProp(props, "LoadState"),
		ActiveState:  stringProp(props, "ActiveState"),
		SubState:     stringProp(props, "SubState"),
		Result:       stringProp(props, "Result"),
		FragmentPath: stringProp(props, "FragmentPath"),
		MainPID:      intProp(props, "MainPID"),
		NRestarts:    intProp(props, "NRestarts"),
		ControlGroup: stringProp(props, "ControlGroup"),
		ExecStart:    execStartProp(props["ExecStart"]),
		Conflicts:    stringsProp(props, "Conflicts"),
		DropInPaths:  stringsProp(props, "DropInPaths"),
	}
	if s.Name == "" {
		s.Name = unit
	}
	if us, ok := props["ActiveEnterTimestamp"].(uint64); ok && us > 0 && us < 1<<62 {
		s.ActiveEnterTimestamp = time.UnixMicro(int64(us))
	}
	return s
}

func stringProp(props map[string]any, key string) string {
	s, _ := props[key].(string)
	return s
}

func intProp(props map[string]any, key string) int {
	switch v := props[key].(type) {
	case uint32:
		return int(v)
	case int32:
		return int(v)
	case uint64:
		if v < 1<<31 {
			return int(v)
		}
	case int64:
		if v >= 0 && v < 1<<31 {
			return int(v)
		}
	}
	return 0
}

func stringsProp(props map[string]any, key string) []string {
	v, _ := props[key].([]string)
	if len(v) == 0 {
		return nil
	}
	return append([]string(nil), v...)
}

// execStartProp decodes the ExecStart property, D-Bus type a(sasbttttuii):
// per command line (path, argv, ignore-failure, start/exit timestamps, pid,
// exit code, status). godbus decodes the struct array as [][]any.
func execStartProp(v any) [][]string {
	var entries [][]any
	switch t := v.(type) {
	case [][]any:
		entries = t
	case []any:
		for _, e := range t {
			if fields, ok := e.([]any); ok {
				entries = append(entries, fields)
			}
		}
	default:
		return nil
	}
	var out [][]string
	for _, fields := range entries {
		if len(fields) < 2 {
			continue
		}
		path, ok := fields[0].(string)
		if !ok || path == "" {
			continue
		}
		argv, _ := fields[1].([]string)
		line := []string{path}
		if len(argv) > 1 {
			line = append(line, argv[1:]...)
		}
		out = append(out, line)
	}
	return out
}
