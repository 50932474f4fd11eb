package panel

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gpuhost/api"
)

// TestPanelScriptKnowsEvents checks that every event kind, status and
// Detail key the panel's script matches exists in gpuhost/api: the script
// cannot import the constants, and a kind renamed in Go would otherwise
// leave the live progress line silently empty.
func TestPanelScriptKnowsEvents(t *testing.T) {
	src, err := os.ReadFile("static/panel.js")
	if err != nil {
		t.Fatal(err)
	}
	js := string(src)
	var kinds, statuses, details []string
	for _, k := range api.EventKinds() {
		kinds = append(kinds, string(k))
	}
	for _, s := range api.EventStatuses() {
		statuses = append(statuses, string(s))
	}
	details = api.DetailKeys()

	// Listeners on the /api/events streams name kinds (the SSE event type
	// is the kind); other streams (/activity/events) have their own.
	var listened []string
	for _, chunk := range strings.Split(js, "new EventSource(")[1:] {
		if !strings.HasPrefix(chunk, "'/api/events") {
			continue
		}
		for _, m := range regexp.MustCompile(`es\.addEventListener\('([a-z_]+)'`).FindAllStringSubmatch(chunk, -1) {
			listened = append(listened, m[1])
		}
	}
	tests := []struct {
		what  string
		found []string
		known []string
		least int // the script matches at least this many: the patterns still find it
	}{
		{"kind matched (e.kind === …)", submatches(js, `\.kind === '([a-z_]+)'`), kinds, 2},
		{"kind listened to on /api/events", listened, kinds, 3},
		{"status matched (status === …)", submatches(js, `\bstatus === '([a-z_]+)'`), statuses, 4},
		{"Detail key read in stepLabel (d.…)", submatches(stepLabelJS(t, js), `\bd\.([a-z_]+)`), details, 4},
	}
	for _, tt := range tests {
		if len(slices.Compact(slices.Sorted(slices.Values(tt.found)))) < tt.least {
			t.Errorf("%s: found %v, want at least %d distinct: the script changed shape, update this test", tt.what, tt.found, tt.least)
		}
		for _, v := range tt.found {
			if !slices.Contains(tt.known, v) {
				t.Errorf("%s: the script matches %q, which gpuhost/api does not define (known: %v)", tt.what, v, tt.known)
			}
		}
	}
}

// TestPanelScriptStepLabels checks that the script's table of step words
// has the steps of stepLabels in views.go (the page without script and
// the live line must word a step alike) and that each is a step of
// gpuhost/api.
func TestPanelScriptStepLabels(t *testing.T) {
	src, err := os.ReadFile("static/panel.js")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(src), "const labels = {")
	if !ok {
		t.Fatal("static/panel.js has no `const labels = {` table")
	}
	table, _, _ := strings.Cut(rest, "};")
	js := submatches(table, `(?m)^\s*([a-z_]+):`)
	var goKeys []string
	for k := range stepLabels {
		goKeys = append(goKeys, k)
	}
	if got, want := slices.Sorted(slices.Values(js)), slices.Sorted(slices.Values(goKeys)); !slices.Equal(got, want) {
		t.Errorf("panel.js labels %v, views.go stepLabels %v", got, want)
	}
	for _, k := range js {
		if !slices.Contains(api.Steps(), k) {
			t.Errorf("panel.js labels the step %q, which gpuhost/api does not define (%v)", k, api.Steps())
		}
	}
}

func submatches(s, re string) []string {
	var out []string
	for _, m := range regexp.MustCompile(re).FindAllStringSubmatch(s, -1) {
		out = append(out, m[1])
	}
	return out
}

// stepLabelJS is the body of the script's stepLabel, which reads the
// step events' Detail.
func stepLabelJS(t *testing.T, js string) string {
	t.Helper()
	_, rest, ok := strings.Cut(js, "function stepLabel(")
	if !ok {
		t.Fatal("static/panel.js has no function stepLabel")
	}
	body, _, _ := strings.Cut(rest, "\n  }\n")
	return body
}
