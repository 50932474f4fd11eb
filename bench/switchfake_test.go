package bench

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"gpuhost/api"
)

// fakeStandbyDaemon speaks the part of the daemon's API that `bench switch`
// uses, with the switch sequence the standby feature will have: the old
// profile is put in standby (step "standby") and a profile that has run
// before is woken (step "wake") instead of started. Requests to /v1 for
// the other profile's model switch (auto_switch) and are held meanwhile.
type fakeStandbyDaemon struct {
	mu      sync.Mutex
	seq     uint64
	events  []api.Event
	active  string
	target  string // switching to, "" when not
	ran     map[string]bool
	n       int
	profile map[string]string // served name → profile
}

func newFakeStandbyDaemon(t *testing.T) string {
	d := &fakeStandbyDaemon{active: "a", ran: map[string]bool{"a": true}, profile: map[string]string{"ma": "a", "mb": "b"}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/status", func(w http.ResponseWriter, _ *http.Request) {
		d.mu.Lock()
		st := api.Status{State: api.State{Phase: api.PhaseActive, Profile: d.active},
			Profiles: []api.ProfileInfo{{Name: "a", Backend: "vllm", Model: "ma"}, {Name: "b", Backend: "vllm", Model: "mb"}}}
		d.mu.Unlock()
		_ = json.NewEncoder(w).Encode(st)
	})
	mux.HandleFunc("POST /api/switch", func(w http.ResponseWriter, r *http.Request) {
		var req api.SwitchRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		id, since := d.start(req.Profile)
		w.WriteHeader(http.StatusAccepted)
		_ = json.NewEncoder(w).Encode(api.SwitchAccepted{SwitchID: id, Profile: req.Profile, Events: "/api/events?since=" + strconv.FormatUint(since, 10)})
	})
	mux.HandleFunc("GET /api/events", func(w http.ResponseWriter, r *http.Request) {
		since, _ := strconv.ParseUint(r.URL.Query().Get("since"), 10, 64)
		w.Header().Set("Content-Type", "text/event-stream")
		for r.Context().Err() == nil {
			d.mu.Lock()
			var out []api.Event
			for _, e := range d.events {
				if e.Seq > since {
					out = append(out, e)
				}
			}
			d.mu.Unlock()
			for _, e := range out {
				b, _ := json.Marshal(e)
				fmt.Fprintf(w, "id: %d\ndata: %s\n\n", e.Seq, b)
				since = e.Seq
			}
			w.(http.Flusher).Flush()
			time.Sleep(2 * time.Millisecond)
		}
	})
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		var body struct{ Model string }
		_ = json.NewDecoder(r.Body).Decode(&body)
		want := d.profile[body.Model]
		for {
			d.mu.Lock()
			active, target := d.active, d.target
			d.mu.Unlock()
			if active == want && target == "" {
				break
			}
			if target == "" {
				d.start(want) // auto_switch
			}
			time.Sleep(2 * time.Millisecond)
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n")
		fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n")
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
	})
	return srv.URL
}

func (d *fakeStandbyDaemon) publish(e api.Event) {
	d.seq++
	e.Seq, e.Time = d.seq, time.Now()
	d.events = append(d.events, e)
}

// start begins a switch to p and runs it in the background; it returns
// the switch's id and the last event before it.
func (d *fakeStandbyDaemon) start(p string) (string, uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.n++
	id, since, old := fmt.Sprintf("s%d", d.n), d.seq, d.active
	d.target = p
	d.publish(api.Event{Kind: "switch", SwitchID: id, Profile: p, Status: "started"})
	steps := []string{"stop", "vram_release", "configure", "start", "ready", "verify"}
	if d.ran[p] {
		steps = []string{"standby", "wake", "ready", "verify"}
	}
	go func() {
		for _, s := range steps {
			time.Sleep(time.Millisecond)
			d.mu.Lock()
			prof := p
			if s == "standby" {
				prof = old // the old profile goes to standby
			}
			d.publish(api.Event{Kind: "step", SwitchID: id, Profile: prof, Step: s, Status: "done", DurationMS: 1, Message: prof + ": " + s + " done"})
			d.mu.Unlock()
		}
		d.mu.Lock()
		d.active, d.target, d.ran[p] = p, "", true
		d.publish(api.Event{Kind: "switch", SwitchID: id, Profile: p, Status: "done", DurationMS: float64(len(steps))})
		d.mu.Unlock()
	}()
	return id, since
}

// TestBenchSwitchStandby: against the switch sequence of the coming
// standby feature, a switch with a wake step is standby and one that
// started the unit is cold, each grouped on its own.
func TestBenchSwitchStandby(t *testing.T) {
	url := newFakeStandbyDaemon(t)
	r, err := RunSwitch(t.Context(), SwitchOptions{Daemon: api.NewClient(url, ""), A: "a", B: "b", Rounds: 2})
	if err != nil || r.Status != StatusOK {
		t.Fatalf("RunSwitch: %v %+v", err, r.Errors)
	}
	var modes []string
	for _, s := range r.Switch.Samples {
		modes = append(modes, s.From+">"+s.To+" "+s.Path+" "+s.Mode)
		// Each step keeps its message from the events (an outlier's why).
		for _, st := range s.Steps {
			if want := st.Step + " done"; !strings.HasSuffix(st.Message, want) {
				t.Errorf("sample %d %s step %s: message %q, want … %q", s.Round, s.To, st.Step, st.Message, want)
			}
		}
	}
	// b had never run: its first switch is cold; a was put in standby.
	want := []string{"a>b switch cold", "b>a switch standby", "a>b request standby", "b>a request standby",
		"a>b switch standby", "b>a switch standby", "a>b request standby", "b>a request standby"}
	if fmt.Sprint(modes) != fmt.Sprint(want) {
		t.Fatalf("samples %q\nwant %q", modes, want)
	}
	var groups []string
	for _, g := range r.Switch.Groups {
		groups = append(groups, fmt.Sprintf("%s>%s %s %s %d", g.From, g.To, g.Path, g.Mode, g.N))
	}
	wantG := []string{"a>b switch cold 1", "a>b switch standby 1", "a>b request standby 2", "b>a switch standby 2", "b>a request standby 2"}
	if fmt.Sprint(groups) != fmt.Sprint(wantG) {
		t.Errorf("groups %q\nwant %q", groups, wantG)
	}
	if m := r.Metrics(); len(m) != 2*len(wantG) || m[2].Name != "switch.a->b.switch_path.standby.first_token_ms" {
		t.Errorf("metrics %+v", m)
	}
}
