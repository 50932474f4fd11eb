package panel

import (
	"slices"
	"strings"
	"testing"

	"gpuhost/api"
	"gpuhost/units"
)

func TestCodeSpans(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []textSpan
	}{
		{"", nil},
		{"plain", []textSpan{{Text: "plain"}}},
		{"check `nvidia-smi`", []textSpan{{Text: "check "}, {Text: "nvidia-smi", Code: true}}},
		{"run `gpuhost units install` (or `--adopt` for existing units)",
			[]textSpan{{Text: "run "}, {Text: "gpuhost units install", Code: true}, {Text: " (or "}, {Text: "--adopt", Code: true}, {Text: " for existing units)"}}},
		{"`a``b`", []textSpan{{Text: "a", Code: true}, {Text: "b", Code: true}}},
		{"empty `` pair", []textSpan{{Text: "empty "}, {Text: " pair"}}},
		{"one ` left", []textSpan{{Text: "one ` left"}}},
		{"<b>`<i>`</b>", []textSpan{{Text: "<b>"}, {Text: "<i>", Code: true}, {Text: "</b>"}}},
	} {
		if got := codeSpans(c.in); !slices.Equal(got, c.want) {
			t.Errorf("codeSpans(%q) = %+v, want %+v", c.in, got, c.want)
		}
	}
}

// FuzzCodeSpans: a doctor message may carry a backend's own text; the
// split never loses text, and leaves a backtick only when one is unpaired.
func FuzzCodeSpans(f *testing.F) {
	for _, s := range []string{"check `nvidia-smi`", "``", "a`b", "```", "`x` `y"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var text strings.Builder
		for _, sp := range codeSpans(s) {
			if sp.Text == "" {
				t.Fatalf("%q: an empty span", s)
			}
			text.WriteString(sp.Text)
		}
		n := strings.Count(s, "`")
		if got := strings.Count(text.String(), "`"); got != n%2 {
			t.Fatalf("%q: %d backticks left, want %d", s, got, n%2)
		}
		if len(text.String()) != len(s)-(n-n%2) {
			t.Fatalf("%q: %d bytes of text, want %d", s, text.Len(), len(s)-(n-n%2))
		}
	})
}

func TestWorstFirst(t *testing.T) {
	in := []api.DoctorCheck{
		{ID: "a", Severity: units.SeverityOK}, {ID: "b", Severity: units.SeverityWarn}, {ID: "c", Severity: units.SeverityOK},
		{ID: "d", Severity: units.SeverityFail}, {ID: "e", Severity: "odd"}, {ID: "f", Severity: units.SeverityWarn},
	}
	var ids []string
	for _, c := range worstFirst(in) {
		ids = append(ids, c.ID)
	}
	if want := []string{"d", "b", "f", "a", "c", "e"}; !slices.Equal(ids, want) {
		t.Errorf("order %q, want %q", ids, want)
	}
	if in[0].ID != "a" {
		t.Error("worstFirst sorted its input in place")
	}
}
