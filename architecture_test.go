package main

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// heavyModules are the third-party modules docs/architecture.md names by
// their short names; a package that imports one must say so in its row.
var heavyModules = map[string]string{
	"go-nvml":     "github.com/NVIDIA/go-nvml",
	"go-systemd":  "github.com/coreos/go-systemd",
	"godbus":      "github.com/godbus/dbus",
	"echo":        "github.com/labstack/echo",
	"cobra":       "github.com/spf13/cobra",
	"pflag":       "github.com/spf13/pflag",
	"mcp-go":      "github.com/mark3labs/mcp-go",
	"go-openai":   "github.com/sashabaranov/go-openai",
	"go-imap":     "github.com/emersion/go-imap",
	"slack-go":    "github.com/slack-go/slack",
	"pgx":         "github.com/jackc/pgx",
	"prometheus":  "github.com/prometheus/client_golang",
	"expfmt":      "github.com/prometheus/common",
	"progressbar": "github.com/schollz/progressbar",
	"go-telegram": "github.com/go-telegram/bot",
	"term":        "golang.org/x/term",
	"yaml.v3":     "gopkg.in/yaml.v3",
	"jsonschema":  "github.com/santhosh-tekuri/jsonschema",
}

// archRow is one row of docs/architecture.md's package map.
type archRow struct {
	pkgs       []string // import paths the row is about
	allowGo    []string // gpuhost packages it may import ("x/*" a subtree)
	allowHeavy []string // heavy modules it may import
	never      []string // gpuhost packages and heavy modules it must not link
	any        bool     // "everything" / "anything"
	owns       string
}

var backticked = regexp.MustCompile("`([^`]+)`")

// TestArchitectureTable checks docs/architecture.md's package map against
// `go list`: every gpuhost package and heavy module a row's packages
// import is in its "may import" column, every gpuhost package that column
// names is imported, every heavy module it names is linked, nothing after
// "never" is linked, and an "imported by" claim in the "owns" column names
// the importers there are ("only": exactly those; "by tests only": none).
func TestArchitectureTable(t *testing.T) {
	raw, err := os.ReadFile("docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := parseArchTable(string(raw))
	if len(rows) < 20 {
		t.Fatalf("only %d rows parsed from the package map: the parser is broken", len(rows))
	}
	imports, deps := listImports(t)
	for _, msg := range checkArchRows(rows, imports, deps) {
		t.Error(msg)
	}
}

// listImports returns each package's direct and transitive non-test
// imports, from `go list`.
func listImports(t *testing.T) (imports, deps map[string][]string) {
	t.Helper()
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}\t{{join .Imports \" \"}}\t{{join .Deps \" \"}}", "./...").Output()
	if err != nil {
		t.Fatalf("go list ./...: %v", err)
	}
	imports, deps = map[string][]string{}, map[string][]string{}
	for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "\t")
		imports[f[0]] = strings.Fields(f[1])
		deps[f[0]] = strings.Fields(f[2])
	}
	return imports, deps
}

// parseArchTable reads the rows of the "## Package map" table.
func parseArchTable(text string) []archRow {
	_, text, _ = strings.Cut(text, "## Package map")
	text, _, _ = strings.Cut(text, "\n## ")
	var rows []archRow
	for _, line := range strings.Split(text, "\n") {
		cells := strings.Split(line, " | ")
		if len(cells) != 3 || !strings.HasPrefix(line, "| `") {
			continue
		}
		r := archRow{owns: cells[1]}
		r.pkgs = rowPackages(strings.TrimPrefix(cells[0], "| "))
		allow, never, _ := strings.Cut(strings.TrimSuffix(cells[2], " |"), "never")
		r.any = strings.Contains(allow, "everything") || strings.Contains(allow, "anything")
		r.allowGo, r.allowHeavy = namesIn(allow)
		never, _, _ = strings.Cut(never, ":") // the reason follows a colon
		nGo, nHeavy := namesIn(never)
		r.never = append(nGo, nHeavy...)
		rows = append(rows, r)
	}
	return rows
}

// rowPackages turns the first cell into import paths: `main` is the
// module root, `x/` the package x, `x/<name>` every package one level
// under x, and a bare name after `internal/y` a sibling under internal/.
func rowPackages(cell string) []string {
	var out []string
	parent := ""
	for _, m := range backticked.FindAllStringSubmatch(cell, -1) {
		name := strings.TrimSuffix(m[1], "/")
		switch {
		case name == "main":
			out = append(out, "gpuhost")
			continue
		case strings.HasSuffix(name, "/<name>"):
			base := strings.TrimSuffix(name, "/<name>")
			dirs, _ := os.ReadDir(base)
			for _, d := range dirs {
				if d.IsDir() && d.Name() != "all" {
					out = append(out, "gpuhost/"+base+"/"+d.Name())
				}
			}
			continue
		case !strings.Contains(name, "/") && parent != "":
			name = parent + "/" + name
		}
		if i := strings.LastIndex(name, "/"); i > 0 && parent == "" {
			parent = name[:i]
		}
		if st, err := os.Stat(name); err == nil && st.IsDir() {
			out = append(out, "gpuhost/"+name)
		}
	}
	return out
}

