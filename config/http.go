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
