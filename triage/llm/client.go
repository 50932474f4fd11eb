package llm

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"

	openai "github.com/sashabaranov/go-openai"
)

// newClient builds a go-openai client for an OpenAI-compatible base URL
// (ending in /v1). It returns the URL to show in errors and logs, with any
// password in it redacted.
func newClient(what, baseURL, apiKey string, hc *http.Client) (*openai.Client, string, error) {
	baseURL = strings.TrimSpace(baseURL)
	if baseURL == "" {
		return nil, "", fmt.Errorf("%s: base URL is required (an OpenAI-compatible endpoint such as http://127.0.0.1:8000/v1)", what)
	}
	u, err := url.Parse(baseURL)
	if err != nil {
		return nil, "", fmt.Errorf("%s: base URL is not a URL: %w", what, err)
	}
	shown := u.Redacted()
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, "", fmt.Errorf("%s: base URL %q must be http:// or https:// with a host", what, shown)
	}
	cfg := openai.DefaultConfig(apiKey)
	cfg.BaseURL = strings.TrimRight(baseURL, "/")
	if hc == nil {
		// Each call gets its own deadline from the context instead of a
		// client-wide timeout, so one setting (Timeout) governs.
		hc = &http.Client{}
	}
	cfg.HTTPClient = hc
	return openai.NewClientWithConfig(cfg), shown, nil
}

// clipRunes keeps the first n characters of s and reports whether it cut.
func clipRunes(s string, n int) (string, bool) {
	if utf8.RuneCountInString(s) <= n {
		return s, false
	}
	r := []rune(s)
	return string(r[:n]), true
}

// clipBytes keeps at most n bytes of s without splitting a character.
func clipBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}
