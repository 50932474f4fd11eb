package backend

import (
	"strings"
	"testing"
)

func TestSleepLevelOf(t *testing.T) {
	gauge := func(awake, off, discard int) string {
		return "# TYPE vllm:engine_sleep_state gauge\n" +
			`vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="awake"} ` + string(rune('0'+awake)) + "\n" +
			`vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="weights_offloaded"} ` + string(rune('0'+off)) + "\n" +
			`vllm:engine_sleep_state{engine="0",model_name="m",sleep_state="discard_all"} ` + string(rune('0'+discard)) + "\n"
	}
	tests := []struct {
		name, text string
		want       int
		wantErr    bool
	}{
		{"awake", gauge(1, 0, 0), 0, false},
		{"level 1", gauge(0, 1, 0), 1, false},
		{"level 2", gauge(0, 0, 1), 2, false},
		{"no gauge (older vLLM)", "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n", 0, false},
		{"not an exposition", "vllm:engine_sleep_state{ 1\n", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := sleepLevelOf(strings.NewReader(tt.text))
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("sleepLevelOf = %d, %v; want %d (error %v)", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func FuzzSleepLevelOf(f *testing.F) {
	f.Add("# TYPE vllm:engine_sleep_state gauge\nvllm:engine_sleep_state{sleep_state=\"discard_all\"} 1\n")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		level, err := sleepLevelOf(strings.NewReader(s))
		if err == nil && (level < 0 || level > 2) {
			t.Fatalf("level %d", level)
		}
	})
}
