package units

import (
	"fmt"
	"strings"
)

// UnitFile is a parsed systemd unit file or drop-in: its sections in order,
// with every assignment kept (systemd keys may repeat and accumulate).
type UnitFile struct {
	Sections []UnitSection
	// Warnings are lines systemd would ignore with a warning (an assignment
	// outside any section, a line without '='), with their line numbers.
	Warnings []string
}

// UnitSection is one [Section] block. A section name may appear in several
// blocks; the accessors on UnitFile look at all of them in order.
type UnitSection struct {
	Name    string
	Entries []UnitEntry
}

// UnitEntry is one Key=Value assignment. Line is where it starts (1-based).
type UnitEntry struct {
	Key, Value string
	Line       int
}

// ParseUnitFile parses the subset of systemd's unit file syntax that gpuhost
// needs to read Conflicts= and ExecStart= back (doctor, tests): [Section]
// headers, Key=Value with surrounding whitespace trimmed, '#' and ';'
// comment lines (also inside a continued line, where systemd skips them),
// and a trailing backslash that joins the next line with a space. Values are
// kept raw: quoting inside ExecStart= is SplitExecStart's job.
//
// Like systemd, it fails on a malformed section header and only warns about
// assignments it cannot place or lines without '='.
func ParseUnitFile(text string) (UnitFile, error) {
	var uf UnitFile
	var cur *UnitSection
	process := func(logical string, line int) error {
		logical = strings.TrimSpace(logical)
		switch {
		case logical == "":
			return nil
		case logical[0] == '[':
			if len(logical) < 3 || logical[len(logical)-1] != ']' || strings.ContainsAny(logical[1:len(logical)-1], "[]") {
				return fmt.Errorf("parsing unit file: line %d: invalid section header %q", line, logical)
			}
			uf.Sections = append(uf.Sections, UnitSection{Name: logical[1 : len(logical)-1]})
			cur = &uf.Sections[len(uf.Sections)-1]
			return nil
		}
		key, value, ok := strings.Cut(logical, "=")
		key = strings.TrimSpace(key)
		switch {
		case !ok:
			uf.Warnings = append(uf.Warnings, fmt.Sprintf("line %d: missing '=', ignored: %q", line, logical))
		case key == "":
			uf.Warnings = append(uf.Warnings, fmt.Sprintf("line %d: empty key, ignored: %q", line, logical))
		case cur == nil:
			uf.Warnings = append(uf.Warnings, fmt.Sprintf("line %d: assignment outside of a section, ignored: %q", line, logical))
		default:
			cur.Entries = append(cur.Entries, UnitEntry{Key: key, Value: strings.TrimSpace(value), Line: line})
		}
		return nil
	}

	var buf strings.Builder
	start, inCont := 0, false
	for i, raw := range strings.Split(text, "\n") {
		raw = strings.TrimSuffix(raw, "\r")
		// Comment lines are dropped before continuation handling, as systemd
		// does: they neither continue nor break a continued line.
		if t := strings.TrimLeft(raw, " \t"); t != "" && (t[0] == '#' || t[0] == ';') {
			continue
		}
		escaped := trailingBackslash(raw)
		if escaped {
			raw = raw[:len(raw)-1] + " "
		}
		if !inCont {
			buf.Reset()
			start = i + 1
		}
		buf.WriteString(raw)
		if inCont = escaped; inCont {
			continue
		}
		if err := process(buf.String(), start); err != nil {
			return uf, err
		}
	}
	if inCont {
		if err := process(buf.String(), start); err != nil {
			return uf, err
		}
	}
	return uf, nil
}

// trailingBackslash reports whether l ends in an odd number of backslashes,
// i.e. an unescaped one that continues the line.
func trailingBackslash(l string) bool {
	n := 0
	for i := len(l) - 1; i >= 0 && l[i] == '\\'; i-- {
		n++
	}
	return n%2 == 1
}

// Values returns every value assigned to key in section, in file order,
// including empty ones (which reset list settings in systemd).
func (u UnitFile) Values(section, key string) []string {
	var out []string
	for _, s := range u.Sections {
		if s.Name != section {
			continue
		}
		for _, e := range s.Entries {
			if e.Key == key {
				out = append(out, e.Value)
			}
		}
	}
	return out
}

// Value returns the last value assigned to key in section, which is the one
// systemd uses for single-valued settings.
func (u UnitFile) Value(section, key string) (string, bool) {
	v := u.Values(section, key)
	if len(v) == 0 {
		return "", false
	}
	return v[len(v)-1], true
}

// List reads a space-separated list setting such as Conflicts= or After= as
// systemd does: values accumulate across assignments and an empty
// assignment clears what came before.
func (u UnitFile) List(section, key string) []string {
	var out []string
	for _, v := range u.Values(section, key) {
		if v == "" {
			out = nil
			continue
		}
		out = append(out, strings.Fields(v)...)
	}
	return out
}
