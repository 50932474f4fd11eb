package metrics

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"gpuhost/api"
	"gpuhost/internal/apishape"
)

func TestCleanLabel(t *testing.T) {
	long := strings.Repeat("a", maxLabelBytes-1) + "é" // é straddles the cut
	tests := []struct{ in, want string }{
		{"qwen3-coder", "qwen3-coder"},
		{"", ""},
		{"bad\xffname", "bad\uFFFDname"},
		{"\xc3", "\uFFFD"},
		{strings.Repeat("x", 500), strings.Repeat("x", maxLabelBytes)},
		{long, strings.Repeat("a", maxLabelBytes-1)},
		{"llama3.1:8b", "llama3.1:8b"},
	}
	for _, tc := range tests {
		if got := cleanLabel(tc.in); got != tc.want {
			t.Errorf("cleanLabel(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestBoundedLabel(t *testing.T) {
	b := newBoundedLabel(2)
	tests := []struct{ in, want string }{
		{"a", "a"},
		{"", labelUnknown},
		{"b", "b"},
		{"c", labelOther},
		{"a", "a"},
		{"b\xff", labelOther},
	}
	for _, tc := range tests {
		if got := b.value(tc.in); got != tc.want {
			t.Errorf("value(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func FuzzCleanLabel(f *testing.F) {
	for _, s := range []string{"", "qwen3-coder", "bad\xffname", strings.Repeat("é", 100), "\xf0\x9f\x98"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := cleanLabel(s)
		if !utf8.ValidString(got) {
			t.Fatalf("cleanLabel(%q) = %q is not valid UTF-8", s, got)
		}
		if len(got) > maxLabelBytes {
			t.Fatalf("cleanLabel(%q) is %d bytes", s, len(got))
		}
		if again := cleanLabel(got); again != got {
			t.Fatalf("not idempotent: %q → %q → %q", s, got, again)
		}
		if utf8.ValidString(s) && !strings.HasPrefix(s, got) {
			t.Fatalf("a valid value %q was changed to %q beyond cutting", s, got)
		}
	})
}

// FuzzObserveRequest feeds the proxy's observation arbitrary client input:
// it must never panic (client_golang panics on invalid label values and on
// negative counter increments) and the registry must still gather.
func FuzzObserveRequest(f *testing.F) {
	f.Add(uint8(apishape.Chat), "qwen3-coder", 200, 10, 20, int64(time.Millisecond), int64(time.Second))
	f.Add(uint8(apishape.Other), "", -1, -5, -7, int64(-1), int64(-1))
	f.Add(uint8(255), "bad\xffname", 999, 0, 0, int64(0), int64(0))
	m := New(nil, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	// The proxy's series alone (the full registry would read the
	// Supervisor), on a pedantic registry that also checks consistency.
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m.proxyReqs, m.proxyTokens, m.proxyTTFB, m.proxyDur)
	f.Fuzz(func(t *testing.T, api uint8, model string, status, prompt, completion int, ttfb, dur int64) {
		m.ObserveRequest(apishape.Kind(api), model, status, prompt, completion, time.Duration(ttfb), time.Duration(dur))
		if _, err := reg.Gather(); err != nil {
			t.Fatalf("gather after ObserveRequest(%d, %q, %d, %d, %d, %d, %d): %v", api, model, status, prompt, completion, ttfb, dur, err)
		}
	})
}

func TestStandbySeries(t *testing.T) {
	st := api.Status{State: api.State{Phase: api.PhaseActive, Profile: "llama", Backend: "ollama", Unit: "gpuhost-ollama.service",
		Standby: []api.StandbyInfo{{Profile: "coder", Unit: "gpuhost-vllm.service", Mode: "sleep1", ResidualMiB: 512}}}}
	ch := make(chan prometheus.Metric, 32)
	collectState(ch, st)
	close(ch)
	var got []string
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatal(err)
		}
		desc := m.Desc().String()
		switch {
		case strings.Contains(desc, "gpuhost_backend_standby_info"):
			got = append(got, fmt.Sprintf("info %v", labelPairs(d.GetLabel())))
		case strings.Contains(desc, "gpuhost_backend_standby_residual_bytes"):
			got = append(got, fmt.Sprintf("residual %v %g", labelPairs(d.GetLabel()), d.GetGauge().GetValue()))
		}
	}
	want := []string{"info [mode=sleep1 profile=coder unit=gpuhost-vllm.service]", "residual [profile=coder unit=gpuhost-vllm.service] 5.36870912e+08"}
	if strings.Join(got, "; ") != strings.Join(want, "; ") {
		t.Errorf("standby series = %q, want %q", got, want)
	}
}

func labelPairs(ls []*dto.LabelPair) []string {
	var out []string
	for _, l := range ls {
		out = append(out, l.GetName()+"="+l.GetValue())
	}
	return out
}
