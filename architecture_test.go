package main

import (
	"bytes"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

// heavyModules are the third-party modules docs/architecture.md names by
// their short names. Every module go.mod requires directly has one
// (TestArchitectureTable fails on one without), and some row names it.
var heavyModules = map[string]string{
	"go-nvml":      "github.com/NVIDIA/go-nvml",
	"go-systemd":   "github.com/coreos/go-systemd",
	"godbus":       "github.com/godbus/dbus",
	"echo":         "github.com/labstack/echo",
	"cobra":        "github.com/spf13/cobra",
	"pflag":        "github.com/spf13/pflag",
	"mcp-go":       "github.com/mark3labs/mcp-go",
	"go-openai":    "github.com/sashabaranov/go-openai",
	"go-imap":      "github.com/emersion/go-imap",
	"go-message":   "github.com/emersion/go-message",
	"slack-go":     "github.com/slack-go/slack",
	"pgx":          "github.com/jackc/pgx",
	"prometheus":   "github.com/prometheus/client_golang",
	"client_model": "github.com/prometheus/client_model",
	"expfmt":       "github.com/prometheus/common",
	"promql":       "github.com/prometheus/prometheus",
	"progressbar":  "github.com/schollz/progressbar",
	"go-telegram":  "github.com/go-telegram/bot",
	"go-toml":      "github.com/pelletier/go-toml",
	"chromedp":     "github.com/chromedp/chromedp",
	"testscript":   "github.com/rogpeppe/go-internal",
	"term":         "golang.org/x/term",
	"x/net":        "golang.org/x/net",
	"x/text":       "golang.org/x/text",
	"x/tools":      "golang.org/x/tools",
	"yaml.v3":      "gopkg.in/yaml.v3",
	"jsonschema":   "github.com/santhosh-tekuri/jsonschema",
}

// archRow is one row of docs/architecture.md's package map.
type archRow struct {
	cell       string   // the first cell as written
	pkgs       []string // import paths the row is about
	unknown    []string // names in the first cell that are no package
	allowGo    []string // gpuhost packages it may import ("x/*" a subtree)
	allowHeavy []string // heavy modules it may import
	never      []string // gpuhost packages and heavy modules it must not link
	any        bool     // "everything" / "anything"
	owns       string
}

// modPkg is what `go list` says of one package of the module.
type modPkg struct {
	dir         string
	imports     []string // non-test imports
	deps        []string // non-test transitive dependencies
	testImports []string // imports of its tests (internal and external)
}

var backticked = regexp.MustCompile("`([^`]+)`")

var updateArch = flag.Bool("update-arch", false, "rewrite the dependency rules in docs/architecture.md from deps_test.go")

const (
	depRulesBegin = "<!-- dep-rules:begin (generated from deps_test.go by `go test -run TestArchitectureTable -update-arch .`; do not edit) -->"
	depRulesEnd   = "<!-- dep-rules:end -->"
)

// TestArchitectureTable checks docs/architecture.md's package map against
// `go list` and go.mod: every package of the module is in exactly one
// row (a row covers subpackages only where it names them, `x/<name>` or
// `x/...`); every file the "owns" column names exists in the row's
// folders; every gpuhost package and third-party module a row's packages
// import is in its "may import" column (third-party imports of their
// tests too), every gpuhost package named there is imported, every module
// named there is linked, nothing after "never" is linked, and an
// "imported by" claim names the importers there are; every module go.mod
// requires is named in some row; the dependency rules on the page are
// deps_test.go's, as generated.
func TestArchitectureTable(t *testing.T) {
	page, gomod := readArchInputs(t)
	for _, msg := range archMessages(t, page, gomod, listPackages(t), *updateArch) {
		t.Error(msg)
	}
}

// TestArchitectureTableCatchesPlants plants each kind of error in memory,
// one at a time, and checks that it is reported: a check that cannot fail
// keeps nothing.
func TestArchitectureTableCatchesPlants(t *testing.T) {
	page, gomod := readArchInputs(t)
	pkgs := listPackages(t)
	if msgs := archMessages(t, page, gomod, pkgs, false); len(msgs) > 0 {
		t.Fatalf("the unplanted page fails already:\n%s", strings.Join(msgs, "\n"))
	}
	cut := func(line string) string { // the page without the row that starts with line
		i := strings.Index(page, "\n"+line)
		j := strings.Index(page[i+1:], "\n")
		return page[:i] + page[i+1+j:]
	}
	plants := []struct {
		name        string
		page, gomod string
		edit        func(map[string]modPkg)
		want        string
	}{
		{name: "wrong file in owns", page: strings.Replace(page, "`supervisor.go`", "`supervisr.go`", 1), want: "says it owns supervisr.go, which is in none of its folders"},
		{name: "deleted row", page: cut("| `nvml/driver` |"), want: "package gpuhost/nvml/driver is in no row"},
		{name: "a package in no row", edit: func(m map[string]modPkg) { m["gpuhost/internal/planted"] = modPkg{dir: t.TempDir()} },
			want: "package gpuhost/internal/planted is in no row"},
		{name: "a row naming no package", page: strings.Replace(page, "| `nvml/driver` |", "| `nvml/drivr` |", 1), want: "names `nvml/drivr`, which is no package"},
		{name: "inverted rule", page: strings.Replace(page, "- `frontdoor/...` never depend on `appliance/...`", "- `frontdoor/...` may depend on `appliance/...`", 1),
			want: "the dependency rules differ from deps_test.go's"},
		{name: "missing module", page: strings.Replace(page, ", go-toml (Codex's `config.toml` from `client-config`)", "", 1),
			want: "go.mod requires github.com/pelletier/go-toml/v2 (go-toml), but no row's \"may import\" column names it"},
		{name: "module without a short name", gomod: strings.Replace(gomod, "require (\n", "require (\n\texample.com/planted v1.0.0\n", 1),
			want: "go.mod requires example.com/planted, which architecture_test.go's heavyModules has no short name for"},
		{name: "forbidden import", edit: func(m map[string]modPkg) {
			p := m["gpuhost/internal/sse"]
			p.imports = append(slices.Clone(p.imports), "gpuhost/internal/loopback")
			m["gpuhost/internal/sse"] = p
		}, want: "gpuhost/internal/sse imports gpuhost/internal/loopback, which its row's \"may import\" column does not name"},
		{name: "never linked", page: strings.Replace(page, "| `nvml`, go-nvml |", "| `nvml` — never go-nvml |", 1), want: "says never go-nvml, but it links it"},
	}
	for _, pl := range plants {
		t.Run(pl.name, func(t *testing.T) {
			pg, gm, m := page, gomod, maps.Clone(pkgs)
			if pl.page != "" {
				if pl.page == page {
					t.Fatal("the plant did not change the page (the text it replaces is gone)")
				}
				pg = pl.page
			}
			if pl.gomod != "" {
				gm = pl.gomod
			}
			if pl.edit != nil {
				pl.edit(m)
			}
			msgs := archMessages(t, pg, gm, m, false)
			if !slices.ContainsFunc(msgs, func(s string) bool { return strings.Contains(s, pl.want) }) {
				t.Errorf("planted %s: no report containing %q; reports:\n%s", pl.name, pl.want, strings.Join(msgs, "\n"))
			}
		})
	}
}

func readArchInputs(t *testing.T) (page, gomod string) {
	t.Helper()
	raw, err := os.ReadFile("docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	return string(raw), string(mod)
}

// archMessages runs every check of the page against the packages and
// go.mod; update rewrites stale generated rules instead of reporting them.
func archMessages(t *testing.T, page, gomod string, pkgs map[string]modPkg, update bool) []string {
	t.Helper()
	rows := parseArchTable(page, pkgs)
	if len(rows) < 20 {
		t.Fatalf("only %d rows parsed from the package map: the parser is broken", len(rows))
	}
	var msgs []string
	msgs = append(msgs, checkArchRows(rows, pkgs)...)
	msgs = append(msgs, checkCoverage(rows, pkgs)...)
	msgs = append(msgs, checkModules(rows, gomod)...)
	msgs = append(msgs, checkDepRulesProse(t, page, update)...)
	return msgs
}

// listPackages returns what `go list` says of each package of the module.
func listPackages(t *testing.T) map[string]modPkg {
	t.Helper()
	out, err := exec.Command("go", "list", "-f",
		"{{.ImportPath}}\t{{.Dir}}\t{{join .Imports \" \"}}\t{{join .Deps \" \"}}\t{{join .TestImports \" \"}} {{join .XTestImports \" \"}}", "./...").Output()
	if err != nil {
		t.Fatalf("go list ./...: %v", err)
	}
	pkgs := map[string]modPkg{}
	for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "\t")
		pkgs[f[0]] = modPkg{dir: f[1], imports: strings.Fields(f[2]), deps: strings.Fields(f[3]), testImports: strings.Fields(f[4])}
	}
	return pkgs
}

