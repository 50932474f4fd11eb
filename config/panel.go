package config

// PanelConfig controls the web panel.
type PanelConfig struct {
	Disabled bool `yaml:"disabled"` // Turns off the web panel.
	// ActivityRequests is how many /v1 requests the Activity page's log
	// keeps in memory (0: 500). The history beside it is fixed: one sample
	// every 2 s for an hour.
	ActivityRequests int `yaml:"activity_requests"`
}

// maxActivityRequests bounds panel.activity_requests: the log lives in
// memory, a few hundred bytes an entry.
const maxActivityRequests = 100000

func (c *Config) panelValidate(add func(key, format string, args ...any)) {
	if n := c.Panel.ActivityRequests; n < 0 || n > maxActivityRequests {
		add("panel.activity_requests", "%d is not in 0..%d (0 keeps the default 500)", n, maxActivityRequests)
	}
}
