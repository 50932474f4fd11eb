package panel

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"gpuhost/api"
	"gpuhost/internal/activity"
	"gpuhost/internal/sse"
)

// ActivitySource is what the Activity page needs of the daemon's activity
// recorder (*activity.Recorder): the request log with its live
// subscription, and the history.
type ActivitySource interface {
	Recent(f activity.Filter, limit int) []activity.Request
	After(seq uint64) ([]activity.Request, uint64)
	LastSeq() uint64
	Subscribe() (<-chan struct{}, func())
	Models() []string
	Size() int
	Window(d time.Duration) activity.Window
	Latest() (activity.Sample, bool)
	Interval() time.Duration
	Keep() time.Duration
}

// SetActivity enables the Activity page, the live gauges' cheap source and
// the history charts; nil (the default) makes the page say activity is not
// recorded. Call it before Register.
func (p *Panel) SetActivity(src ActivitySource) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.activity = src
}

func (p *Panel) activitySource() ActivitySource {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.activity
}

// Bounds of the Activity page.
const (
	// activityRows is how many requests the page shows (and the script
	// keeps as new ones arrive); the log itself may keep more.
	activityRows = 200
	// defaultWindow is the charts' span without ?window=.
	defaultWindow = 15 * time.Minute
	// maxModelFilter bounds the model filter echoed into the page.
	maxModelFilter = 128
	// activityHeartbeat keeps the live stream's connection from idling out.
	activityHeartbeat = 15 * time.Second
)

// windowChoices are the chart spans offered as links; ?window= takes any
// duration from a minute to what the history keeps.
var windowChoices = []string{"5m", "15m", "1h"}

// statusChoices are the status filter's options: value and label.
var statusChoices = [][2]string{{"", "any status"}, {"ok", "ok (< 400)"}, {"error", "errors (≥ 400)"}, {"4xx", "4xx"}, {"5xx", "5xx"}}

// requestRow is one request as the page's table shows it; the live stream
// sends the same, so the script writes the server's formatting as text.
type requestRow struct {
	Seq    uint64 `json:"seq"`
	Time   string `json:"time"`
	Client string `json:"client"`
	Model  string `json:"model"`
	Path   string `json:"path"`
	// API names the /v1 API (chat, messages, responses, …), the path
	// when it is none of them.
	API         string `json:"api"`
	Status      int    `json:"status"`
	StatusClass string `json:"status_class"`
	Prompt      string `json:"prompt"`
	Completion  string `json:"completion"`
	TTFB        string `json:"ttfb"`
	TokPS       string `json:"tok_s"`
	Held        string `json:"held"`
	Stream      bool   `json:"stream"`
	// GPUs is the GPU set of the profile that served it ("GPU 1",
	// "GPU 0+1", "auto"; "" when no profile did).
	GPUs string `json:"gpus"`
}

// rowOf formats one request; sets are the profiles' GPU sets.
func rowOf(r activity.Request, sets map[string]gpuSet) requestRow {
	row := requestRow{GPUs: sets[r.Profile].Label, Seq: r.Seq, Time: r.Time.Local().Format("15:04:05"), Client: r.Client, Model: r.Model,
		Path: r.Path, API: r.API, Status: r.Status, Stream: r.Stream, Prompt: "–", Completion: "–", TTFB: "–", TokPS: "–", Held: ""}
	if row.API == "" {
		row.API = r.Path
	}
	switch {
	case r.Status >= 500 || r.Status == 499:
		row.StatusClass = "sev-fail"
	case r.Status >= 400:
		row.StatusClass = "sev-warn"
	default:
		row.StatusClass = "sev-ok"
	}
	if r.PromptTokens > 0 || r.CompletionTokens > 0 {
		row.Prompt, row.Completion = strconv.Itoa(r.PromptTokens), strconv.Itoa(r.CompletionTokens)
	}
	if r.TTFB > 0 {
		row.TTFB = formatDuration(msOf(r.TTFB))
	}
	if tps := r.TokensPerSecond(); tps > 0 {
		row.TokPS = fmt.Sprintf("%.1f", tps)
	}
	if r.Held > 0 {
		row.Held = formatDuration(msOf(r.Held))
	}
	return row
}

func msOf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// requestFilter is what the Activity page filters requests by: the
// log's own filter (model, status) and the GPU set of the profile that
// served the request.
type requestFilter struct {
	activity.Filter
	// GPUs is a gpuSet key ("0", "0,1", "auto"); "" is any.
	GPUs string
}

