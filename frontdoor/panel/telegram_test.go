package panel

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"gpuhost/api"
	"gpuhost/appliance/appliancetest"
)

// The dashboard and GET /api/status show the Telegram bot's health when
// there is a bot, and nothing about it otherwise.
func TestDashboardAndStatusShowTheBot(t *testing.T) {
	ev := newEnv(t, envOptions{fixture: appliancetest.Options{}})
	c := ev.client(t)
	if _, body := do(t, c, "GET", ev.srv.URL+"/", nil, nil); strings.Contains(body, "Telegram bot") {
		t.Error("dashboard shows a bot that is not configured")
	}
	ev.f.Sup.SetTelegramStatus(func() api.TelegramStatus {
		return api.TelegramStatus{State: api.TelegramBackingOff, Bot: "box_bot", Since: time.Now().Add(-time.Minute),
			Reason: api.TelegramTokenRefused + " from telegram.token_file /etc/gpuhost/tg <x>", Errors: map[string]uint64{"unauthorized": 4}}
	})
	resp, body := do(t, c, "GET", ev.srv.URL+"/", nil, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("dashboard: %d", resp.StatusCode)
	}
	for _, want := range []string{`id="telegram"`, "Telegram bot", "@box_bot", `<span class="badge sev-warn">backing_off</span>`,
		api.TelegramTokenRefused, "&lt;x&gt;"} {
		if !strings.Contains(body, want) {
			t.Errorf("dashboard lacks %q", want)
		}
	}
	resp, body = do(t, c, "GET", ev.srv.URL+"/api/status", nil, nil)
	var st api.Status
	if err := json.Unmarshal([]byte(body), &st); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/api/status: %d %v", resp.StatusCode, err)
	}
	if st.Telegram == nil || st.Telegram.State != api.TelegramBackingOff || st.Telegram.Errors["unauthorized"] != 4 {
		t.Errorf("/api/status telegram = %+v", st.Telegram)
	}
}
