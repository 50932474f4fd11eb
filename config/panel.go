package config

// PanelConfig controls the web panel.
type PanelConfig struct {
	Disabled bool `yaml:"disabled"`
}