// match reports whether r passes the filter; sets are the profiles' GPU
// sets.
func (f requestFilter) match(r activity.Request, sets map[string]gpuSet) bool {
	if !f.Filter.Match(r) {
		return false
	}
	if f.GPUs == "" {
		return true
	}
	s, ok := sets[r.Profile]
	return ok && s.Key == f.GPUs
}

// recent are the newest requests that pass f, at most limit.
func (f requestFilter) recent(src ActivitySource, sets map[string]gpuSet, limit int) []activity.Request {
	if f.GPUs == "" {
		return src.Recent(f.Filter, limit)
	}
	var out []activity.Request
	for _, r := range src.Recent(f.Filter, 0) {
		if len(out) >= limit {
			break
		}
		if f.match(r, sets) {
			out = append(out, r)
		}
	}
	return out
}

// gpuSetKeyRE is what ?gpus= may hold: a set key as gpuSet.Key writes it.
var gpuSetKeyRE = regexp.MustCompile(`^(auto|[0-9]{1,3}(,[0-9]{1,3}){0,15})$`)

// activityView is the body of the Activity page.
type activityView struct {
	Off    bool
	Model  string
	Status string
	// GPUs is the GPU set filter (a gpuSet key, "" any); Sets are its
	// choices, the profiles' sets. GPUColumn: the profiles use more than
	// one set, so the table has a GPU column and the filter shows.
	GPUs      string
	Sets      []gpuSet
	GPUColumn bool
	Models    []string
	Statuses  [][2]string
	Rows      []requestRow
	Kept      int
	Size      int
	After     uint64 // the newest request when the page was made: the live stream starts after it
	Limit     int
	Charts    chartsView
	Windows   []windowLink
}

type windowLink struct {
	Value   string
	Current bool
}

// activityQuery reads the filters and the window from the query; a bad
// value is a 400 that names it.
func activityQuery(c echo.Context, keep time.Duration) (requestFilter, string, time.Duration, error) {
	f := requestFilter{Filter: activity.Filter{Model: c.QueryParam("model"), Status: c.QueryParam("status")}, GPUs: c.QueryParam("gpus")}
	if f.GPUs != "" && !gpuSetKeyRE.MatchString(f.GPUs) {
		return f, "", 0, fmt.Errorf("gpus=%q is not a GPU set: use the indices joined by commas (0, 1, 0,1) or auto", truncateRunes(f.GPUs, 32))
	}
	if len(f.Model) > maxModelFilter {
		return f, "", 0, fmt.Errorf("model=%q is longer than %d bytes; it is matched against the served model names", f.Model[:32]+"…", maxModelFilter)
	}
	if !activity.ValidStatus(f.Status) {
		return f, "", 0, fmt.Errorf("status=%q is not a status filter: use ok, error, 2xx, 4xx, 5xx or a code like 503", f.Status)
	}
	ws := c.QueryParam("window")
	if ws == "" {
		return f, "15m", min(defaultWindow, keep), nil
	}
	d, err := time.ParseDuration(ws)
	if err != nil || d < time.Minute || d > keep {
		return f, "", 0, fmt.Errorf("window=%q is not a duration from 1m to %s (e.g. 5m, 15m, 1h)", ws, shortDur(keep))
	}
	return f, ws, d, nil
}

