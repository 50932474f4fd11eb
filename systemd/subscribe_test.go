package systemd

import (
	"testing"

	godbus "github.com/godbus/dbus/v5"
)

func TestUnitObjectPath(t *testing.T) {
	tests := map[string]godbus.ObjectPath{
		"vllm.service":   "/org/freedesktop/systemd1/unit/vllm_2eservice",
		"a-b@1.service":  "/org/freedesktop/systemd1/unit/a_2db_401_2eservice",
		"-.mount":        "/org/freedesktop/systemd1/unit/_2d_2emount",
		"0start.service": "/org/freedesktop/systemd1/unit/_30start_2eservice",
	}
	for unit, want := range tests {
		if got := unitObjectPath(unit); got != want || !got.IsValid() {
			t.Errorf("unitObjectPath(%q) = %q (valid %v), want %q", unit, got, got.IsValid(), want)
		}
	}
}

func TestUnitEventFromSignal(t *testing.T) {
	prev := UnitEvent{Unit: "u.service", ActiveState: "inactive", SubState: "dead"}
	props := func(m map[string]any) map[string]godbus.Variant {
		out := map[string]godbus.Variant{}
		for k, v := range m {
			out[k] = godbus.MakeVariant(v)
		}
		return out
	}
	sig := func(iface string, changed any) *godbus.Signal {
		return &godbus.Signal{Name: propertiesChanged, Path: unitObjectPath("u.service"), Body: []any{iface, changed, []string{}}}
	}
	tests := []struct {
		name          string
		sig           *godbus.Signal
		want          bool
		active, subst string
	}{
		{"both states", sig(unitInterface, props(map[string]any{"ActiveState": "activating", "SubState": "start-pre"})), true, "activating", "start-pre"},
		{"sub state only", sig(unitInterface, props(map[string]any{"SubState": "auto-restart"})), true, "inactive", "auto-restart"},
		{"unchanged states", sig(unitInterface, props(map[string]any{"ActiveState": "inactive", "SubState": "dead", "Job": "x"})), false, "", ""},
		{"other properties only", sig(unitInterface, props(map[string]any{"Job": "x"})), false, "", ""},
		{"service interface", sig("org.freedesktop.systemd1.Service", props(map[string]any{"ActiveState": "active"})), false, "", ""},
		{"wrong value type", sig(unitInterface, props(map[string]any{"ActiveState": 3})), false, "", ""},
		{"changed not a map", sig(unitInterface, "nope"), false, "", ""},
		{"short body", &godbus.Signal{Name: propertiesChanged, Body: []any{unitInterface}}, false, "", ""},
		{"other signal", &godbus.Signal{Name: "org.freedesktop.systemd1.Manager.JobRemoved", Body: []any{uint32(1), "a", "b", "c"}}, false, "", ""},
		{"interface not a string", &godbus.Signal{Name: propertiesChanged, Body: []any{1, props(map[string]any{"ActiveState": "active"})}}, false, "", ""},
		{"nil", nil, false, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev, ok := unitEventFromSignal("u.service", tt.sig, prev)
			if ok != tt.want {
				t.Fatalf("ok = %v, want %v (event %+v)", ok, tt.want, ev)
			}
			if ok && (ev.ActiveState != tt.active || ev.SubState != tt.subst || ev.Unit != "u.service" || ev.At.IsZero()) {
				t.Errorf("event %+v, want %s/%s", ev, tt.active, tt.subst)
			}
		})
	}
}
