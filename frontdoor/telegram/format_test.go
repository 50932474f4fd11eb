package telegram

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"gpuhost/api"
	"gpuhost/nvml"
	"gpuhost/units"
)

func TestMemBar(t *testing.T) {
	tests := []struct {
		used, total uint64
		want        string
	}{
		{18842, 24564, "▓▓▓▓▓▓▓▓░░"},
		{0, 24564, "░░░░░░░░░░"},
		{24564, 24564, "▓▓▓▓▓▓▓▓▓▓"},
		{30000, 24564, "▓▓▓▓▓▓▓▓▓▓"}, // over-reporting never overflows
		{100, 0, "░░░░░░░░░░"},       // no total: nothing to show
		{1200, 24564, "░░░░░░░░░░"},
		{1300, 24564, "▓░░░░░░░░░"},
	}
	for _, tc := range tests {
		if got := memBar(tc.used, tc.total); got != tc.want {
			t.Errorf("memBar(%d, %d) = %s, want %s", tc.used, tc.total, got, tc.want)
		}
	}
}

func statusFixture() api.Status {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	return api.Status{
		State: api.State{Phase: api.PhaseActive, Profile: "coder", Backend: units.VLLM},
		GPU: &nvml.Snapshot{Backend: "nvml", Devices: []nvml.Device{{
			Name: "NVIDIA GeForce RTX 4090", MemoryTotalMiB: 24576, MemoryUsedMiB: 18842,
			UtilizationGPU: 37, TemperatureC: 52, PowerW: 210.4, PowerLimitW: 450,
		}}},
		Profiles:   []api.ProfileInfo{{Name: "coder", Backend: units.VLLM, ServedName: "qwen3-coder", Port: 8000}},
		LastSwitch: &api.SwitchSummary{Profile: "coder", OK: true, StartedAt: now.Add(-5 * time.Minute), DurationMS: 12345},
	}
}

func TestFormatStatus(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	okHealth := health{Checked: true, OK: true, URL: "/health", Detail: "200 in 3 ms"}
	tests := []struct {
		name   string
		mod    func(*api.Status)
		health health
		want   string
	}{
		{
			name: "active", health: okHealth,
			want: "🟢 coder · vllm · qwen3-coder\n" +
				"NVIDIA GeForce RTX 4090\n" +
				"▓▓▓▓▓▓▓▓░░ 18.4/24.0 GiB\n" +
				"util 37% · 52°C · 210/450 W\n" +
				"endpoint: ✅ /health 200 in 3 ms\n" +
				"last switch: ✅ coder in 12.3 s, 4 min ago",
		},
		{
			name: "facts the card cannot report say n/a, not zero",
			mod: func(s *api.Status) {
				s.GPU.Devices[0].FactErrors = map[string]string{"power_w": "ERROR_NOT_SUPPORTED", "temperature_c": "ERROR_NOT_SUPPORTED"}
				s.GPU.Backend = "sim"
			},
			health: health{Checked: true, URL: "/health", Detail: "unreachable: connection refused"},
			want: "🟢 coder · vllm · qwen3-coder\n" +
				"NVIDIA GeForce RTX 4090 (simulated)\n" +
				"▓▓▓▓▓▓▓▓░░ 18.4/24.0 GiB\n" +
				"util 37% · n/a · n/a\n" +
				"endpoint: ❌ /health unreachable: connection refused\n" +
				"last switch: ✅ coder in 12.3 s, 4 min ago",
		},
		{
			name: "switching, no GPU, failed last switch",
			mod: func(s *api.Status) {
				s.State = api.State{Phase: api.PhaseSwitching, Target: "llama", Step: "vram_release"}
				s.GPU, s.GPUError = nil, "NVML not initialised"
				s.LastSwitch = &api.SwitchSummary{Profile: "llama", OK: false, Error: "start: exit 1", StartedAt: now.Add(-3 * time.Hour)}
			},
			want: "🔄 switching to llama (step vram_release)\n" +
				"GPU: unavailable (NVML not initialised)\n" +
				"endpoint: — (no active backend)\n" +
				"last switch: ❌ llama, 3 h ago: start: exit 1",
		},
		{
			name: "idle, no switch yet",
			mod: func(s *api.Status) {
				s.State = api.State{Phase: api.PhaseIdle}
				s.LastSwitch = nil
				s.GPU.Devices = nil
			},
			want: "⚪ idle: no backend running\nGPU: none reported\nendpoint: — (no active backend)\nlast switch: none since start",
		},
		{
			name: "failed",
			mod: func(s *api.Status) {
				s.State = api.State{Phase: api.PhaseFailed, Error: "two backends active"}
			},
			want: "🔴 failed: two backends active\n",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st := statusFixture()
			if tc.mod != nil {
				tc.mod(&st)
			}
			got := formatStatus(st, tc.health, now)
			if strings.HasSuffix(tc.want, "\n") {
				if !strings.HasPrefix(got, tc.want) {
					t.Errorf("got\n%s\nwant prefix\n%s", got, tc.want)
				}
				return
			}
			if got != tc.want {
				t.Errorf("got\n%s\nwant\n%s", got, tc.want)
			}
		})
	}
}

