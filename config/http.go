package config

import (
	"fmt"
	"net"
	"strings"
	"time"

	"gpuhost/internal/jsonlimit"
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
	// /activity/events, GET /mcp) one client may hold open at once; further
	// ones get 429. A panel tab holds one or two. Every loopback address
	// (127/8, ::1) is one client.
	MaxStreamsPerClient int `yaml:"max_streams_per_client"`
	// MaxStreams is how many event streams all clients together may hold
	// open at once, so that streams never take every connection.
	MaxStreams int `yaml:"max_streams"`
	// MaxConnectionsPerClient is how many connections one client may hold
	// open at once (every loopback address is one client); a further one
	// gets 503 and is closed. It bounds every long-lived answer (/v1
	// streams too) and slow request per client.
	MaxConnectionsPerClient int `yaml:"max_connections_per_client"`
	// WriteTimeout bounds each write of an answer: a client that stops
	// reading is cut once a write has waited this long. Answers may stream
	// for as long as the client reads them.
	WriteTimeout Duration `yaml:"write_timeout"`
	// MaxJSONDepth bounds the nesting of JSON request bodies on /api and
	// /mcp; deeper ones get 413 before they are decoded.
	MaxJSONDepth int `yaml:"max_json_depth"`
	// MaxJSONValues bounds the values (strings, numbers, objects, arrays,
	// object keys) in JSON request bodies on /api and /mcp; more get 413
	// before they are decoded.
	MaxJSONValues int `yaml:"max_json_values"`
	// DecodeMemoryBytes bounds what the /api and /mcp request bodies being
	// read and decoded hold at once, all clients together (each is charged
	// its buffer plus an estimate of what decoding it allocates); past it
	// requests get 503 + Retry-After.
	DecodeMemoryBytes int64 `yaml:"decode_memory_bytes"`
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
	if h.MaxConnectionsPerClient == 0 {
		h.MaxConnectionsPerClient = max(h.MaxConnections/4, 4)
	}
	if h.MaxStreamsPerClient == 0 {
		h.MaxStreamsPerClient = max(min(16, h.MaxConnectionsPerClient/2), 1)
	}
	if h.MaxStreams == 0 {
		h.MaxStreams = max(h.MaxConnections/2, h.MaxStreamsPerClient)
	}
	if h.WriteTimeout == 0 {
		h.WriteTimeout = Duration(60 * time.Second)
	}
	if h.MaxJSONDepth == 0 {
		h.MaxJSONDepth = 64
	}
	if h.MaxJSONValues == 0 {
		h.MaxJSONValues = 50_000
	}
	if h.DecodeMemoryBytes == 0 {
		h.DecodeMemoryBytes = 64 << 20
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
	if h.MaxConnectionsPerClient < 2 || h.MaxConnectionsPerClient > h.MaxConnections {
		add("http.max_connections_per_client", "%d is outside 2..http.max_connections (%d)", h.MaxConnectionsPerClient, h.MaxConnections)
	}
	if h.MaxStreamsPerClient < 1 || h.MaxStreamsPerClient > h.MaxConnections {
		add("http.max_streams_per_client", "%d is outside 1..http.max_connections (%d)", h.MaxStreamsPerClient, h.MaxConnections)
	} else if h.MaxStreamsPerClient >= h.MaxConnectionsPerClient {
		add("http.max_streams_per_client", "%d leaves no connection of http.max_connections_per_client (%d) for other requests", h.MaxStreamsPerClient, h.MaxConnectionsPerClient)
	}
	if h.MaxStreams < h.MaxStreamsPerClient || h.MaxStreams >= h.MaxConnections {
		add("http.max_streams", "%d is outside http.max_streams_per_client (%d)..http.max_connections-1 (%d)", h.MaxStreams, h.MaxStreamsPerClient, h.MaxConnections-1)
	}
	if h.WriteTimeout < Duration(time.Second) {
		add("http.write_timeout", "%s is too short (at least 1s)", h.WriteTimeout.D())
	}
	if h.MaxJSONDepth < 8 || h.MaxJSONDepth > 10000 {
		add("http.max_json_depth", "%d is outside 8..10000", h.MaxJSONDepth)
	}
	if h.MaxJSONValues < 1000 {
		add("http.max_json_values", "%d is too small (at least 1000)", h.MaxJSONValues)
	}
	// One request at its bounds must fit: its buffer (a chunked one
	// doubles to just over max_body_bytes), the body once more as decoded
	// strings, and its values.
	if one := 3*h.MaxBodyBytes + int64(h.MaxJSONValues)*jsonlimit.CostPerValue; h.DecodeMemoryBytes < one {
		add("http.decode_memory_bytes", "%d is smaller than one request at its bounds (%d: 3 × http.max_body_bytes + http.max_json_values × %d)", h.DecodeMemoryBytes, one, jsonlimit.CostPerValue)
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
