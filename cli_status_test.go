package main

import (
	"strings"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/units"
)

// TestPrintStatusReportsWantedDrift: with restore_on_boot off a last wanted
// profile that does not run stays so; `gpuhost status` says it.
func TestPrintStatusReportsWantedDrift(t *testing.T) {
	tests := []struct {
		name  string
		state api.State
		want  string // "" = no wanted line
	}{
		{"wanted runs", api.State{Phase: api.PhaseActive, Profile: "coder", Unit: "v.service", LastWanted: "coder"}, ""},
		{"other profile runs", api.State{Phase: api.PhaseActive, Profile: "coder", Unit: "v.service", LastWanted: "llama"},
			"wanted:  last wanted profile llama does not run; coder (v.service) does; `gpuhost switch llama` completes it"},
		{"nothing runs", api.State{Phase: api.PhaseIdle, LastWanted: "llama"}, "no backend runs"},
		{"switching", api.State{Phase: api.PhaseSwitching, Target: "llama", LastWanted: "llama"}, ""},
		{"never wanted", api.State{Phase: api.PhaseActive, Profile: "coder"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b strings.Builder
			printStatus(&b, api.Status{State: tt.state})
			got := b.String()
			if tt.want == "" {
				if strings.Contains(got, "wanted:") {
					t.Errorf("unexpected wanted line:\n%s", got)
				}
				return
			}
			if !strings.Contains(got, tt.want) {
				t.Errorf("output lacks %q:\n%s", tt.want, got)
			}
		})
	}
}

func TestPrintDoctorColumns(t *testing.T) {
	long := strings.Repeat("p", 60)
	rep := api.DoctorReport{Worst: "ok", Checks: []api.DoctorCheck{
		{ID: "gpu.nvml", Severity: units.SeverityOK, Message: "first"},
		{ID: "profile.vram_fit", Profile: "coder", Severity: units.SeverityWarn, Message: "second"},
		{ID: "profile.vram_fit", Profile: long, Severity: units.SeverityOK, Message: "third"},
	}}
	var b strings.Builder
	printDoctor(&b, rep)
	lines := strings.Split(b.String(), "\n")
	// The messages of the rows that fit start in one column; the long id's
	// message goes on its own line, aligned with them.
	col := strings.Index(lines[0], "first")
	if col < 0 || strings.Index(lines[1], "second") != col || strings.Index(lines[3], "third") != col || !strings.HasSuffix(lines[2], long+"]") {
		t.Errorf("doctor columns:\n%s", b.String())
	}
}

// TestPrintStatusStandbyAndTelegram: `gpuhost status` names the backends
// kept in standby and the bot's health (it was only in --json).
func TestPrintStatusStandbyAndTelegram(t *testing.T) {
	since := time.Date(2026, 12, 1, 10, 0, 0, 0, time.Local)
	st := api.Status{State: api.State{Phase: api.PhaseActive, Profile: "llama", Standby: []api.StandbyInfo{
		{Profile: "coder", Unit: "gpuhost-vllm.service", Mode: "sleep1", ResidualMiB: 612, Since: since}}},
		Telegram: &api.TelegramStatus{State: api.TelegramBackingOff, Bot: "boxbot", Reason: "getUpdates: 429 Too Many Requests",
			Errors: map[string]uint64{"rate_limited": 3, "network": 1}, UpdatesSkipped: 2}}
	var b strings.Builder
	printStatus(&b, st)
	for _, want := range []string{
		"standby: coder (gpuhost-vllm.service) sleep1, 612 MiB held, since 10:00:00",
		"telegram: backing_off as @boxbot · getUpdates: 429 Too Many Requests · 4 failed Bot API calls · 2 updates skipped",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	printStatus(&b, api.Status{State: api.State{Phase: api.PhaseIdle}})
	if strings.Contains(b.String(), "telegram:") || strings.Contains(b.String(), "standby:") {
		t.Errorf("lines without a bot or standby:\n%s", b.String())
	}
}

// TestPrintStatusNotServing: while the wanted profile does not serve, the
// first line says so (and the command exits 1, see newStatusCmd); a hand
// stop says it is paused.
func TestPrintStatusNotServing(t *testing.T) {
	tests := []struct {
		name  string
		state api.State
		first string
	}{
		{"crash loop", api.State{Phase: api.PhaseFailed, Error: "coder crashed 4 times", LastWanted: "coder",
			NotServing: "last wanted profile coder does not run (failed: coder crashed 4 times)"},
			"NOT SERVING: last wanted profile coder does not run (failed: coder crashed 4 times); `gpuhost doctor` says why, `gpuhost heal` starts coder again"},
		{"paused", api.State{Phase: api.PhaseIdle, Paused: "coder"}, "paused:  coder was stopped by hand; nothing is served until `gpuhost heal`"},
		{"serving", api.State{Phase: api.PhaseActive, Profile: "coder", LastWanted: "coder"}, "state:   active: coder ()"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b strings.Builder
			printStatus(&b, api.Status{State: tt.state})
			if first, _, _ := strings.Cut(b.String(), "\n"); first != tt.first {
				t.Errorf("first line %q, want %q", first, tt.first)
			}
		})
	}
}
