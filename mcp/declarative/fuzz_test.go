package declarative

import (
	"encoding/json"
	"gpuhost/mcp/connector"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var toolNameRE = regexp.MustCompile(`^[a-z0-9_]{3,64}$`)

// FuzzParse: no file makes Parse panic, and whatever it accepts builds
// read-only tools with valid names and schemas that marshal.
func FuzzParse(f *testing.F) {
	example, err := os.ReadFile(filepath.Join("examples", "attendance.yaml"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(example)
	f.Add([]byte(validFile))
	f.Add([]byte("name: x\nbase_url: http://h\ntools: [{name: t, description: d, path: '/{a}', params: [{name: a, in: path, type: enum, values: [b]}]}]\n"))
	f.Add([]byte("a: &a [*a]\n"))
	f.Add([]byte("name: x\ntools: [&t {name: t}, *t]\n"))
	f.Add([]byte("---\n---\n"))
	f.Add([]byte("name: [\n"))
	f.Add([]byte("name: x\nbase_url: http://h\ntools: [{name: t, description: d, path: '/{}{', select: '/~'}]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse("fuzz.yaml", data)
		if err != nil {
			if !strings.Contains(err.Error(), "fuzz.yaml") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		tools, err := c.Build(testEnv(c.Name(), nil))
		if err != nil {
			t.Fatalf("accepted file does not build: %v", err)
		}
		if len(tools) == 0 {
			t.Fatal("accepted a file without tools")
		}
		for _, tl := range tools {
			if !toolNameRE.MatchString(tl.Def.Name) || !strings.HasPrefix(tl.Def.Name, c.Name()+"_") {
				t.Fatalf("tool name %q", tl.Def.Name)
			}
			a := tl.Def.Annotations
			if !*a.ReadOnlyHint || *a.DestructiveHint {
				t.Fatalf("%s is not read-only", tl.Def.Name)
			}
			if _, err := json.Marshal(tl.Def); err != nil {
				t.Fatalf("%s: schema does not marshal: %v", tl.Def.Name, err)
			}
		}
		for i := range c.tools {
			k := &caller{c: c, t: &c.tools[i], full: "fuzz"}
			args := connector.Args{}
			for _, p := range c.tools[i].spec.Params {
				switch p.Type {
				case paramTypeInteger:
					args[p.Name] = 1.0
				case paramTypeDate:
					args[p.Name] = "2026-01-02"
				case paramTypeEnum:
					args[p.Name] = p.Values[0]
				default:
					args[p.Name] = "x/y"
				}
			}
			u, err := k.buildURL(args)
			if err != nil {
				// Only a path-enum value of "." or ".." may fail here.
				if !strings.Contains(err.Error(), "is not a valid value") {
					t.Fatalf("buildURL: %v", err)
				}
				continue
			}
			if u.Host != c.base.Host || u.Scheme != c.base.Scheme || !strings.HasPrefix(u.EscapedPath(), c.base.EscapedPath()) {
				t.Fatalf("URL %s escapes base %s", u, c.base)
			}
		}
	})
}

// FuzzPointer: a pointer that parses prints back to the same text.
func FuzzPointer(f *testing.F) {
	for _, s := range []string{"", "/", "/a~0b~1c", "/0/-", "~", "/a~", "/~2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := parsePointer(s)
		if err != nil {
			return
		}
		if p.String() != s {
			t.Fatalf("%q round-trips as %q", s, p.String())
		}
		var doc any = map[string]any{"a": []any{1.0}}
		_, _ = p.resolve(doc)
	})
}
