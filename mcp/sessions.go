package mcp

import (
	"container/list"
	"context"
	"crypto/rand"
	"errors"
	"net/http"
	"strings"
	"sync"

	"github.com/mark3labs/mcp-go/server"
)

// DefaultMaxSessions is mcp.max_sessions' default: far more than the
// editors and agents of one box keep open, while the state they can pin
// stays a few MB (each session holds ~17 KB in mcp-go).
const DefaultMaxSessions = 256

// sessionPrefix is mcp-go's prefix for session ids; clients treat the id as
// opaque.
const sessionPrefix = "mcp-session-"

// sessionCap is the streamable HTTP server's session id manager: it mints
// ids, knows which are live, and keeps at most max of them. When an
// initialize would pass the cap, the least recently used session (the
// oldest idle one) is evicted: its state in mcp-go is dropped through the
// handler's own DELETE path, and its client gets 404 on its next request,
// which tells an MCP client to initialize again. Without a cap every
// initialize kept ~17 KB for the idle TTL (30,000 of them: RSS 29 →
// 546 MB). Clients on protocol revision 2026-07-28 get no session at all
// (mcp-go serves each of their requests with an ephemeral one), so only
// older clients count here.
type sessionCap struct {
	max int

	mu   sync.Mutex
	lru  *list.List // of string ids; front = most recently used
	byID map[string]*list.Element

	// drop removes an evicted session's state from the transport; set
	// once the handler exists.
	drop func(id string)
}

var _ server.SessionIdManager = (*sessionCap)(nil)

func newSessionCap(limit int) *sessionCap {
	if limit <= 0 {
		limit = DefaultMaxSessions
	}
	return &sessionCap{max: limit, lru: list.New(), byID: map[string]*list.Element{}}
}

// Generate mints a session for an initialize, evicting the least recently
// used sessions beyond the cap first.
func (c *sessionCap) Generate() string {
	id := sessionPrefix + strings.ToLower(rand.Text())
	c.mu.Lock()
	var victims []string
	for c.lru.Len() >= c.max {
		v := c.lru.Remove(c.lru.Back()).(string)
		delete(c.byID, v)
		victims = append(victims, v)
	}
	c.byID[id] = c.lru.PushFront(id)
	drop := c.drop
	c.mu.Unlock()
	// Outside the lock: the DELETE path calls Terminate.
	for _, v := range victims {
		if drop != nil {
			drop(v)
		}
	}
	return id
}

var errNoSession = errors.New("session not found (evicted, expired or never started): initialize again")

// Validate accepts a live session and marks it used.
func (c *sessionCap) Validate(id string) (isTerminated bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.byID[id]
	if !ok {
		return false, errNoSession
	}
	c.lru.MoveToFront(e)
	return false, nil
}

// Terminate forgets a session (a client's DELETE, the idle sweeper, or an
// eviction's own DELETE).
func (c *sessionCap) Terminate(id string) (isNotAllowed bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.byID[id]; ok {
		c.lru.Remove(e)
		delete(c.byID, id)
	}
	return false, nil
}

// dropVia returns a drop function that sends h the DELETE a client would
// send for id: mcp-go's only path that removes all of a session's state
// (its registration, per-session tools, log level, activity stamp).
func dropVia(h http.Handler) func(id string) {
	return func(id string) {
		req, err := http.NewRequestWithContext(context.Background(), http.MethodDelete, MountPath, nil)
		if err != nil {
			return // cannot happen: constant method and path
		}
		req.Header.Set(server.HeaderKeySessionID, id)
		h.ServeHTTP(discardWriter{}, req)
	}
}

// discardWriter answers the eviction's DELETE into nothing.
type discardWriter struct{}

func (discardWriter) Header() http.Header         { return http.Header{} }
func (discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (discardWriter) WriteHeader(int)             {}