func TestFormatDoctor(t *testing.T) {
	green := api.DoctorReport{Checks: []api.DoctorCheck{{ID: "a", Severity: units.SeverityOK}, {ID: "b", Severity: units.SeverityOK}}}
	if got := formatDoctor(green); got != "✅ doctor: all green (2 checks)" {
		t.Errorf("green: %q", got)
	}
	mixed := api.DoctorReport{Checks: []api.DoctorCheck{
		{ID: "units.conflicts", Severity: units.SeverityOK, Message: "fine"},
		{ID: "profile.vram_fit", Severity: units.SeverityWarn, Profile: "coder", Message: "tight", Fix: "lower max_model_len"},
		{ID: "gpu.driver", Severity: units.SeverityFail, Message: "driver 535 is older than 580", Fix: "install driver ≥ 580"},
	}}
	want := "doctor: 1 failing, 1 warning (of 3 checks)\n\n" +
		"❌ gpu.driver: driver 535 is older than 580\n   fix: install driver ≥ 580\n" +
		"⚠️ profile.vram_fit [coder]: tight\n   fix: lower max_model_len"
	if got := formatDoctor(mixed); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if strings.Contains(formatDoctor(mixed), "fine") {
		t.Error("passing checks are listed")
	}
}

func TestTruncateKeepsWithinTelegramLimit(t *testing.T) {
	tests := []string{
		strings.Repeat("a", maxMessageUnits),
		strings.Repeat("a", maxMessageUnits+1),
		strings.Repeat("🔴", 3000), // 2 UTF-16 units each
		strings.Repeat("é", 5000),
		"short",
		strings.Repeat("x\xff", 3000),
	}
	for _, s := range tests {
		got := truncate(s)
		if utf16Len(got) > maxMessageUnits || !utf8.ValidString(got) {
			t.Errorf("truncate(%d bytes) = %d UTF-16 units, valid UTF-8 %v", len(s), utf16Len(got), utf8.ValidString(got))
		}
		if utf16Len(s) <= maxMessageUnits && utf8.ValidString(s) && got != s {
			t.Errorf("truncate changed a message within the limit")
		}
		if utf16Len(s) > maxMessageUnits && !strings.HasSuffix(got, truncNote) {
			t.Errorf("truncated message does not say so")
		}
	}
	// A huge doctor report still fits.
	var rep api.DoctorReport
	for range 200 {
		rep.Checks = append(rep.Checks, api.DoctorCheck{ID: "x", Severity: units.SeverityFail, Message: strings.Repeat("m", 400)})
	}
	if n := utf16Len(formatDoctor(rep)); n > maxMessageUnits {
		t.Errorf("doctor message has %d units", n)
	}
}

func TestHumanDurations(t *testing.T) {
	for d, want := range map[time.Duration]string{
		850 * time.Millisecond: "850 ms", 12345 * time.Millisecond: "12.3 s", 4 * time.Minute: "4 min", 150 * time.Minute: "2.5 h",
	} {
		if got := humanDuration(d); got != want {
			t.Errorf("humanDuration(%v) = %q, want %q", d, got, want)
		}
	}
	for d, want := range map[time.Duration]string{
		10 * time.Second: "just now", 5 * time.Minute: "5 min ago", 3 * time.Hour: "3 h ago", 72 * time.Hour: "3 d ago",
	} {
		if got := humanAge(d); got != want {
			t.Errorf("humanAge(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestPairingTextsSayNothingAboutTheMachine(t *testing.T) {
	for _, s := range []string{pairingText("ABCDEFGH", 10*time.Minute), reminderText("ABCDEFGH", 7*time.Minute)} {
		if codeIn(s) != "ABCDEFGH" {
			t.Errorf("not recognised as a pairing message: %q", s)
		}
		for _, w := range gpuWords {
			if strings.Contains(s, w) {
				t.Errorf("%q mentions %q", s, w)
			}
		}
	}
}
