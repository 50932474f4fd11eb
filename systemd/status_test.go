package systemd

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"gpuhost/api"
)

func TestStatusFromProperties(t *testing.T) {
	at := time.Date(2026, 5, 1, 12, 0, 0, 123000, time.UTC)
	tests := []struct {
		name  string
		unit  string
		props map[string]any
		want  api.UnitStatus
	}{
		{
			name: "running service",
			unit: "vllm.service",
			props: map[string]any{
				"Id": "vllm.service", "LoadState": "loaded", "ActiveState": "active", "SubState": "running",
				"Result": "success", "FragmentPath": "/etc/systemd/system/vllm.service",
				"MainPID": uint32(4242), "NRestarts": uint32(3), "ControlGroup": "/system.slice/vllm.service",
				"ExecStart": [][]any{{"/usr/bin/vllm", []string{"vllm", "serve", "--port", "8000"}, false,
					uint64(0), uint64(0), uint64(0), uint64(0), uint32(0), int32(0), int32(0)}},
				"Conflicts":            []string{"ollama.service", "shutdown.target"},
				"DropInPaths":          []string{"/etc/systemd/system/vllm.service.d/gpu.conf"},
				"ActiveEnterTimestamp": uint64(at.UnixMicro()),
			},
			want: api.UnitStatus{
				Name: "vllm.service", LoadState: "loaded", ActiveState: "active", SubState: "running",
				Result: "success", FragmentPath: "/etc/systemd/system/vllm.service", MainPID: 4242, NRestarts: 3,
				ControlGroup: "/system.slice/vllm.service", ExecStart: [][]string{{"/usr/bin/vllm", "serve", "--port", "8000"}},
				Conflicts: []string{"ollama.service", "shutdown.target"}, DropInPaths: []string{"/etc/systemd/system/vllm.service.d/gpu.conf"},
				ActiveEnterTimestamp: time.UnixMicro(at.UnixMicro()),
			},
		},
		{
			name:  "alias resolves to the primary name; empty lists are nil",
			unit:  "alias.service",
			props: map[string]any{"Id": "real.service", "Conflicts": []string{}, "ActiveEnterTimestamp": uint64(0)},
			want:  api.UnitStatus{Name: "real.service"},
		},
		{
			name: "wrong types and garbage are ignored",
			unit: "odd.service",
			props: map[string]any{
				"LoadState": 7, "MainPID": "12", "NRestarts": int64(-1), "ExecStart": "nope",
				"Conflicts": []any{"x"}, "ActiveEnterTimestamp": int64(5),
			},
			want: api.UnitStatus{Name: "odd.service"},
		},
		{
			name: "ExecStart as []any, short and pathless entries skipped",
			unit: "x.service",
			props: map[string]any{"ExecStart": []any{
				[]any{"/bin/a", []string{"a", "1"}},
				[]any{"/bin/b"},
				[]any{"", []string{"c"}},
				"not-a-struct",
				[]any{"/bin/d", "argv-not-a-list"},
			}},
			want: api.UnitStatus{Name: "x.service", ExecStart: [][]string{{"/bin/a", "1"}, {"/bin/d"}}},
		},
		{
			name:  "int variants of PIDs",
			unit:  "y.service",
			props: map[string]any{"MainPID": int32(7), "NRestarts": uint64(1 << 40)},
			want:  api.UnitStatus{Name: "y.service", MainPID: 7},
		},
		{name: "nil map", unit: "z.service", props: nil, want: api.UnitStatus{Name: "z.service"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := statusFromProperties(tt.unit, tt.props)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
		})
	}
}

func TestUnitStatusActive(t *testing.T) {
	tests := map[string]bool{
		"active": true, "activating": true, "deactivating": true, "reloading": true, "refreshing": true,
		"inactive": false, "failed": false, "maintenance": false, "": false,
	}
	for state, want := range tests {
		if got := (api.UnitStatus{ActiveState: state}).Active(); got != want {
			t.Errorf("Active() with %q = %v, want %v", state, got, want)
		}
	}
}

func TestUnitStatusJSON(t *testing.T) {
	data, err := json.Marshal(api.UnitStatus{Name: "a.service", MainPID: 1, NRestarts: 2, ExecStart: [][]string{{"/bin/x"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{`"name"`, `"load_state"`, `"active_state"`, `"sub_state"`, `"result"`, `"fragment_path"`,
		`"main_pid":1`, `"n_restarts":2`, `"control_group"`, `"exec_start":[["/bin/x"]]`, `"conflicts"`, `"drop_in_paths"`, `"active_enter_timestamp"`} {
		if !strings.Contains(string(data), key) {
			t.Errorf("JSON %s lacks %s", data, key)
		}
	}
}

func TestJobErrorMessage(t *testing.T) {
	tests := []struct {
		err  JobError
		want []string
	}{
		{JobError{Unit: "vllm.service", Op: "start", Result: "failed"}, []string{"start unit vllm.service", `"failed"`, "journalctl -u vllm.service"}},
		{JobError{Unit: "a.service", Op: "stop", Result: "timeout"}, []string{"stop unit a.service", "timed out"}},
		{JobError{Unit: "a.service", Op: "start", Result: "brand-new"}, []string{`"brand-new"`}},
	}
	for _, tt := range tests {
		msg := tt.err.Error()
		for _, w := range tt.want {
			if !strings.Contains(msg, w) {
				t.Errorf("%q lacks %q", msg, w)
			}
		}
	}
}

func TestCheckUnitName(t *testing.T) {
	tests := map[string]bool{
		"vllm.service": true, "a@b.service": true, "-.mount": true, systemdTarget: true,
		"": false, "vllm": false, "a/b.service": false, "a\x00.service": false, "a\n.service": false,
		strings.Repeat("a", 250) + ".service": false,
	}
	for name, ok := range tests {
		if err := checkUnitName(name); (err == nil) != ok {
			t.Errorf("checkUnitName(%q) = %v, want ok=%v", name, err, ok)
		}
	}
}

const systemdTarget = "gpuhost-test.target"

func FuzzStatusFromExecStart(f *testing.F) {
	f.Add("/bin/a", "a", "b", 2)
	f.Add("", "", "", 0)
	f.Fuzz(func(t *testing.T, path, a0, a1 string, n int) {
		argv := []string{a0, a1}
		if n >= 0 && n < len(argv) {
			argv = argv[:n]
		}
		st := statusFromProperties("f.service", map[string]any{"ExecStart": [][]any{{path, argv}}, "MainPID": uint32(n)})
		if path == "" && st.ExecStart != nil {
			t.Errorf("pathless line kept: %q", st.ExecStart)
		}
		if path != "" && (len(st.ExecStart) != 1 || st.ExecStart[0][0] != path) {
			t.Errorf("ExecStart %q for path %q", st.ExecStart, path)
		}
	})
}
