package shelly

import (
	"context"
	"errors"
	"fmt"
	"gpuhost/mcp/connector"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
)

func init() {
	connector.Register("shelly", func() connector.Connector { return &builder{} })
}

// ToolName is the one tool this connector serves.
const ToolName = "shelly_get_device_status"

const (
	defaultTimeout = 10 * time.Second
	// maxBody caps what is read from a device or the cloud: a status
	// document is a few KiB, anything far larger is not a Shelly answer.
	maxBody = 1 << 20
)

// Config is the connector's section (mcp.connectors.shelly).
type Config struct {
	// Timeout bounds each status call; a Shelly that does not answer in
	// time is reported as unreachable instead of blocking the model.
	Timeout time.Duration `yaml:"timeout"`
	Devices []Device      `yaml:"devices"`
}

// Device is one configured Shelly. Mode selects which fields apply.
type Device struct {
	Name string `yaml:"name"`
	Mode string `yaml:"mode"` // "cloud" or "local"
	// Cloud mode.
	ID         string `yaml:"id"`
	Server     string `yaml:"server"`
	AuthKeyEnv string `yaml:"auth_key_env"`
	// Local mode.
	Address     string `yaml:"address"`
	PasswordEnv string `yaml:"password_env"`
}

type builder struct{}

// Build validates the device list and returns the status tool; a config
// error names the device and field so the operator can fix gpuhost.yaml.
func (c *builder) Build(env connector.Env) ([]connector.Tool, error) {
	var cfg Config
	if err := connector.DecodeConfig(env, &cfg); err != nil {
		return nil, err
	}
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("mcp.connectors.%s: %w", env.Name, err)
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = defaultTimeout
	}
	hc := env.Client(cfg.Timeout)
	log := env.Logger()
	byName := make(map[string]Device, len(cfg.Devices))
	names := make([]string, 0, len(cfg.Devices))
	for _, d := range cfg.Devices {
		byName[d.Name] = d
		names = append(names, d.Name)
	}
	cl := &client{http: hc, secrets: env.Secrets, timeout: cfg.Timeout, log: log}
	def := mcpgo.NewTool(ToolName,
		mcpgo.WithDescription("Current status of a configured Shelly smart plug/relay: online, active power in watts, "+
			"device temperature in °C, Wi-Fi signal (RSSI dBm) and the raw switch/wifi/sys status. Read-only."),
		mcpgo.WithReadOnlyHintAnnotation(true),
		mcpgo.WithDestructiveHintAnnotation(false),
		mcpgo.WithIdempotentHintAnnotation(true),
		mcpgo.WithSchemaAdditionalProperties(false),
		mcpgo.WithString("device", mcpgo.Required(), mcpgo.Enum(names...),
			mcpgo.Description("Configured Shelly device name")),
	)
	return []connector.Tool{{
		Def: def,
		Handler: func(ctx context.Context, args connector.Args) (any, error) {
			name := args.String("device")
			d, ok := byName[name]
			if !ok {
				return nil, fmt.Errorf("unknown device %q: choose one of %s", name, strings.Join(names, ", "))
			}
			return cl.status(ctx, d)
		},
		Targets: &connector.Targets{Param: "device", Values: names},
	}}, nil
}

func (cfg *Config) validate() error {
	if len(cfg.Devices) == 0 {
		return errors.New("devices: at least one device is needed")
	}
	seen := map[string]bool{}
	for i, d := range cfg.Devices {
		where := fmt.Sprintf("devices[%d]", i)
		if strings.TrimSpace(d.Name) == "" {
			return fmt.Errorf("%s.name: must not be empty", where)
		}
		where = fmt.Sprintf("devices[%d] (%s)", i, d.Name)
		if seen[d.Name] {
			return fmt.Errorf("%s.name: duplicate device name %q", where, d.Name)
		}
		seen[d.Name] = true
		switch d.Mode {
		case "cloud":
			if d.ID == "" {
				return fmt.Errorf("%s.id: cloud mode needs the Shelly Cloud device id", where)
			}
			if err := absoluteURL(d.Server); err != nil {
				return fmt.Errorf("%s.server: %w", where, err)
			}
			if d.AuthKeyEnv == "" {
				return fmt.Errorf("%s.auth_key_env: cloud mode needs the name of the env var holding the auth key", where)
			}
			if d.Address != "" || d.PasswordEnv != "" {
				return fmt.Errorf("%s: address/password_env apply to mode local only", where)
			}
		case "local":
			if err := absoluteURL(d.Address); err != nil {
				return fmt.Errorf("%s.address: %w", where, err)
			}
			if d.PasswordEnv != "" {
				return fmt.Errorf("%s.password_env: digest auth for local devices is not supported yet; disable the device's auth or use mode cloud", where)
			}
			if d.ID != "" || d.Server != "" || d.AuthKeyEnv != "" {
				return fmt.Errorf("%s: id/server/auth_key_env apply to mode cloud only", where)
			}
		default:
			return fmt.Errorf("%s.mode: %q is not cloud or local", where, d.Mode)
		}
	}
	return nil
}

func absoluteURL(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("parse %q: %w", s, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%q is not an absolute http(s) URL", s)
	}
	return nil
}

type client struct {
	http    *http.Client
	secrets *connector.Secrets
	timeout time.Duration
	log     *slog.Logger
}

