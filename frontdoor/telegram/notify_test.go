package telegram

import (
	"strings"
	"testing"

	"gpuhost/api"
	"gpuhost/units"
)

func TestNoteState(t *testing.T) {
	profiles := map[string]*units.Profile{
		"coder": {Name: "coder", Backend: units.VLLM, ServedName: "qwen3-coder"},
	}
	unitEv := func(state string) api.Event {
		return api.Event{Kind: "unit", Detail: map[string]any{"unit": "gpuhost-vllm.service", "active_state": state}}
	}
	tests := []struct {
		name string
		evs  []api.Event
		want []string // substrings of the notifications, in order ("" = none for that event)
	}{
		{
			name: "successful switch",
			evs: []api.Event{
				{Kind: "switch", Status: "started", Profile: "coder"},
				{Kind: "step", Step: "start", Status: "done"},
				{Kind: "switch", Status: "done", Profile: "coder", DurationMS: 12300},
			},
			want: []string{"", "", "✅ switch done: coder (vllm, qwen3-coder) is active (12.3 s)"},
		},
		{
			name: "failed switch carries the last journal lines; the unit failing inside it is not a separate note",
			evs: []api.Event{
				{Kind: "switch", Status: "started", Profile: "coder"},
				{Kind: "step", Step: "ready", Status: "failed", Journal: []string{"l1", "l2", "l3", "l4", "l5", "l6: bind: address already in use"}},
				unitEv("failed"),
				{Kind: "switch", Status: "failed", Profile: "coder", Message: "switch to coder failed: ready: exit 1"},
			},
			want: []string{"", "", "", "❌ switch to coder failed: ready: exit 1\n\nlast journal lines:\nl2\nl3\nl4\nl5\nl6: bind: address already in use"},
		},
		{
			name: "a crash names the reason and the log; unit events around it are quiet",
			evs: []api.Event{unitEv("active"), unitEv("failed"),
				{Kind: "crash", Status: "failed", Profile: "coder", Message: "the backend of coder (gpuhost-vllm.service) crashed (failed, signal): restarting it (restart 1 of 3 within 10m0s)",
					Detail: map[string]any{"unit": "gpuhost-vllm.service", "reason": "signal"}},
				unitEv("inactive")},
			want: []string{"", "", "💥 the backend of coder (gpuhost-vllm.service) crashed (failed, signal): restarting it (restart 1 of 3 within 10m0s); its log: journalctl -u gpuhost-vllm.service", ""},
		},
		{
			name: "the log hint is the event's (the demo's process runner has no journal)",
			evs: []api.Event{{Kind: "crash", Message: "crashed", Detail: map[string]any{"unit": "gpuhost-vllm.service",
				"log": "its log: /state/backends/gpuhost-vllm.service.log (the demo's process runner; no journal)"}}},
			want: []string{"crashed; its log: /state/backends/gpuhost-vllm.service.log (the demo's"},
		},
		{
			name: "giving up carries the journal; a healed crash is the switch's note; a hand stop is a note",
			evs: []api.Event{
				{Kind: "heal", Status: "done", Message: "coder serves again"},
				{Kind: "heal", Status: "failed", Message: "coder crashed 4 times within 10m0s (last: exit-code); gpuhost stopped restarting it: see x, then `gpuhost heal`",
					Journal: []string{"a", "b", "c", "d", "e", "f: CUDA error"}},
				{Kind: "paused", Status: "info", Message: "gpuhost-vllm.service (coder) was stopped by hand: nothing is served until `gpuhost heal`"},
			},
			want: []string{"", "❌ coder crashed 4 times within 10m0s (last: exit-code); gpuhost stopped restarting it: see x, then gpuhost heal\n\nlast journal lines:\nb\nc\nd\ne\nf: CUDA error",
				"⏸ gpuhost-vllm.service (coder) was stopped by hand: nothing is served until gpuhost heal"},
		},
		{
			name: "other events are quiet",
			evs: []api.Event{
				{Kind: "state", Message: "active"}, {Kind: "reconcile", Message: "restoring"},
				{Kind: "switch", Status: "info", Message: "rolling back"},
				{Kind: "unit", Detail: map[string]any{"active_state": 42}},
			},
			want: []string{"", "", "", ""},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var n noteState
			for i, e := range tc.evs {
				got := n.note(e, profiles)
				want := tc.want[i]
				if (want == "") != (got == "") || !strings.Contains(got, want) {
					t.Errorf("event %d (%s %s): note %q, want one containing %q", i, e.Kind, e.Status, got, want)
				}
			}
		})
	}
}
