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
	var level int
	err := v.metrics(ctx, func(r io.Reader) (err error) {
		level, err = sleepLevelOf(r)
		return err
	})
	return level, err
}

// RequestsRunning reads vllm:num_requests_running, the requests the engine
// still executes. A request cut at the front door reaches the engine a
// moment later (through the unit's socket relay); a switch waits for this
// to read 0 before it puts the engine to sleep. An error when the gauge is
// missing.
func (v *VLLM) RequestsRunning(ctx context.Context) (int, error) {
	n := -1
	err := v.metrics(ctx, func(r io.Reader) error {
		tp := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := tp.TextToMetricFamilies(r)
		if err != nil {
			return fmt.Errorf("parse vLLM /metrics: %w", err)
		}
		fam, ok := fams["vllm:num_requests_running"]
		if !ok {
			return fmt.Errorf("vLLM /metrics has no vllm:num_requests_running")
		}
		sum := 0.0
		for _, m := range fam.GetMetric() {
			sum += m.GetGauge().GetValue()
		}
		n = int(sum)
		return nil
	})
	return n, err
}

// metrics reads vLLM's /metrics (at most maxMetricsBytes) with read.
func (v *VLLM) metrics(ctx context.Context, read func(io.Reader) error) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, v.base+"/metrics", nil)
	if err != nil {
		return err
	}
	resp, err := v.client.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s/metrics: %w", v.base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s/metrics: status %d", v.base, resp.StatusCode)
	}
	return read(io.LimitReader(resp.Body, maxMetricsBytes))
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