// status fetches and normalises one device's status.
func (c *client) status(ctx context.Context, d Device) (*Status, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	if d.Mode == "cloud" {
		return c.cloudStatus(ctx, d)
	}
	return c.localStatus(ctx, d)
}

func (c *client) cloudStatus(ctx context.Context, d Device) (*Status, error) {
	if c.secrets == nil {
		return nil, &connector.MissingSecretError{Name: d.AuthKeyEnv}
	}
	key, err := c.secrets.Get(d.AuthKeyEnv)
	if err != nil {
		return nil, err
	}
	form := url.Values{"id": {d.ID}, "auth_key": {key}}
	endpoint := strings.TrimRight(d.Server, "/") + "/device/status"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, strings.NewReader(form.Encode()))
	if err != nil {
		return nil, fmt.Errorf("device '%s': build Shelly Cloud request: %w", d.Name, err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	body, code, ctype, err := c.do(req)
	if err != nil {
		return nil, fmt.Errorf("device '%s': Shelly Cloud %s did not answer: %s", d.Name, d.Server, redact(err.Error(), key))
	}
	switch {
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		return nil, fmt.Errorf("device '%s': Shelly Cloud rejected the auth key in %s (HTTP %d); regenerate it in the app (User settings -> Authorization cloud key) and check the server URL",
			d.Name, d.AuthKeyEnv, code)
	case code == http.StatusTooManyRequests:
		return nil, fmt.Errorf("device '%s': Shelly Cloud rate limit hit (one call per second); try again shortly", d.Name)
	case code != http.StatusOK:
		return nil, fmt.Errorf("device '%s': Shelly Cloud answered HTTP %d: %s", d.Name, code, snippet(body, key))
	}
	if !isJSON(ctype, body) {
		return nil, fmt.Errorf("device '%s': Shelly Cloud answered %s, not JSON (wrong server URL?): %s", d.Name, ctype, snippet(body, key))
	}
	st, err := ParseCloud(body)
	if err != nil {
		var ce *CloudError
		if errors.As(err, &ce) {
			return nil, fmt.Errorf("device '%s': Shelly Cloud refused the request: %s", d.Name, redact(ce.Error(), key))
		}
		return nil, fmt.Errorf("device '%s': read Shelly Cloud answer: %s", d.Name, redact(err.Error(), key))
	}
	st.Device, st.Source = d.Name, "cloud"
	return st, nil
}

func (c *client) localStatus(ctx context.Context, d Device) (*Status, error) {
	endpoint := strings.TrimRight(d.Address, "/") + "/rpc/Shelly.GetStatus"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint, nil)
	if err != nil {
		return nil, fmt.Errorf("device '%s': build local RPC request: %w", d.Name, err)
	}
	body, code, ctype, err := c.do(req)
	if err != nil {
		return nil, fmt.Errorf("device '%s' is offline or unreachable at its configured address: %w", d.Name, err)
	}
	switch {
	case code == http.StatusUnauthorized:
		return nil, fmt.Errorf("device '%s' requires authentication, which gpuhost does not support for local devices yet; disable it on the device or use mode cloud", d.Name)
	case code != http.StatusOK:
		return nil, fmt.Errorf("device '%s': local RPC Shelly.GetStatus answered HTTP %d: %s", d.Name, code, snippet(body, ""))
	}
	if !isJSON(ctype, body) {
		return nil, fmt.Errorf("device '%s': local RPC answered %s, not JSON (is it a Gen2+ Shelly?): %s", d.Name, ctype, snippet(body, ""))
	}
	st, err := ParseLocal(body)
	if err != nil {
		return nil, fmt.Errorf("device '%s': read Shelly.GetStatus answer: %w", d.Name, err)
	}
	st.Device, st.Source = d.Name, "local"
	return st, nil
}

// do sends req and returns at most maxBody bytes of the body. The error
// is the transport cause without the URL (url.Error prints it), so a
// query-string credential could never leak through it.
func (c *client) do(req *http.Request) ([]byte, int, string, error) {
	resp, err := c.http.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			if ue.Timeout() {
				return nil, 0, "", fmt.Errorf("timed out after %s", c.timeout)
			}
			err = ue.Err
		}
		return nil, 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return nil, 0, "", fmt.Errorf("read body: %w", err)
	}
	return body, resp.StatusCode, resp.Header.Get("Content-Type"), nil
}

func isJSON(ctype string, body []byte) bool {
	mt, _, _ := mime.ParseMediaType(ctype)
	if mt == "text/html" {
		return false
	}
	t := strings.TrimSpace(string(body[:min(len(body), 64)]))
	return strings.HasPrefix(t, "{")
}

// snippet returns a short, single-line, secret-free excerpt of a body for
// an error message.
func snippet(body []byte, secret string) string {
	s := strings.Join(strings.Fields(string(body)), " ")
	s = redact(s, secret)
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	if s == "" {
		s = "(empty body)"
	}
	return s
}

// redact removes secret (raw and URL-encoded) from s.
func redact(s, secret string) string {
	if secret == "" {
		return s
	}
	s = strings.ReplaceAll(s, secret, "[redacted]")
	if enc := url.QueryEscape(secret); enc != secret {
		s = strings.ReplaceAll(s, enc, "[redacted]")
	}
	return s
}
