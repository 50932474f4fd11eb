package backend

import (
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// maxMetricsBytes bounds what SleepLevel reads of /metrics.
const maxMetricsBytes = 8 << 20

// SleepLevel reads the level vLLM sleeps at from its own gauge
// vllm:engine_sleep_state (sleep_state="weights_offloaded" is level 1,
// "discard_all" level 2): /is_sleeping does not say, and a backend put to
// sleep behind gpuhost's back must be woken the way it slept (after level
// 1 a plain wake_up, after level 2 the reload). 0: awake, or the gauge is
// missing (an older vLLM).
func (v *VLLM) SleepLevel(ctx context.Context) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, v.base+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := v.client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("GET %s/metrics: %w", v.base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("GET %s/metrics: status %d", v.base, resp.StatusCode)
	}
	return sleepLevelOf(io.LimitReader(resp.Body, maxMetricsBytes))
}

// sleepLevelOf finds the sleep level in a Prometheus text exposition.
func sleepLevelOf(r io.Reader) (int, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return 0, fmt.Errorf("parse vLLM /metrics: %w", err)
	}
	fam, ok := fams["vllm:engine_sleep_state"]
	if !ok {
		return 0, nil
	}
	level := 0
	for _, m := range fam.GetMetric() {
		if m.GetGauge().GetValue() != 1 {
			continue
		}
		for _, l := range m.GetLabel() {
			if l.GetName() != "sleep_state" {
				continue
			}
			switch l.GetValue() {
			case "weights_offloaded":
				level = max(level, 1)
			case "discard_all":
				level = 2
			}
		}
	}
	return level, nil
}
