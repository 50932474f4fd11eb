package config

// BenchConfig bounds the daemon's store of bench results
// (<state_dir>/bench): after each stored result the oldest go beyond
// either bound. Uploads (POST /api/bench/results) can fill it from any
// client the front door lets through, so it is never unbounded.
type BenchConfig struct {
	// MaxResults is how many result files are kept.
	MaxResults int `yaml:"max_results"`
	// MaxBytes is how many bytes of result files are kept; the daemon
	// holds about as much in memory once listed (a result is tens of KiB).
	MaxBytes int64 `yaml:"max_bytes"`
}

// Defaults of the bench: section.
const (
	DefaultBenchMaxResults = 1000
	DefaultBenchMaxBytes   = 64 << 20
	// minBenchMaxBytes is room for a few of the largest uploads
	// (benchapi.MaxUploadBytes, 4 MiB).
	minBenchMaxBytes = 16 << 20
)

func (c *Config) benchDefaults() {
	if c.Bench.MaxResults == 0 {
		c.Bench.MaxResults = DefaultBenchMaxResults
	}
	if c.Bench.MaxBytes == 0 {
		c.Bench.MaxBytes = DefaultBenchMaxBytes
	}
}

func (c *Config) benchValidate(add func(key, format string, args ...any)) {
	if n := c.Bench.MaxResults; n < 1 {
		add("bench.max_results", "%d is too small (at least 1)", n)
	}
	if n := c.Bench.MaxBytes; n < minBenchMaxBytes {
		add("bench.max_bytes", "%d is too small (at least %d: a few results of the largest size an upload may have)", n, minBenchMaxBytes)
	}
}
