package config

import (
	"fmt"
	"net"
	"strings"
	"time"
)

// HTTPConfig holds the listener's limits and the rules of the front-door
// guard (internal/frontdoor). Every limit has a safe default; a value of 0
// in the file means "the default", never "unlimited".
type HTTPConfig struct {
	// AllowedHosts are extra names clients may use in the Host header
	// (e.g. gpu-box.lan); loopback names and the listen host always work.
	AllowedHosts []string `yaml:"allowed_hosts"`
	// MaxConnections caps open connections; further clients wait in the
	// kernel's backlog until one closes.
	MaxConnections int `yaml:"max_connections"`
	// IdleTimeout closes keep-alive connections that send nothing.
	IdleTimeout Duration `yaml:"idle_timeout"`
	// BodyReadTimeout bounds receiving a request body (not the answer).
	BodyReadTimeout Duration `yaml:"body_read_timeout"`
	// MaxHeaderBytes bounds the request line and headers.
	MaxHeaderBytes int `yaml:"max_header_bytes"`
	// MaxBodyBytes bounds request bodies on /api and /mcp (the /v1 proxy
	// has proxy.max_body_bytes and proxy.body_memory_bytes).
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// AuthFailuresPerMinute is how many wrong bearer tokens or panel
	// passwords one client address may send per minute before it gets 429.
	AuthFailuresPerMinute int `yaml:"auth_failures_per_minute"`
	// MaxStreamsPerClient is how many event streams (/api/events,
	// /activity/events) one client address may hold open at once; further
	// ones get 429. A panel tab holds one or two.
	MaxStreamsPerClient int `yaml:"max_streams_per_client"`
}

// MinTokenLength is the shortest bearer token accepted beyond loopback.
const MinTokenLength = 24

func (c *Config) httpDefaults() {
	h := &c.HTTP
	if h.MaxConnections == 0 {
		h.MaxConnections = 1024
	}
	if h.IdleTimeout == 0 {
		h.IdleTimeout = Duration(2 * time.Minute)
	}
	if h.BodyReadTimeout == 0 {
		h.BodyReadTimeout = Duration(60 * time.Second)
	}
	if h.MaxHeaderBytes == 0 {
		h.MaxHeaderBytes = 64 << 10
	}
	if h.MaxBodyBytes == 0 {
		h.MaxBodyBytes = 4 << 20
	}
	if h.AuthFailuresPerMinute == 0 {
		h.AuthFailuresPerMinute = 10
	}
	if h.MaxStreamsPerClient == 0 {
		h.MaxStreamsPerClient = min(16, h.MaxConnections)
	}
	if c.Proxy.BodyMemoryBytes == 0 {
		c.Proxy.BodyMemoryBytes = 256 << 20
	}
}

func (c *Config) httpValidate(add func(key, format string, args ...any)) {
	h := c.HTTP
	for i, name := range h.AllowedHosts {
		key := fmt.Sprintf("http.allowed_hosts[%d]", i)
		switch {
		case name == "" || strings.ContainsAny(name, "/:@ \t\r\n") && net.ParseIP(strings.Trim(name, "[]")) == nil:
			add(key, "%q must be a host name or IP address without scheme, port or path", name)
		case name == "*":
			add(key, "a wildcard would let any web page's DNS name reach the daemon (DNS rebinding); list the names")
		}
	}
	if h.MaxConnections < 8 {
		add("http.max_connections", "%d is too small (at least 8)", h.MaxConnections)
	}
	if h.MaxHeaderBytes < 4096 {
		add("http.max_header_bytes", "%d is too small (at least 4096)", h.MaxHeaderBytes)
	}
	if h.MaxBodyBytes < 1024 {
		add("http.max_body_bytes", "%d is too small (at least 1024)", h.MaxBodyBytes)
	}
	if h.MaxStreamsPerClient < 1 || h.MaxStreamsPerClient > h.MaxConnections {
		add("http.max_streams_per_client", "%d is outside 1..http.max_connections (%d)", h.MaxStreamsPerClient, h.MaxConnections)
	}
	if h.AuthFailuresPerMinute < 0 {
		add("http.auth_failures_per_minute", "%d is negative", h.AuthFailuresPerMinute)
	}
	if c.Proxy.BodyMemoryBytes < c.Proxy.MaxBodyBytes {
		add("proxy.body_memory_bytes", "%d is smaller than proxy.max_body_bytes (%d): one request could never be held", c.Proxy.BodyMemoryBytes, c.Proxy.MaxBodyBytes)
	}
}

// KeyRef names key for a message: "key (line N)" when the file sets it,
// the bare key when it is defaulted.
func (c *Config) KeyRef(key string) string {
	if ln, ok := c.keyLines[key]; ok {
		return fmt.Sprintf("%s (line %d)", key, ln)
	}
	return key
}

// CheckToken is what `gpuhost serve` checks of the API token before it
// listens, as a configuration error (*Error, exit 78): an api_token_file
// that cannot be read (also on loopback: the operator asked for a token),
// and, beyond loopback, a missing token or one shorter than
// MinTokenLength. Messages name the source, never the value.
func (c *Config) CheckToken() error {
	tok, err := c.APIToken()
	if err != nil {
		return &Error{File: c.path, Problems: []string{c.KeyRef("api_token_file") + ": " + err.Error()}}
	}
	if c.IsLoopback() {
		return nil
	}
	src, key := "$"+c.APITokenEnv, "api_token_env"
	if c.APITokenFile != "" {
		src, key = "api_token_file "+c.APITokenFile, "api_token_file"
	}
	if tok == "" {
		return &Error{File: c.path, Problems: []string{fmt.Sprintf("%s: %s is not loopback, so a bearer token is needed: set one in $%s or api_token_file (%s is empty)",
			c.KeyRef("listen"), c.Listen, c.APITokenEnv, src)}}
	}
	if n := len([]rune(tok)); n < MinTokenLength {
		return &Error{File: c.path, Problems: []string{fmt.Sprintf("%s: the bearer token in %s has %d characters; %s is not loopback, so at least %d are needed (e.g. openssl rand -hex 32)",
			c.KeyRef(key), src, n, c.Listen, MinTokenLength)}}
	}
	return nil
}