func (p *Panel) handleActivity(c echo.Context) error {
	src := p.activitySource()
	if src == nil {
		return p.render(c, http.StatusOK, "activity", p.pageData(c, "activity", "Activity", activityView{Off: true}))
	}
	f, ws, d, err := activityQuery(c, src.Keep())
	if err != nil {
		return p.fail(c, http.StatusBadRequest, "bad activity query", err.Error())
	}
	sets := p.profileSets()
	v := activityView{Model: f.Model, Status: f.Status, GPUs: f.GPUs, Sets: distinctSets(sets), Models: src.Models(), Statuses: statusChoices,
		Size: src.Size(), Limit: activityRows, Rows: []requestRow{}}
	v.GPUColumn = len(v.Sets) > 1 || f.GPUs != ""
	v.After = src.LastSeq() // before Recent: a request recorded in between comes twice, never not at all
	for _, r := range f.recent(src, sets, activityRows) {
		v.Rows = append(v.Rows, rowOf(r, sets))
	}
	v.Kept = len(src.Recent(activity.Filter{}, 0))
	if f.Model != "" && !contains(v.Models, f.Model) {
		v.Models = append(v.Models, f.Model)
	}
	v.Charts = buildCharts(src.Window(d), ws)
	for _, w := range windowChoices {
		v.Windows = append(v.Windows, windowLink{Value: w, Current: w == ws})
	}
	return p.render(c, http.StatusOK, "activity", p.pageData(c, "activity", "Activity", v))
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// handleActivityCharts answers the charts alone (the page's script swaps
// them in every few seconds): GET /activity/charts?window=.
func (p *Panel) handleActivityCharts(c echo.Context) error {
	src := p.activitySource()
	if src == nil {
		return p.fail(c, http.StatusNotFound, "activity not recorded", "this daemon records no activity")
	}
	_, ws, d, err := activityQuery(c, src.Keep())
	if err != nil {
		return p.fail(c, http.StatusBadRequest, "bad activity query", err.Error())
	}
	var buf bytes.Buffer
	if err := p.pages["activity"].ExecuteTemplate(&buf, "charts", buildCharts(src.Window(d), ws)); err != nil {
		p.log.Error("render activity charts", "err", err)
		return c.String(http.StatusInternalServerError, "internal error: the charts could not be rendered (see the daemon log)")
	}
	c.Response().Header().Set("Cache-Control", "no-store")
	return c.HTMLBlob(http.StatusOK, buf.Bytes())
}

// handleActivityHistory answers the history as JSON: GET
// /activity/history?window= (samples oldest first, and the switches).
func (p *Panel) handleActivityHistory(c echo.Context) error {
	src := p.activitySource()
	if src == nil {
		return c.JSON(http.StatusNotFound, api.APIError{Error: "activity not recorded", Detail: "this daemon records no activity"})
	}
	_, _, d, err := activityQuery(c, src.Keep())
	if err != nil {
		return c.JSON(http.StatusBadRequest, api.APIError{Error: "bad activity query", Detail: err.Error()})
	}
	c.Response().Header().Set("Cache-Control", "no-store")
	return c.JSON(http.StatusOK, src.Window(d))
}

// handleActivityEvents streams the requests recorded after ?after= (or
// Last-Event-ID; without either, from now) that pass the filters, as
// "request" events carrying a requestRow. A reader that fell behind the
// log's ring gets a "missed" event with the count it lost.
func (p *Panel) handleActivityEvents(c echo.Context) error {
	src := p.activitySource()
	if src == nil {
		return c.JSON(http.StatusNotFound, api.APIError{Error: "activity not recorded", Detail: "this daemon records no activity"})
	}
	f, _, _, err := activityQuery(c, src.Keep())
	if err != nil {
		return c.JSON(http.StatusBadRequest, api.APIError{Error: "bad activity query", Detail: err.Error()})
	}
	after := src.LastSeq()
	for _, v := range []string{c.Request().Header.Get("Last-Event-ID"), c.QueryParam("after")} {
		if n, err := strconv.ParseUint(v, 10, 64); err == nil {
			after = n
			break
		}
	}
	sets := p.profileSets()
	wake, cancel := src.Subscribe()
	defer cancel()
	w := sse.NewWriter(c.Response())
	if w.Comment("gpuhost activity") != nil {
		return nil
	}
	heartbeat := time.NewTicker(activityHeartbeat)
	defer heartbeat.Stop()
	for {
		if after, err = sendActivity(w, src, f, sets, after); err != nil {
			return nil // the client left
		}
		select {
		case <-c.Request().Context().Done():
			return nil
		case <-heartbeat.C:
			if w.Comment("keep-alive") != nil {
				return nil
			}
		case <-wake:
		}
	}
}

// sendActivity writes the requests after seq that match f and returns the
// newest seq it has looked at.
func sendActivity(w *sse.Writer, src ActivitySource, f requestFilter, sets map[string]gpuSet, seq uint64) (uint64, error) {
	rs, missed := src.After(seq)
	if missed > 0 {
		if err := w.Send(sse.Event{Type: "missed", Data: []byte(strconv.FormatUint(missed, 10))}); err != nil {
			return seq, err
		}
	}
	for _, r := range rs {
		seq = r.Seq
		if !f.match(r, sets) {
			continue
		}
		data, _ := json.Marshal(rowOf(r, sets))
		if err := w.Send(sse.Event{ID: strconv.FormatUint(r.Seq, 10), Type: "request", Data: data}); err != nil {
			return seq, err
		}
	}
	return seq, nil
}

// truncateRunes cuts s to at most n runes, for echoing a bad value.
func truncateRunes(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return string(r[:n]) + "…"
	}
	return s
}

// shortDur writes a window the way ?window= takes it (1h, 15m, 90s).
func shortDur(d time.Duration) string {
	switch {
	case d%time.Hour == 0:
		return strconv.Itoa(int(d/time.Hour)) + "h"
	case d%time.Minute == 0:
		return strconv.Itoa(int(d/time.Minute)) + "m"
	}
	return d.Round(time.Second).String()
}
