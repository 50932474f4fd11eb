package backend

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"gpuhost/units"
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

// TestRequestsRunning reads the engine's running requests over real HTTP,
// summed over its engines; a missing gauge or a bad answer is an error,
// never a 0 that would let a sleep overtake a request.
func TestRequestsRunning(t *testing.T) {
	tests := []struct {
		name, text string
		status     int
		want       int
		wantErr    bool
	}{
		{"idle", "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\"} 0\n", 200, 0, false},
		{"two engines", "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\"} 1\nvllm:num_requests_running{engine=\"1\"} 2\n", 200, 3, false},
		{"no gauge", "# TYPE vllm:engine_sleep_state gauge\nvllm:engine_sleep_state{sleep_state=\"awake\"} 1\n", 200, -1, true},
		{"status 500", "", 500, -1, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/metrics" {
					http.NotFound(w, r)
					return
				}
				w.WriteHeader(tt.status)
				_, _ = w.Write([]byte(tt.text))
			}))
			defer srv.Close()
			got, err := NewVLLM(units.Profile{Name: "p"}, srv.Client(), srv.URL).RequestsRunning(t.Context())
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("RequestsRunning = %d, %v; want %d (error %v)", got, err, tt.want, tt.wantErr)
			}
		})
	}
}
