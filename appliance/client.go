package appliance

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// Client is the CLI's view of a running daemon's API.
type Client struct {
	BaseURL string // e.g. http://127.0.0.1:8080
	Token   string // bearer token, when the daemon is not on loopback
	HTTP    *http.Client
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
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return fmt.Errorf("reach gpuhost at %s: %w", c.BaseURL, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("%s %s: read answer: %w", method, path, err)
	}
	if resp.StatusCode >= 400 {
		re := &RemoteError{Status: resp.StatusCode}
		if json.Unmarshal(data, &re.APIError) != nil || re.APIError.Error == "" {
			re.APIError = APIError{Error: http.StatusText(resp.StatusCode), Detail: strings.TrimSpace(string(data))}
		}
		return re
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("%s %s: decode answer: %w", method, path, err)
		}
	}
	return nil
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
		return fmt.Errorf("follow events at %s: %w", c.BaseURL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("follow events: HTTP %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	var data strings.Builder
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "data:"):
			data.WriteString(strings.TrimSpace(strings.TrimPrefix(line, "data:")))
		case line == "":
			if data.Len() == 0 {
				continue
			}
			var e Event
			if err := json.Unmarshal([]byte(data.String()), &e); err != nil {
				return fmt.Errorf("follow events: bad event %q: %w", data.String(), err)
			}
			data.Reset()
			if !fn(e) {
				return nil
			}
		}
	}
	if err := sc.Err(); err != nil && !errors.Is(err, context.Canceled) && ctx.Err() == nil {
		return fmt.Errorf("follow events: %w", err)
	}
	return ctx.Err()
}

// SwitchAndFollow starts a switch and calls step for each of its events
// until it ends; it returns the switch's final error (nil on success).
func (c *Client) SwitchAndFollow(ctx context.Context, req SwitchRequest, step func(Event)) error {
	// Subscribe before switching would need a second connection; the event
	// ring buffer makes "since" lossless instead.
	acc, err := c.Switch(ctx, req)
	if err != nil {
		return err
	}
	var final error
	ended := false
	ferr := c.Events(ctx, acc.Events, func(e Event) bool {
		if e.SwitchID != acc.SwitchID {
			return true
		}
		step(e)
		if e.Kind == "switch" && (e.Status == "done" || e.Status == "failed") {
			ended = true
			if e.Status == "failed" {
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

// FormatEvent renders an event as one CLI line.
func FormatEvent(e Event) string {
	ts := e.Time.Format("15:04:05.000")
	switch e.Kind {
	case "step":
		mark := map[string]string{"started": "…", "done": "✓", "failed": "✗"}[e.Status]
		if e.Status == "started" {
			return fmt.Sprintf("%s %s %-20s", ts, mark, e.Step)
		}
		line := fmt.Sprintf("%s %s %-20s %8.1f ms  %s", ts, mark, e.Step, e.DurationMS, e.Message)
		for _, j := range e.Journal {
			line += "\n      | " + j
		}
		return line
	case "switch":
		if e.DurationMS > 0 {
			return fmt.Sprintf("%s ● %s (%.0f ms)", ts, e.Message, e.DurationMS)
		}
		return fmt.Sprintf("%s ● %s", ts, e.Message)
	}
	return fmt.Sprintf("%s · %s", ts, e.Message)
}