// parseArchTable reads the rows of the "## Package map" table.
func parseArchTable(text string, pkgs map[string]modPkg) []archRow {
	_, text, _ = strings.Cut(text, "## Package map")
	text, _, _ = strings.Cut(text, "\n## ")
	var rows []archRow
	for _, line := range strings.Split(text, "\n") {
		cells := strings.Split(line, " | ")
		if len(cells) != 3 || !strings.HasPrefix(line, "| `") {
			continue
		}
		r := archRow{cell: strings.TrimPrefix(cells[0], "| "), owns: cells[1]}
		r.pkgs, r.unknown = rowPackages(r.cell, pkgs)
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
// module root, `x/` (or `x`) the package x alone, `x/<name>` every
// package one level under x, `x/...` x and every package under it, and a
// bare name after `internal/y` a sibling under internal/. Names that are
// no package of the module come back as unknown.
func rowPackages(cell string, pkgs map[string]modPkg) (out, unknown []string) {
	parent := ""
	for _, m := range backticked.FindAllStringSubmatch(cell, -1) {
		name := strings.TrimSuffix(m[1], "/")
		var found []string
		switch {
		case name == "main":
			found = []string{"gpuhost"}
		case strings.HasSuffix(name, "/<name>") || strings.HasSuffix(name, "/..."):
			base := "gpuhost/" + name[:strings.LastIndex(name, "/")]
			deep := strings.HasSuffix(name, "/...")
			for p := range pkgs {
				rest, ok := strings.CutPrefix(p, base+"/")
				if ok && (deep || !strings.Contains(rest, "/")) || deep && p == base {
					found = append(found, p)
				}
			}
		default:
			if !strings.Contains(name, "/") && parent != "" {
				name = parent + "/" + name
			} else if _, ok := pkgs["gpuhost/"+name]; !ok && parent != "" {
				name = parent + "/" + name // `crm/crmwire` after `mcp/connectors/calc`
			}
			if i := strings.LastIndex(name, "/"); i > 0 && parent == "" {
				parent = name[:i]
			}
			if _, ok := pkgs["gpuhost/"+name]; ok {
				found = []string{"gpuhost/" + name}
			}
		}
		if len(found) == 0 {
			unknown = append(unknown, m[1])
		}
		out = append(out, found...)
	}
	sort.Strings(out)
	return out, unknown
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
	words := regexp.MustCompile(`[A-Za-z0-9._/\-]+`).FindAllString(cell, -1)
	for _, w := range words {
		w = strings.TrimRight(w, ".")
		if _, ok := heavyModules[w]; ok {
			heavy = append(heavy, w)
		}
	}
	return gopkgs, heavy
}

func checkArchRows(rows []archRow, pkgs map[string]modPkg) []string {
	var msgs []string
	for _, r := range rows {
		for _, u := range r.unknown {
			msgs = append(msgs, fmt.Sprintf("docs/architecture.md: the row %q names `%s`, which is no package of the module", r.cell, u))
		}
		if len(r.pkgs) == 0 {
			continue
		}
		msgs = append(msgs, checkOwnedFiles(r, pkgs)...)
		msgs = append(msgs, checkAllowed(r, pkgs)...)
		msgs = append(msgs, checkImportedBy(r, pkgs)...)
	}
	return msgs
}

// checkCoverage: every package of the module is in exactly one row.
func checkCoverage(rows []archRow, pkgs map[string]modPkg) []string {
	in := map[string][]string{}
	for _, r := range rows {
		for _, p := range r.pkgs {
			in[p] = append(in[p], r.cell)
		}
	}
	var msgs []string
	for p := range pkgs {
		switch n := len(in[p]); {
		case n == 0:
			msgs = append(msgs, fmt.Sprintf("docs/architecture.md: package %s is in no row of the package map (a row covers subpackages only where it names them: `x/<name>`, `x/...`)", p))
		case n > 1:
			msgs = append(msgs, fmt.Sprintf("docs/architecture.md: package %s is in %d rows: %q", p, n, in[p]))
		}
	}
	sort.Strings(msgs)
	return msgs
}

// checkOwnedFiles: each file the "owns" column names is in one of the
// row's folders.
func checkOwnedFiles(r archRow, pkgs map[string]modPkg) []string {
	var msgs []string
	for _, m := range backticked.FindAllStringSubmatch(r.owns, -1) {
		name := m[1]
		if !strings.HasSuffix(name, ".go") {
			continue
		}
		found := false
		for _, p := range r.pkgs {
			if _, err := os.Stat(filepath.Join(pkgs[p].dir, name)); err == nil {
				found = true
			}
		}
		if !found {
			msgs = append(msgs, fmt.Sprintf("docs/architecture.md: the row %q says it owns %s, which is in none of its folders", r.cell, name))
		}
	}
	return msgs
}

// checkModules: every module go.mod requires directly has a short name
// here and is named in some row's "may import" column.
func checkModules(rows []archRow, gomod string) []string {
	named := map[string]bool{}
	for _, r := range rows {
		for _, h := range r.allowHeavy {
			named[h] = true
		}
	}
	var msgs []string
	for _, mod := range directRequires(gomod) {
		short := heavyOf(mod)
		switch {
		case short == "":
			msgs = append(msgs, fmt.Sprintf("go.mod requires %s, which architecture_test.go's heavyModules has no short name for: add one, and name it in the row of each package that imports it", mod))
		case !named[short]:
			msgs = append(msgs, fmt.Sprintf("docs/architecture.md: go.mod requires %s (%s), but no row's \"may import\" column names it", mod, short))
		}
	}
	return msgs
}

// directRequires lists the modules go.mod requires without "// indirect".
func directRequires(gomod string) []string {
	var out []string
	in := false
	for _, line := range strings.Split(gomod, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "require (":
			in = true
		case line == ")":
			in = false
		case strings.HasPrefix(line, "require ") && !strings.HasSuffix(line, "("):
			if f := strings.Fields(line); len(f) >= 3 && !strings.Contains(line, "// indirect") {
				out = append(out, f[1])
			}
		case in && line != "" && !strings.Contains(line, "// indirect"):
			out = append(out, strings.Fields(line)[0])
		}
	}
	return out
}

// checkAllowed compares a row's "may import" column with its packages'
// imports (gpuhost packages; heavy modules, their tests' too) and links
// ("never").
func checkAllowed(r archRow, pkgs map[string]modPkg) []string {
	var msgs []string
	usedGo, linked := map[string]bool{}, map[string]bool{}
	for _, p := range r.pkgs {
		for _, imp := range pkgs[p].imports {
			if strings.HasPrefix(imp, "gpuhost/") || imp == "gpuhost" {
				usedGo[imp] = true
				if !r.any && !sameRow(imp, r) && !allowedGo(r.allowGo, imp) {
					msgs = append(msgs, fmt.Sprintf("docs/architecture.md: %s imports %s, which its row's \"may import\" column does not name", p, imp))
				}
			}
		}
		all := append(slices.Clone(pkgs[p].imports), pkgs[p].testImports...)
		slices.Sort(all)
		for _, imp := range slices.Compact(all) {
			if h := heavyOf(imp); h != "" {
				linked[h] = true
				if !r.any && !slices.Contains(r.allowHeavy, h) {
					msgs = append(msgs, fmt.Sprintf("docs/architecture.md: %s imports %s (%s), which its row's \"may import\" column does not name", p, imp, h))
				}
			}
		}
		for _, d := range pkgs[p].deps {
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
			msgs = append(msgs, fmt.Sprintf("docs/architecture.md: the row of %v names %s, but none of its packages (or their tests) links it", r.pkgs, h))
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
func checkImportedBy(r archRow, pkgs map[string]modPkg) []string {
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
		for imp, mp := range pkgs {
			if slices.Contains(mp.imports, p) && !strings.HasSuffix(imp, "test") {
				actual = append(actual, imp)
			}
		}
		sort.Strings(actual)
		for _, n := range named {
			if !slices.Contains(actual, n) {
				msgs = append(msgs, fmt.Sprintf("docs/architecture.md: %s is said to be imported by %s, but its importers are %v", p, n, actual))
			}
		}
		if only && len(actual) != len(named) {
			msgs = append(msgs, fmt.Sprintf("docs/architecture.md: %s is said to be imported only by %v, but its importers are %v", p, named, actual))
		}
	}
	return msgs
}

// checkDepRulesProse compares the page's dependency rules with the ones
// deps_test.go keeps (rewritten with -update-arch): prose about the rules
// is generated, so it cannot say the opposite of what is checked.
func checkDepRulesProse(t *testing.T, page string, update bool) []string {
	before, rest, ok1 := strings.Cut(page, depRulesBegin+"\n")
	got, after, ok2 := strings.Cut(rest, depRulesEnd)
	if !ok1 || !ok2 {
		return []string{"docs/architecture.md: no generated dependency rules (" + depRulesBegin + " … " + depRulesEnd + ")"}
	}
	want := renderDepRules()
	if got == want {
		return nil
	}
	if update {
		if err := os.WriteFile("docs/architecture.md", []byte(before+depRulesBegin+"\n"+want+depRulesEnd+after), 0o644); err != nil {
			t.Fatal(err)
		}
		return nil
	}
	return []string{"docs/architecture.md: the dependency rules differ from deps_test.go's (edited by hand, or the rules changed): run `go test -run TestArchitectureTable -update-arch .`\n--- page\n" + got + "--- deps_test.go\n" + want}
}

// renderDepRules writes depRules and godbusAllowed as the page's list.
func renderDepRules() string {
	short := func(list []string) string {
		var out []string
		for _, p := range list {
			if p == "gpuhost/..." {
				out = append(out, "any gpuhost package")
				continue
			}
			out = append(out, "`"+strings.TrimPrefix(strings.TrimPrefix(p, "gpuhost/"), "gpuhost")+"`")
		}
		return strings.Join(out, ", ")
	}
	var b bytes.Buffer
	for _, r := range depRules {
		fmt.Fprintf(&b, "- %s", short(r.pkgs))
		if len(r.except) > 0 {
			fmt.Fprintf(&b, " (except %s)", short(r.except))
		}
		fmt.Fprintf(&b, " never depend on %s: %s.\n", short(r.forbid), r.why)
	}
	allowed := keys(godbusAllowed)
	for i, p := range allowed {
		if p == "gpuhost" {
			allowed[i] = "gpuhost/main"
		}
	}
	fmt.Fprintf(&b, "- only %s link godbus.\n", short(allowed))
	return b.String()
}

// sameRow reports whether imp is a package of the row itself.
func sameRow(imp string, r archRow) bool { return slices.Contains(r.pkgs, imp) }

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
