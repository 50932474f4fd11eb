package systemd

import (
	"time"

	"gpuhost/api"
)

// statusFromProperties builds a UnitStatus from systemd's property map (as
// go-systemd decodes it). Missing or mistyped properties leave the field
// zero: the map comes from outside and must never make us panic.
func statusFromProperties(unit string, props map[string]any) api.UnitStatus {
	s := api.UnitStatus{
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
