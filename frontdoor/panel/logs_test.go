package panel

import (
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gpuhost/appliance/appliancetest"
	"gpuhost/config"
)

// unitLog is the process runner's log file of unit (what its journal reads).
func unitLog(cfg *config.Config, unit string) string {
	return filepath.Join(cfg.StateDir, "logs", strings.TrimSuffix(unit, ".service")+".log")
}

// appendLog adds lines to a unit's log file as the backend would.
func appendLog(t *testing.T, path string, lines ...string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(strings.Join(lines, "\n") + "\n"); err != nil {
		t.Fatal(err)
	}
}

// tail asks /logs/tail as the logs page's script does.
func tail(t *testing.T, ev *env, c *http.Client, q url.Values) (int, string, tailAnswer) {
	t.Helper()
	resp, body := do(t, c, http.MethodGet, ev.srv.URL+"/logs/tail?"+q.Encode(), nil, map[string]string{"Accept": "application/json"})
	var ans tailAnswer
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal([]byte(body), &ans); err != nil {
			t.Fatalf("tail answer %q: %v", body, err)
		}
	}
	return resp.StatusCode, body, ans
}

// TestLogsTail: only the configured backend units may be read (others get
// 400, on the page and the tail), journal lines come back escaped (JSON
// and HTML), and a cursor returns just the lines after it.
func TestLogsTail(t *testing.T) {
	ev := newEnv(t, envOptions{fixture: appliancetest.Options{Activate: "coder"}})
	c := ev.client(t)
	unit := ev.f.Cfg.Backends.VLLM.Unit
	evil := `<script>alert("x")</script> & more`
	appendLog(t, unitLog(ev.f.Cfg, unit), evil)

	for _, u := range []string{"evil.service", "../../etc/passwd", "sshd.service"} {
		code, body, _ := tail(t, ev, c, url.Values{"unit": {u}})
		if code != http.StatusBadRequest || !strings.Contains(body, "unknown unit") {
			t.Errorf("tail of %q: %d %s, want 400 unknown unit", u, code, body)
		}
		resp, page := do(t, c, http.MethodGet, ev.srv.URL+"/logs?unit="+url.QueryEscape(u), nil, nil)
		if resp.StatusCode != http.StatusBadRequest || strings.Contains(page, "<pre id=\"tail\"") {
			t.Errorf("logs page of %q: %d, want 400 without a tail", u, resp.StatusCode)
		}
	}

	code, body, ans := tail(t, ev, c, url.Values{"unit": {unit}})
	if code != http.StatusOK || !ans.Reset || ans.Cursor == "" || ans.Unit != unit {
		t.Fatalf("tail of %s: %d %s", unit, code, body)
	}
	if strings.Contains(body, "<script>") || !strings.Contains(body, `\u003cscript\u003e`) {
		t.Errorf("tail JSON does not escape HTML: %s", body)
	}
	if !slices.Contains(ans.Lines, evil) {
		t.Errorf("tail lacks the line %q: %q", evil, ans.Lines)
	}

	_, body, ans2 := tail(t, ev, c, url.Values{"unit": {unit}, "after": {ans.Cursor}})
	if ans2.Reset || len(ans2.Lines) != 0 || ans2.Cursor != ans.Cursor {
		t.Errorf("tail after the cursor with nothing new: %s", body)
	}
	appendLog(t, unitLog(ev.f.Cfg, unit), "new line 1", "new line 2")
	_, body, ans3 := tail(t, ev, c, url.Values{"unit": {unit}, "after": {ans.Cursor}})
	if ans3.Reset || !slices.Equal(ans3.Lines, []string{"new line 1", "new line 2"}) || ans3.Cursor == ans.Cursor {
		t.Errorf("tail after the cursor: %s, want the two new lines", body)
	}

	resp, page := do(t, c, http.MethodGet, ev.srv.URL+"/logs", nil, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /logs: %d\n%s", resp.StatusCode, page)
	}
	if strings.Contains(page, "<script>alert") || !strings.Contains(page, "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt; &amp; more") {
		t.Errorf("logs page does not escape the journal line:\n%s", page)
	}
	if !strings.Contains(page, `data-unit="`+unit+`"`) || !strings.Contains(page, `href="/logs"`) {
		t.Errorf("logs page does not tail the active unit %s or lacks the nav link", unit)
	}
}

func TestLinesAfter(t *testing.T) {
	lines := []string{"a", "b", "c", "d", "e"}
	got, reset := linesAfter(lines, cursorOf(lines[:3]))
	if reset || !slices.Equal(got, []string{"d", "e"}) {
		t.Errorf("after c: %q reset %v", got, reset)
	}
	got, reset = linesAfter(lines, "feedface")
	if !reset || !slices.Equal(got, lines) {
		t.Errorf("unknown cursor: %q reset %v", got, reset)
	}
	got, reset = linesAfter(lines, cursorOf(lines))
	if reset || len(got) != 0 {
		t.Errorf("cursor at the end: %q reset %v", got, reset)
	}
}
