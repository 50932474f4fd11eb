package config

// MetricsConfig controls the Prometheus endpoint.
type MetricsConfig struct {
	Disabled bool `yaml:"disabled"` // Turns off /metrics.
}
