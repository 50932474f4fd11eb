package appliance

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/config"
	"gpuhost/units"
)

func TestTelegramDoctorCheck(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		st   api.TelegramStatus
		want units.Severity
		msg  []string
	}{
		{"polling", api.TelegramStatus{State: api.TelegramPolling, Bot: "box_bot", Since: now.Add(-time.Hour)}, units.SeverityOK, []string{"@box_bot", "polling", "1h0m0s"}},
		{"starting", api.TelegramStatus{State: api.TelegramStarting, Since: now}, units.SeverityOK, []string{"connecting"}},
		{"short network blip", api.TelegramStatus{State: api.TelegramBackingOff, Reason: "getUpdates failed (network): dial tcp: refused", Since: now.Add(-30 * time.Second)},
			units.SeverityWarn, []string{"not reaching Telegram for 30s", "dial tcp"}},
		{"long outage", api.TelegramStatus{State: api.TelegramBackingOff, Reason: "getUpdates failed (server): 502", Since: now.Add(-10 * time.Minute)},
			units.SeverityFail, []string{"10m0s", "502"}},
		{"token refused", api.TelegramStatus{State: api.TelegramBackingOff, Reason: api.TelegramTokenRefused + " from telegram.token_file /etc/tg", Since: now},
			units.SeverityFail, []string{api.TelegramTokenRefused, "/etc/tg"}},
		{"stopped", api.TelegramStatus{State: api.TelegramStopped, Reason: "telegram bot token missing: set GPUHOST_TELEGRAM_TOKEN", Since: now},
			units.SeverityFail, []string{"stopped", "token missing"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := telegramCheck(&tc.st, now)
			if c.ID != "telegram.bot" || c.Severity != tc.want || c.Value != tc.st.State {
				t.Errorf("check = %+v, want severity %s", c, tc.want)
			}
			for _, w := range tc.msg {
				if !strings.Contains(c.Message, w) {
					t.Errorf("message %q lacks %q", c.Message, w)
				}
			}
			if c.Severity != units.SeverityOK && c.Fix == "" {
				t.Error("no fix for a finding")
			}
		})
	}
}

func TestDoctorAndStatusShowTheBot(t *testing.T) {
	s := &Supervisor{}
	if s.TelegramStatus() != nil {
		t.Fatal("status without a bot")
	}
	st := api.TelegramStatus{State: api.TelegramStopped, Reason: "why", Errors: map[string]uint64{"unauthorized": 1}}
	s.SetTelegramStatus(func() api.TelegramStatus { return st })
	got := s.TelegramStatus()
	if got == nil || got.State != api.TelegramStopped {
		t.Fatalf("TelegramStatus = %+v", got)
	}
	data, _ := json.Marshal(api.Status{Telegram: got})
	for _, w := range []string{`"telegram":{"state":"stopped","reason":"why"`, `"errors":{"unauthorized":1}`} {
		if !strings.Contains(string(data), w) {
			t.Errorf("status JSON %s lacks %s", data, w)
		}
	}
	cfg := &config.Config{Policy: &units.Policy{}}
	rep := (&Doctor{Cfg: cfg, Telegram: s.TelegramStatus}).Run(context.Background())
	found := false
	for _, c := range rep.Checks {
		found = found || (c.ID == "telegram.bot" && c.Severity == units.SeverityFail)
	}
	if !found || rep.Exit != 1 {
		t.Errorf("doctor report lacks a failing telegram.bot: %+v", rep.Checks)
	}
	s.SetTelegramStatus(nil)
	if s.TelegramStatus() != nil {
		t.Error("SetTelegramStatus(nil) kept the bot")
	}
}
