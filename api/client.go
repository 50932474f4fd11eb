package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"gpuhost/internal/exitclass"
	"gpuhost/internal/sse"
)

// Client is the CLI's view of a running daemon's API.
type Client struct {
	BaseURL string // e.g. http://127.0.0.1:8080
	Token   string // bearer token, when the daemon is not on loopback
	HTTP    *http.Client
	// Origin says how BaseURL was chosen (e.g. "--url", "$GPUHOST_URL",
	// "the default; no --url, $GPUHOST_URL or readable config"); a failure
	// to reach the daemon names it, so the user sees what was tried.
	Origin string
}

// NewClient returns a client with sane timeouts for the short calls; event
// streams use their own context.
func NewClient(baseURL, token string) *Client {
	return &Client{BaseURL: strings.TrimSuffix(baseURL, "/"), Token: token, HTTP: &http.Client{}}
}

// RemoteError is a JSON error answer of the API.
type RemoteError struct {
	Status int
	APIError
}

func (e *RemoteError) Error() string {
	return fmt.Sprintf("%s (HTTP %d): %s", e.APIError.Error, e.Status, e.Detail)
}

// ExitClass: the daemon refused what it was asked for by name or value
// (400, or a 404 for a name it does not know, such as an unknown
// profile or result) is the caller's usage error (64); any other
// refusal is a problem the command found (1). A 404 from the router
// itself ("not found": no such route, e.g. an older daemon) is not the
// caller's name being wrong.
func (e *RemoteError) ExitClass() exitclass.Class {
	switch {
	case e.Status == http.StatusBadRequest,
		e.Status == http.StatusNotFound && e.APIError.Error != "not found" && e.APIError.Error != http.StatusText(http.StatusNotFound):
		return exitclass.Usage
	}
	return exitclass.Problem
}

func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, rd)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if body != nil || method != http.MethodGet {
		// The front door refuses a non-GET without a JSON content type.
		req.Header.Set("Content-Type", "application/json")
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return c.unreachable(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("%s %s: read answer: %w", method, path, err)
	}
	if resp.StatusCode >= 400 {
		return remoteError(resp.StatusCode, data)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("%s %s: decode answer: %w", method, path, err)
		}
	}
	return nil
}

// remoteError decodes an error answer's body: the API's JSON error; on
// /v1 (GET /v1/models) an error in OpenAI's or Anthropic's shape, whose
// message becomes the detail; else the status text with the body as
// detail.
func remoteError(status int, data []byte) *RemoteError {
	re := &RemoteError{Status: status}
	if json.Unmarshal(data, &re.APIError) == nil && re.APIError.Error != "" {
		return re
	}
	var v1 struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(data, &v1) == nil && v1.Error.Message != "" {
		re.APIError = APIError{Error: strings.ToLower(http.StatusText(status)), Detail: v1.Error.Message}
		return re
	}
	re.APIError = APIError{Error: http.StatusText(status), Detail: strings.TrimSpace(string(data))}
	return re
}

// UnreachableError is a daemon that did not answer at all (no HTTP reply):
// nothing listens there, or the network is in the way.
type UnreachableError struct {
	URL    string
	Origin string
	Err    error
}

// ExitClass: the daemon did not answer (69).
func (e *UnreachableError) ExitClass() exitclass.Class { return exitclass.Unavailable }

func (e *UnreachableError) Error() string {
	if e.Origin == "" {
		return fmt.Sprintf("reach gpuhost at %s: %v", e.URL, e.Err)
	}
	return fmt.Sprintf("reach gpuhost at %s (%s): %v", e.URL, e.Origin, e.Err)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

func (c *Client) unreachable(err error) error {
	return &UnreachableError{URL: c.BaseURL, Origin: c.Origin, Err: err}
}

// Profiles fetches GET /api/profiles.
func (c *Client) Profiles(ctx context.Context) ([]ProfileInfo, error) {
	var ps []ProfileInfo
	err := c.do(ctx, http.MethodGet, "/api/profiles", nil, &ps)
	return ps, err
}

// Get fetches GET path (e.g. "/v1/models") into out.
func (c *Client) Get(ctx context.Context, path string, out any) error {
	return c.do(ctx, http.MethodGet, path, nil, out)
}

// Post sends body as JSON to POST path and decodes the answer into out
// (nil: ignored).
func (c *Client) Post(ctx context.Context, path string, body, out any) error {
	return c.do(ctx, http.MethodPost, path, body, out)
}

// Status fetches GET /api/status.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var st Status
	err := c.do(ctx, http.MethodGet, "/api/status", nil, &st)
	return st, err
}

// Doctor fetches GET /api/doctor.
func (c *Client) Doctor(ctx context.Context, profile string) (DoctorReport, error) {
	var rep DoctorReport
	path := "/api/doctor"
	if profile != "" {
		path += "?profile=" + profile
	}
	err := c.do(ctx, http.MethodGet, path, nil, &rep)
	return rep, err
}

// Switch starts a switch (POST /api/switch).
func (c *Client) Switch(ctx context.Context, req SwitchRequest) (SwitchAccepted, error) {
	var acc SwitchAccepted
	err := c.do(ctx, http.MethodPost, "/api/switch", req, &acc)
	return acc, err
}

