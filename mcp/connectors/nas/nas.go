package nas

import (
	"context"
	"errors"
	"fmt"
	"gpuhost/mcp/connector"
	"net/url"
	"strings"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
)

func init() {
	connector.Register("nas", func() connector.Connector { return &builder{} })
}

// Tool names.
const (
	ToolShares      = "nas_shares"
	ToolUtilization = "nas_utilization"
	ToolVolumes     = "nas_volumes"
)

const defaultTimeout = 15 * time.Second

// Config is the connector's section (mcp.connectors.nas).
type Config struct {
	// Timeout bounds each tool call including a re-login.
	Timeout time.Duration `yaml:"timeout"`
	NAS     []NAS         `yaml:"nas"`
}

// NAS is one configured Synology.
type NAS struct {
	Name        string `yaml:"name"`
	URL         string `yaml:"url"` // e.g. https://nas.lan:5001
	User        string `yaml:"user"`
	PasswordEnv string `yaml:"password_env"`
	// InsecureTLS skips certificate verification for DSM's self-signed
	// certificate; set it per NAS, knowingly.
	InsecureTLS bool `yaml:"insecure_tls"`
}

type builder struct{}

// Build validates the NAS list and returns the three tools. Each NAS gets
// one client whose session lives as long as the connector (until the next
// Build).
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
	clients := map[string]*client{}
	names := make([]string, 0, len(cfg.NAS))
	for _, n := range cfg.NAS {
		clients[n.Name] = newClient(n, hc, cfg.Timeout, env.Secrets, log)
		names = append(names, n.Name)
	}
	pick := func(args connector.Args) (*client, error) {
		name := args.String("nas")
		cl, ok := clients[name]
		if !ok {
			return nil, fmt.Errorf("unknown NAS %q: choose one of %s", name, strings.Join(names, ", "))
		}
		return cl, nil
	}
	tool := func(name, desc string, h func(context.Context, *client) (any, error)) connector.Tool {
		return connector.Tool{
			Def: mcpgo.NewTool(name,
				mcpgo.WithDescription(desc),
				mcpgo.WithReadOnlyHintAnnotation(true),
				mcpgo.WithDestructiveHintAnnotation(false),
				mcpgo.WithIdempotentHintAnnotation(true),
				mcpgo.WithSchemaAdditionalProperties(false),
				mcpgo.WithString("nas", mcpgo.Required(), mcpgo.Enum(names...), mcpgo.Description("Configured NAS name")),
			),
			Handler: func(ctx context.Context, args connector.Args) (any, error) {
				cl, err := pick(args)
				if err != nil {
					return nil, err
				}
				return h(ctx, cl)
			},
			Targets: &connector.Targets{Param: "nas", Values: names},
		}
	}
	return []connector.Tool{
		tool(ToolShares, "Shared folders of a configured Synology NAS with their paths and, where DSM reports it, free and total bytes of the volume they live on. Read-only.", shares),
		tool(ToolUtilization, "Current CPU load (%), memory use and per-interface network throughput (bytes/s) of a configured Synology NAS. Read-only.", utilization),
		tool(ToolVolumes, "Storage volumes of a configured Synology NAS: status (normal, degraded, crashed…), file system, total and used bytes. Read-only; needs an administrator DSM account.", volumes),
	}, nil
}

func (cfg *Config) validate() error {
	if len(cfg.NAS) == 0 {
		return errors.New("nas: at least one NAS is needed")
	}
	seen := map[string]bool{}
	for i, n := range cfg.NAS {
		where := fmt.Sprintf("nas[%d]", i)
		if strings.TrimSpace(n.Name) == "" {
			return fmt.Errorf("%s.name: must not be empty", where)
		}
		where = fmt.Sprintf("nas[%d] (%s)", i, n.Name)
		if seen[n.Name] {
			return fmt.Errorf("%s.name: duplicate NAS name %q", where, n.Name)
		}
		seen[n.Name] = true
		u, err := url.Parse(n.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("%s.url: %q is not an absolute http(s) URL such as https://nas:5001", where, n.URL)
		}
		if n.User == "" {
			return fmt.Errorf("%s.user: must not be empty", where)
		}
		if n.PasswordEnv == "" {
			return fmt.Errorf("%s.password_env: name the environment variable that holds the password", where)
		}
	}
	return nil
}

// Shares is nas_shares' result.
type Shares struct {
	NAS    string  `json:"nas"`
	Shares []Share `json:"shares"`
}

func shares(ctx context.Context, c *client) (any, error) {
	data, err := c.call(ctx, "SYNO.FileStation.List", 2, "list_share",
		url.Values{"additional": {`["volume_status"]`}})
	if err != nil {
		return nil, err
	}
	list, err := ParseShares(data)
	if err != nil {
		return nil, fmt.Errorf("NAS '%s': read share list: %w", c.name, err)
	}
	return &Shares{NAS: c.name, Shares: list}, nil
}

func utilization(ctx context.Context, c *client) (any, error) {
	data, err := c.call(ctx, "SYNO.Core.System.Utilization", 1, "get", nil)
	if err != nil {
		return nil, err
	}
	u, err := ParseUtilization(data)
	if err != nil {
		return nil, fmt.Errorf("NAS '%s': read utilization: %w", c.name, err)
	}
	u.NAS = c.name
	return u, nil
}

// Volumes is nas_volumes' result.
type Volumes struct {
	NAS     string   `json:"nas"`
	Volumes []Volume `json:"volumes"`
}

func volumes(ctx context.Context, c *client) (any, error) {
	data, err := c.call(ctx, "SYNO.Storage.CGI.Storage", 1, "load_info", nil)
	if err != nil {
		return nil, err
	}
	v, err := ParseVolumes(data)
	if err != nil {
		return nil, fmt.Errorf("NAS '%s': read volumes: %w", c.name, err)
	}
	return &Volumes{NAS: c.name, Volumes: v}, nil
}
