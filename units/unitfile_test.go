package units

import (
	"slices"
	"strings"
	"testing"
)

func TestParseUnitFile(t *testing.T) {
	const text = `# header comment
; another comment
[Unit]
Description = spaced out  
Conflicts=a.service b.service
Conflicts=c.service

[Service]
ExecStart=/bin/x \
  --one \
# a comment inside the continuation is skipped
  --two
Environment=A=1 B=2
Literal=ends in two backslashes \\
Next=1

[Unit]
After=network-online.target
Conflicts=
Conflicts=d.service
`
	uf, err := ParseUnitFile(text)
	if err != nil {
		t.Fatal(err)
	}
	if len(uf.Warnings) != 0 {
		t.Errorf("warnings: %q", uf.Warnings)
	}
	checks := []struct {
		section, key, want string
	}{
		{"Unit", "Description", "spaced out"},
		{"Service", "ExecStart", "/bin/x    --one    --two"}, // backslash becomes a space
		{"Service", "Environment", "A=1 B=2"},
		{"Service", "Literal", `ends in two backslashes \\`},
		{"Service", "Next", "1"},
		{"Unit", "After", "network-online.target"},
	}
	for _, c := range checks {
		if got, ok := uf.Value(c.section, c.key); !ok || got != c.want {
			t.Errorf("[%s] %s = %q (%v), want %q", c.section, c.key, got, ok, c.want)
		}
	}
	if got := uf.Values("Unit", "Conflicts"); !slices.Equal(got, []string{"a.service b.service", "c.service", "", "d.service"}) {
		t.Errorf("Values(Conflicts) = %q", got)
	}
	if got := uf.List("Unit", "Conflicts"); !slices.Equal(got, []string{"d.service"}) {
		t.Errorf("List(Conflicts) after an empty reset = %q, want [d.service]", got)
	}
	if _, ok := uf.Value("Unit", "Missing"); ok {
		t.Error("Value of a missing key reported present")
	}
	var lines []int
	for _, e := range uf.Sections[1].Entries {
		lines = append(lines, e.Line)
	}
	if !slices.Equal(lines, []int{9, 13, 14, 15}) {
		t.Errorf("entry lines = %v, want [9 13 14 15]", lines)
	}
}

func TestParseUnitFileWarningsAndErrors(t *testing.T) {
	tests := []struct {
		name, text string
		warnings   int
		err        string
	}{
		{"assignment before any section", "A=1\n[Unit]\nB=2\n", 1, ""},
		{"line without equals", "[Unit]\njunk\n", 1, ""},
		{"empty key", "[Unit]\n=x\n", 1, ""},
		{"continuation at end of file", "[Unit]\nA=1 \\", 0, ""},
		{"crlf", "[Unit]\r\nA=1\r\n", 0, ""},
		{"unterminated header", "[Unit\nA=1\n", 0, "line 1"},
		{"empty header", "[]\n", 0, "invalid section header"},
		{"nested brackets", "[a[b]]\n", 0, "invalid section header"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			uf, err := ParseUnitFile(tc.text)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("ParseUnitFile(%q) error = %v, want one containing %q", tc.text, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(uf.Warnings) != tc.warnings {
				t.Errorf("warnings = %q, want %d", uf.Warnings, tc.warnings)
			}
		})
	}
	uf, _ := ParseUnitFile("[Unit]\nA=1 \\")
	if v, _ := uf.Value("Unit", "A"); v != "1" {
		t.Errorf("continued last line = %q, want 1", v)
	}
}

func FuzzParseUnitFile(f *testing.F) {
	f.Add("[Unit]\nConflicts=a.service\n[Service]\nExecStart=/bin/x \\\n  y\n")
	f.Add(RenderDaemonUnit(DaemonUnit{Binary: "/usr/bin/gpuhost", Config: "/etc/gpuhost/c.yaml"}))
	f.Add("A=1\n[\n")
	f.Add("[S]\n\\\n#\\\nk=v\\\\\\")
	f.Fuzz(func(t *testing.T, text string) {
		uf, err := ParseUnitFile(text)
		if err != nil {
			return
		}
		for _, s := range uf.Sections {
			if s.Name == "" || strings.ContainsAny(s.Name, "[]") {
				t.Fatalf("bad section name %q", s.Name)
			}
			for _, e := range s.Entries {
				if e.Key == "" || e.Key != strings.TrimSpace(e.Key) || strings.Contains(e.Key, "=") ||
					e.Value != strings.TrimSpace(e.Value) || e.Line < 1 {
					t.Fatalf("bad entry %+v", e)
				}
			}
		}
	})
}
