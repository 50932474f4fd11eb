package config

import (
	"fmt"
	"net/url"
	"strconv"

	"gpuhost/internal/loopback"
)

// TelegramConfig controls the Telegram bot. The token is read at start from
// TokenFile or the environment variable TokenEnv, never from this file.
type TelegramConfig struct {
	Enabled   bool   `yaml:"enabled"`    // Runs the bot.
	TokenEnv  string `yaml:"token_env"`  // The environment variable holding the bot token (default GPUHOST_TELEGRAM_TOKEN).
	TokenFile string `yaml:"token_file"` // A file holding the bot token; wins over token_env.
	// APIURL is the Bot API server (tests point it at a fake).
	APIURL      string `yaml:"api_url"`
	AllowGroups bool   `yaml:"allow_groups"` // Answer in group chats too (ignored otherwise).
}

// telegramDefaults fills in the telegram: section.
func (c *Config) telegramDefaults() {
	if c.Telegram.TokenEnv == "" {
		c.Telegram.TokenEnv = "GPUHOST_TELEGRAM_TOKEN"
	}
	if c.Telegram.APIURL == "" {
		c.Telegram.APIURL = "https://api.telegram.org"
	}
}

// telegramValidate checks the telegram: section.
func (c *Config) telegramValidate(add func(key, format string, args ...any)) {
	if c.Telegram.APIURL != "" {
		if msg := checkBotAPIURL(c.Telegram.APIURL); msg != "" {
			add("telegram.api_url", "%s", msg)
		}
	}
}

// checkBotAPIURL returns why raw is not an acceptable Bot API server URL, or
// "". The bot puts its token in every request path, so the URL is parsed,
// not matched by prefix: https to any host, plain http only to a loopback IP
// literal (127.0.0.0/8, ::1) or "localhost" (a fake API in tests), and never
// user info, a query or a fragment, which would make the host read
// differently to a person and to the HTTP client.
func checkBotAPIURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Sprintf("%q is not a URL: %v", raw, err)
	}
	switch {
	case u.Scheme != "https" && u.Scheme != "http":
		return fmt.Sprintf("%q must be an https:// URL (plain http only to a loopback address, for tests)", raw)
	case u.Opaque != "" || u.Host == "" || u.Hostname() == "":
		return fmt.Sprintf("%q has no host", raw)
	case u.User != nil:
		return fmt.Sprintf("%q must not carry user info (user@host): the bot token would go to the host after the @", raw)
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return fmt.Sprintf("%q must not have a query or fragment", raw)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Sprintf("%q has an invalid port %q", raw, p)
		}
	}
	if u.Scheme == "http" {
		if host := u.Hostname(); !loopback.DialsLoopback(host) {
			return fmt.Sprintf("%q must be https: plain http is allowed only to a loopback IP address or localhost (for tests), not %q", raw, host)
		}
	}
	return ""
}
