package panel

import (
	"context"
	"encoding/hex"
	"hash/fnv"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"gpuhost/api"
)

// JournalFunc returns the last n log lines of a unit (appliance.JournalFunc:
// journald under systemd, the log file under the demo's process runner).
type JournalFunc func(ctx context.Context, unit string, n int) ([]string, error)

// Bounds of the logs page.
const (
	// logsFirstView is how many lines the server-rendered page shows.
	logsFirstView = 100
	// logsWindow is how far back a tail request looks for the client's
	// cursor; a client further behind starts over with the last
	// logsFirstView lines.
	logsWindow = 500
	// cursorLines is how many trailing lines a cursor fingerprints.
	cursorLines    = 3
	journalTimeout = 5 * time.Second
)

// pinnedView is the journal excerpt of the most recent failed step.
type pinnedView struct {
	Seq      uint64
	SwitchID string
	Profile  string
	Step     string
	Message  string
	Time     time.Time
	Journal  []string
}

// failWatch remembers the most recent failed step with a journal. It scans
// the event buffer at each /logs view from where it stopped, so an excerpt
// once seen outlives the buffer's eviction.
type failWatch struct {
	mu      sync.Mutex
	scanned uint64
	last    *pinnedView
}

// latest returns the most recent failed step's excerpt (nil: none seen).
func (w *failWatch) latest(sup Supervisor) *pinnedView {
	_, backlog, unsubscribe := sup.Subscribe(0)
	unsubscribe()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, e := range backlog {
		if e.Seq <= w.scanned {
			continue
		}
		w.scanned = e.Seq
		if e.Kind == api.EventStep && e.Status == api.StatusFailed && len(e.Journal) > 0 {
			w.last = &pinnedView{Seq: e.Seq, SwitchID: e.SwitchID, Profile: e.Profile, Step: e.Step,
				Message: e.Message, Time: e.Time, Journal: slices.Clone(e.Journal)}
		}
	}
	return w.last
}

// unitTab is one backend unit the logs page can show.
type unitTab struct {
	Name    string
	Current bool
	Active  bool // the active profile's unit
}

// logsView is the body of the logs page.
type logsView struct {
	Units      []unitTab
	Unit       string
	Lines      []string
	Cursor     string
	Error      string
	JournalOff bool
	Pinned     *pinnedView
}

// tailAnswer is /logs/tail's JSON: the lines after the client's cursor,
// or (Reset) the last lines to replace what it shows.
type tailAnswer struct {
	Unit   string   `json:"unit"`
	Lines  []string `json:"lines"`
	Cursor string   `json:"cursor"`
	Reset  bool     `json:"reset"`
	Error  string   `json:"error,omitempty"`
}

// logsUnit picks the unit a request asks for: one of the configured
// backend units, or (none asked) the active profile's unit, else the
// first. ok is false for any other name.
func (p *Panel) logsUnit(c echo.Context) (unit string, ok bool) {
	asked := c.QueryParam("unit")
	if asked != "" {
		return asked, slices.Contains(p.daemon.Units, asked)
	}
	if st := p.sup.State(); st.Unit != "" && slices.Contains(p.daemon.Units, st.Unit) {
		return st.Unit, true
	}
	if len(p.daemon.Units) == 0 {
		return "", false
	}
	return p.daemon.Units[0], true
}

// readJournal reads the last n lines of unit with a bounded wait.
func (p *Panel) readJournal(ctx context.Context, unit string, n int) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, journalTimeout)
	defer cancel()
	return p.daemon.Journal(ctx, unit, n)
}

func (p *Panel) handleLogs(c echo.Context) error {
	unit, ok := p.logsUnit(c)
	if !ok {
		return p.fail(c, http.StatusBadRequest, "unknown unit",
			"the logs page shows only the configured backend units: "+strings.Join(p.daemon.Units, ", "))
	}
	st := p.sup.State()
	v := logsView{Unit: unit, JournalOff: p.daemon.Journal == nil, Pinned: p.fails.latest(p.sup)}
	for _, u := range p.daemon.Units {
		v.Units = append(v.Units, unitTab{Name: u, Current: u == unit, Active: u == st.Unit && st.Phase == api.PhaseActive})
	}
	if !v.JournalOff {
		lines, err := p.readJournal(c.Request().Context(), unit, logsFirstView)
		if err != nil {
			v.Error = err.Error()
		}
		v.Lines, v.Cursor = lines, cursorOf(lines)
	}
	return p.render(c, http.StatusOK, "logs", p.pageData(c, "logs", "Logs", v))
}

// handleLogsTail answers the logs page's poll: GET /logs/tail?unit=&after=.
func (p *Panel) handleLogsTail(c echo.Context) error {
	unit, ok := p.logsUnit(c)
	if !ok {
		return c.JSON(http.StatusBadRequest, api.APIError{Error: "unknown unit",
			Detail: "only the configured backend units may be tailed: " + strings.Join(p.daemon.Units, ", ")})
	}
	c.Response().Header().Set("Cache-Control", "no-store")
	ans := tailAnswer{Unit: unit, Lines: []string{}}
	if p.daemon.Journal == nil {
		ans.Error = "no journal reader is configured in this daemon"
		return c.JSON(http.StatusOK, ans)
	}
	lines, err := p.readJournal(c.Request().Context(), unit, logsWindow)
	if err != nil {
		ans.Error = err.Error()
		return c.JSON(http.StatusOK, ans)
	}
	ans.Lines, ans.Reset = linesAfter(lines, c.QueryParam("after"))
	ans.Cursor = cursorOf(lines)
	return c.JSON(http.StatusOK, ans)
}

// cursorOf fingerprints the last cursorLines lines ("" for none).
func cursorOf(lines []string) string {
	if len(lines) == 0 {
		return ""
	}
	h := fnv.New64a()
	for _, l := range lines[max(0, len(lines)-cursorLines):] {
		h.Write([]byte(l))
		h.Write([]byte{'\n'})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// linesAfter returns the lines after the latest position whose trailing
// lines match cursor. Without a cursor, or when it is not in lines (the
// client is too far behind, or the log rotated), it returns the last
// logsFirstView lines with reset set.
func linesAfter(lines []string, cursor string) ([]string, bool) {
	if cursor != "" {
		for i := len(lines); i > 0; i-- {
			if cursorOf(lines[:i]) == cursor {
				return append([]string{}, lines[i:]...), false
			}
		}
	}
	return append([]string{}, lines[max(0, len(lines)-logsFirstView):]...), true
}
