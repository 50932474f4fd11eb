package config

import "time"

// AgentConfig is the `agent:` section: the tool-using agent loop behind
// /api/ask, the panel's Ask page, Telegram /ask and `gpuhost ask`.
type AgentConfig struct {
	Disabled bool `yaml:"disabled"` // Turns off the agent loop (/api/ask, the Ask page, Telegram /ask).
	// BaseURL/Model: default the daemon's own /v1 and the active model.
	BaseURL   string `yaml:"base_url"`
	Model     string `yaml:"model"`       // The model asked (default: the active profile's served name).
	APIKeyEnv string `yaml:"api_key_env"` // The environment variable with a key for base_url, when it needs one.
	// MaxSteps is the step cap (default 6).
	MaxSteps int `yaml:"max_steps"`
	// MaxTokens is the token budget over all steps (default 32768).
	MaxTokens int `yaml:"max_tokens"`
	// Deadline for one question (default 120s); ToolTimeout per call (default 20s).
	Deadline    Duration `yaml:"deadline"`
	ToolTimeout Duration `yaml:"tool_timeout"` // One tool call's time limit (default 20s).
	// MaxQuestionBytes (default 4000).
	MaxQuestionBytes int `yaml:"max_question_bytes"`
	// TelegramEvery is the per-chat rate limit of /ask (default 10s).
	TelegramEvery Duration `yaml:"telegram_every"`
}

// agentDefaults fills in the agent: section.
func (c *Config) agentDefaults() {
	a := &c.Agent
	if a.MaxSteps == 0 {
		a.MaxSteps = 6
	}
	if a.MaxTokens == 0 {
		a.MaxTokens = 32768
	}
	if a.Deadline == 0 {
		a.Deadline = Duration(120 * time.Second)
	}
	if a.ToolTimeout == 0 {
		a.ToolTimeout = Duration(20 * time.Second)
	}
	if a.MaxQuestionBytes == 0 {
		a.MaxQuestionBytes = 4000
	}
	if a.TelegramEvery == 0 {
		a.TelegramEvery = Duration(10 * time.Second)
	}
}

// agentValidate checks the agent: section.
func (c *Config) agentValidate(add func(key, format string, args ...any)) {
	checkHTTPURL(add, "agent.base_url", c.Agent.BaseURL)
	if c.Agent.MaxSteps < 1 || c.Agent.MaxSteps > 50 {
		add("agent.max_steps", "%d is not in 1..50", c.Agent.MaxSteps)
	}
}