// namesIn returns the gpuhost packages (backticked folder names that
// exist, or `x/*`) and the heavy modules (by short name) a cell names.
func namesIn(cell string) (gopkgs, heavy []string) {
	for _, m := range backticked.FindAllStringSubmatch(cell, -1) {
		name := strings.TrimSuffix(m[1], "/")
		if base, ok := strings.CutSuffix(name, "/*"); ok {
			gopkgs = append(gopkgs, "gpuhost/"+base+"/*")
		} else if st, err := os.Stat(name); err == nil && st.IsDir() && !strings.Contains(name, ".") {
			gopkgs = append(gopkgs, "gpuhost/"+name)
		}
	}
	words := regexp.MustCompile(`[A-Za-z0-9.\-]+`).FindAllString(cell, -1)
	for _, w := range words {
		if _, ok := heavyModules[w]; ok {
			heavy = append(heavy, w)
		}
	}
	return gopkgs, heavy
}

func checkArchRows(rows []archRow, imports, deps map[string][]string) []string {
	var msgs []string
	for _, r := range rows {
		if len(r.pkgs) == 0 {
			msgs = append(msgs, fmt.Sprintf("a row names no package that exists: %q", r.owns))
			continue
		}
		msgs = append(msgs, checkAllowed(r, imports, deps)...)
		msgs = append(msgs, checkImportedBy(r, imports)...)
	}
	return msgs
}

// checkAllowed compares a row's "may import" column with its packages'
// imports (gpuhost packages and heavy modules) and links ("never").
func checkAllowed(r archRow, imports, deps map[string][]string) []string {
	var msgs []string
	usedGo, linked := map[string]bool{}, map[string]bool{}
	for _, p := range r.pkgs {
		for _, imp := range imports[p] {
			if strings.HasPrefix(imp, "gpuhost/") || imp == "gpuhost" {
				usedGo[imp] = true
				if !r.any && !isOwnSub(imp, p) && !allowedGo(r.allowGo, imp) {
					msgs = append(msgs, fmt.Sprintf("docs/architecture.md: %s imports %s, which its row's \"may import\" column does not name", p, imp))
				}
			}
			if h := heavyOf(imp); h != "" && !r.any && !contains(r.allowHeavy, h) {
				msgs = append(msgs, fmt.Sprintf("docs/architecture.md: %s imports %s (%s), which its row's \"may import\" column does not name", p, imp, h))
			}
		}
		for _, d := range deps[p] {
			if h := heavyOf(d); h != "" {
				linked[h] = true
			}
			linked[d] = true
		}
	}
	for _, g := range r.allowGo {
		if !strings.HasSuffix(g, "/*") && !usedGo[g] {
			msgs = append(msgs, fmt.Sprintf("docs/architecture.md: the row of %v says it may import %s, but none of its packages imports it", r.pkgs, g))
		}
	}
	for _, h := range r.allowHeavy {
		if !linked[h] {
			msgs = append(msgs, fmt.Sprintf("docs/architecture.md: the row of %v names %s, but none of its packages links it", r.pkgs, h))
		}
	}
	for _, n := range r.never {
		if linked[n] {
			msgs = append(msgs, fmt.Sprintf("docs/architecture.md: the row of %v says never %s, but it links it", r.pkgs, n))
		}
	}
	return msgs
}

// checkImportedBy checks an "imported by A, B" claim of the owns column.
func checkImportedBy(r archRow, imports map[string][]string) []string {
	_, claim, ok := strings.Cut(r.owns, "imported ")
	if !ok {
		return nil
	}
	claim, _, _ = strings.Cut(claim, ";")
	only := strings.HasPrefix(claim, "only by") || strings.Contains(claim, "tests only")
	var named []string
	for _, m := range backticked.FindAllStringSubmatch(claim, -1) {
		name := strings.TrimSuffix(m[1], "/")
		if name == "main" {
			named = append(named, "gpuhost")
		} else if st, err := os.Stat(name); err == nil && st.IsDir() {
			named = append(named, "gpuhost/"+name)
		}
	}
	var msgs []string
	for _, p := range r.pkgs {
		var actual []string
		for imp, list := range imports {
			if contains(list, p) && !strings.HasSuffix(imp, "test") {
				actual = append(actual, imp)
			}
		}
		sort.Strings(actual)
		for _, n := range named {
			if !contains(actual, n) {
				msgs = append(msgs, fmt.Sprintf("docs/architecture.md: %s is said to be imported by %s, but its importers are %v", p, n, actual))
			}
		}
		if only && len(actual) != len(named) {
			msgs = append(msgs, fmt.Sprintf("docs/architecture.md: %s is said to be imported only by %v, but its importers are %v", p, named, actual))
		}
	}
	return msgs
}

// isOwnSub reports whether imp is p's own subpackage, which a row's
// folder covers.
func isOwnSub(imp, p string) bool {
	return strings.HasPrefix(imp, p+"/")
}

func allowedGo(allowed []string, imp string) bool {
	for _, a := range allowed {
		if base, ok := strings.CutSuffix(a, "/*"); ok && strings.HasPrefix(imp, base+"/") || a == imp {
			return true
		}
	}
	return false
}

func heavyOf(imp string) string {
	for short, mod := range heavyModules {
		if imp == mod || strings.HasPrefix(imp, mod+"/") {
			return short
		}
	}
	return ""
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