// Events reads the SSE stream at path (e.g. "/api/events?since=12") and
// calls fn for each event until fn returns false, ctx ends or the stream
// closes.
func (c *Client) Events(ctx context.Context, path string, fn func(Event) bool) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.BaseURL+path, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "text/event-stream")
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("follow events: %w", c.unreachable(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("follow events: HTTP %d", resp.StatusCode)
	}
	rd := sse.NewReader(resp.Body, 4<<20)
	for {
		ev, err := rd.Next()
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, sse.ErrIncomplete) && !errors.Is(err, context.Canceled) && ctx.Err() == nil {
				return fmt.Errorf("follow events: %w", err)
			}
			return ctx.Err()
		}
		data := bytes.TrimSpace(ev.Data)
		if len(data) == 0 {
			continue
		}
		var e Event
		if err := json.Unmarshal(data, &e); err != nil {
			return fmt.Errorf("follow events: bad event %q: %w", data, err)
		}
		if !fn(e) {
			return nil
		}
	}
}

// Ask posts question to the daemon's agent loop (POST /api/ask) and hands
// the answer's event stream (server-sent events) to read, which decodes it
// (agent.ReadEvents) until the stop event. An API refusal (any status but
// 200: 400, 401, 429, 503) is a *RemoteError with the daemon's message; an
// answer that is not an event stream, and read's error, are errors naming
// BaseURL ("gave up waiting" when ctx ended first).
func (c *Client) Ask(ctx context.Context, question string, read func(stream io.Reader) error) error {
	// The body of agent.AskRequest; api cannot import agent (agent uses it).
	body, err := json.Marshal(struct {
		Question string `json:"question"`
	}{question})
	if err != nil {
		return fmt.Errorf("encode the question: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.BaseURL+"/api/ask", bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("ask at %s: %w", c.BaseURL, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			// The caller's deadline or Ctrl-C came before the answer's
			// headers: not an unreachable daemon.
			return fmt.Errorf("ask at %s: gave up waiting: %w", c.BaseURL, ctx.Err())
		}
		return fmt.Errorf("reach gpuhost at %s: %w", c.BaseURL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return remoteError(resp.StatusCode, data)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		return fmt.Errorf("ask at %s: the answer is %q, not an event stream (is this a gpuhost daemon with the agent?)", c.BaseURL, ct)
	}
	if err := read(resp.Body); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("ask at %s: gave up waiting: %w", c.BaseURL, ctx.Err())
		}
		return fmt.Errorf("ask at %s: %w", c.BaseURL, err)
	}
	return nil
}

// SwitchAndFollow starts a switch and calls step for each of its events
// until it ends; it returns the switch's final error (nil on success).
//
// When ctx ends after the daemon accepted the switch (Ctrl-C), the error is
// a *SwitchDetachedError: the switch goes on in the daemon.
func (c *Client) SwitchAndFollow(ctx context.Context, req SwitchRequest, step func(Event)) (err error) {
	// Subscribe before switching would need a second connection; the event
	// ring buffer makes "since" lossless instead.
	acc, err := c.Switch(ctx, req)
	if err != nil {
		return err
	}
	return c.follow(ctx, acc, step)
}

// Heal asks the daemon to start the wanted profile again (POST /api/heal).
func (c *Client) Heal(ctx context.Context) (SwitchAccepted, error) {
	var acc SwitchAccepted
	err := c.do(ctx, http.MethodPost, "/api/heal", HealRequest{}, &acc)
	return acc, err
}

// HealAndFollow is Heal followed like SwitchAndFollow.
func (c *Client) HealAndFollow(ctx context.Context, step func(Event)) error {
	acc, err := c.Heal(ctx)
	if err != nil {
		return err
	}
	return c.follow(ctx, acc, step)
}

// follow calls step for each event of the accepted switch until it ends.
func (c *Client) follow(ctx context.Context, acc SwitchAccepted, step func(Event)) (err error) {
	defer func() {
		if err != nil && ctx.Err() != nil {
			err = &SwitchDetachedError{SwitchID: acc.SwitchID, Events: acc.Events, Err: err}
		}
	}()
	var final error
	ended := false
	ferr := c.Events(ctx, acc.Events, func(e Event) bool {
		if e.SwitchID != acc.SwitchID {
			return true
		}
		step(e)
		if e.Kind == EventSwitch && (e.Status == StatusDone || e.Status == StatusFailed) {
			ended = true
			if e.Status == StatusFailed {
				final = errors.New(e.Message)
			}
			return false
		}
		return true
	})
	if !ended {
		if ferr == nil {
			ferr = errors.New("event stream ended before the switch finished")
		}
		return ferr
	}
	return final
}

// SwitchDetachedError is a switch the daemon accepted and carries on with
// while the caller stopped following it.
type SwitchDetachedError struct {
	SwitchID string
	Events   string // the events path that follows it
	Err      error
}

func (e *SwitchDetachedError) Error() string {
	return fmt.Sprintf("stopped following switch %s (it goes on in the daemon): %v", e.SwitchID, e.Err)
}

func (e *SwitchDetachedError) Unwrap() error { return e.Err }

// FormatEvent renders an event as one CLI line.
func FormatEvent(e Event) string {
	ts := e.Time.Format("15:04:05.000")
	switch e.Kind {
	case EventStep:
		mark := map[EventStatus]string{StatusStarted: "…", StatusDone: "✓", StatusFailed: "✗"}[e.Status]
		if e.Status == StatusStarted {
			return fmt.Sprintf("%s %s %-20s", ts, mark, e.Step)
		}
		line := fmt.Sprintf("%s %s %-20s %8.1f ms  %s", ts, mark, e.Step, e.DurationMS, e.Message)
		for _, j := range e.Journal {
			line += "\n      | " + j
		}
		return line
	case EventSwitch:
		if e.DurationMS > 0 {
			return fmt.Sprintf("%s ● %s (%.0f ms)", ts, e.Message, e.DurationMS)
		}
		return fmt.Sprintf("%s ● %s", ts, e.Message)
	}
	return fmt.Sprintf("%s · %s", ts, e.Message)
}
