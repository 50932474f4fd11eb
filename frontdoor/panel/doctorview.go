package panel

import (
	"slices"
	"strings"

	"gpuhost/api"
	"gpuhost/units"
)

// severityRank orders severities worst first; an unknown one sorts after
// ok (shown, never hidden).
func severityRank(s units.Severity) int {
	switch s {
	case units.SeverityFail:
		return 0
	case units.SeverityWarn:
		return 1
	case units.SeverityOK:
		return 2
	}
	return 3
}

// worstFirst returns the checks sorted fail, warn, ok, keeping the
// doctor's order within a severity.
func worstFirst(checks []api.DoctorCheck) []api.DoctorCheck {
	out := slices.Clone(checks)
	slices.SortStableFunc(out, func(a, b api.DoctorCheck) int { return severityRank(a.Severity) - severityRank(b.Severity) })
	return out
}

// textSpan is a piece of a doctor message or fix: plain text, or a code
// span the doctor wrote between backticks (`journalctl -u vllm`).
type textSpan struct {
	Text string
	Code bool
}

// codeSpans splits s at its backticks into text and code spans, as
// Markdown's inline code: the template shows code spans in <code> and
// escapes both, so no backtick reaches the page. An unpaired backtick
// stays text.
func codeSpans(s string) []textSpan {
	var out []textSpan
	for s != "" {
		i := strings.IndexByte(s, '`')
		if i < 0 {
			break
		}
		j := strings.IndexByte(s[i+1:], '`')
		if j < 0 {
			break
		}
		if i > 0 {
			out = append(out, textSpan{Text: s[:i]})
		}
		if code := s[i+1 : i+1+j]; code != "" {
			out = append(out, textSpan{Text: code, Code: true})
		}
		s = s[i+2+j:]
	}
	if s != "" {
		out = append(out, textSpan{Text: s})
	}
	return out
}
