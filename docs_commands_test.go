package main

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// shellLangs are the fence languages whose lines are commands. In a
// `console` block only the lines after a `$ ` prompt are; in the others
// every line is, except blank lines, comment lines and `export` lines
// (the shell's set-up: the journeys' startdemo exports GPUHOST_URL).
var shellLangs = map[string]bool{"sh": true, "bash": true, "shell": true, "zsh": true, "console": true}

// notRunReasons is the fixed list of reasons a docs page may give for a
// command no journey runs, written at the end of the line's comment as
// `# not run: REASON[, REASON]`. docs/development-and-ci.md lists them.
var notRunReasons = map[string]string{
	"gpu":          "needs an NVIDIA GPU and its driver",
	"root":         "needs root",
	"systemd":      "needs systemd as PID 1 (an installed box)",
	"box-config":   "reads the box's config file (/etc/gpuhost/gpuhost.yaml); the demo runs its embedded config",
	"real-backend": "needs a real vLLM or Ollama",
	"client":       "runs a third-party client (Claude Code, Codex, opencode) that the suite does not install",
	"network":      "reaches beyond the machine (a download)",
	"placeholder":  "has names to fill in (a result id, a pairing code, a user id)",
	"build":        "a make target: builds from the checkout or runs the suite",
	"long":         "takes minutes against the demo; a journey runs the same command with smaller flags",
}

// notRunRe takes the reasons off a line's comment.
var notRunRe = regexp.MustCompile(`not run: ([a-z-]+(?:, [a-z-]+)*)\s*$`)

// docCommand is one command line of a fenced shell block in a docs page.
type docCommand struct {
	where   string // page:line
	code    string // the command, without its comment
	reasons []string
}

// TestDocsCommandsAreRun: every command line in a fenced shell block of
// docs/*.md is either run, as typed, by a journey (testdata/journeys,
// the binary on PATH as the README's set-up puts it), or says why it
// cannot run against the demo with a reason from notRunReasons. Every
// fence carries a language, so a shell block cannot hide untagged.
func TestDocsCommandsAreRun(t *testing.T) {
	pages, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	var cmds []docCommand
	for _, page := range pages {
		raw, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		found, problems := docShellCommands(page, string(raw))
		cmds = append(cmds, found...)
		for _, p := range problems {
			t.Error(p)
		}
	}
	if len(cmds) < 20 {
		t.Fatalf("only %d shell command lines found in docs/*.md: the parser is broken", len(cmds))
	}
	run := journeyCommands(t)
	byReason := map[string]int{}
	ran := 0
	for _, c := range cmds {
		if msg := judgeDocCommand(c, run); msg != "" {
			t.Errorf("%s: `%s`: %s", c.where, c.code, msg)
		}
		if run[normQuotes(c.code)] {
			ran++
		}
		for _, r := range c.reasons {
			byReason[r]++
		}
	}
	t.Logf("%d shell command lines in docs/*.md: %d run by journeys as typed, the others marked not run (lines per reason: %v)",
		len(cmds), ran, byReason)
}

// docShellCommands returns the command lines of page's fenced shell
// blocks, and a problem for each fence without a language.
func docShellCommands(page, text string) (cmds []docCommand, problems []string) {
	lang, inFence := "", false
	pending, start := "", 0
	for i, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "```") {
			if inFence {
				inFence = false
				continue
			}
			inFence = true
			lang = ""
			if info := strings.Fields(strings.TrimPrefix(trimmed, "```")); len(info) > 0 {
				lang = strings.ToLower(info[0])
			}
			if lang == "" {
				problems = append(problems, fmt.Sprintf("%s:%d: a fence without a language: tag it (text for output and pictures, sh for commands)", page, i+1))
			}
			continue
		}
		if !inFence || !shellLangs[lang] {
			continue
		}
		if lang == "console" {
			var ok bool
			if trimmed, ok = strings.CutPrefix(trimmed, "$ "); !ok && pending == "" {
				continue
			}
		}
		if pending == "" {
			start = i + 1
		}
		if cont, ok := strings.CutSuffix(trimmed, `\`); ok {
			pending += strings.TrimSpace(cont) + " "
			continue
		}
		full := pending + trimmed
		pending = ""
		code, comment := splitShellComment(full)
		if code == "" || strings.HasPrefix(code, "export ") {
			continue
		}
		c := docCommand{where: fmt.Sprintf("%s:%d", page, start), code: code}
		if m := notRunRe.FindStringSubmatch(comment); m != nil {
			c.reasons = strings.Split(m[1], ", ")
		}
		cmds = append(cmds, c)
	}
	return cmds, problems
}

// judgeDocCommand says what is wrong with a docs command line, or "".
func judgeDocCommand(c docCommand, run map[string]bool) string {
	if strings.HasPrefix(c.code, "./bin/gpuhost") {
		return "the pages write `gpuhost …` (the README puts bin/ on PATH once)"
	}
	isGpuhost := c.code == "gpuhost" || strings.HasPrefix(c.code, "gpuhost ")
	if isGpuhost {
		if err := cliAccepts(splitShellWords(c.code)[1:]); err != nil {
			return "not a command line gpuhost accepts: " + err.Error()
		}
	}
	for _, r := range c.reasons {
		if notRunReasons[r] == "" {
			return fmt.Sprintf("unknown reason %q (the reasons: %s)", r, strings.Join(slices.Sorted(maps.Keys(notRunReasons)), ", "))
		}
	}
	ranAsTyped := isGpuhost && run[normQuotes(c.code)]
	switch {
	case len(c.reasons) == 0 && !isGpuhost:
		return "not a gpuhost command, so no journey runs it: say why with `# not run: REASON`"
	case len(c.reasons) == 0 && !ranAsTyped:
		return "no journey in testdata/journeys runs it: add it to a journey, or say why not with `# not run: REASON`"
	case len(c.reasons) > 0 && ranAsTyped:
		return "marked not run, but a journey runs it as typed: drop the mark"
	}
	if slices.Contains(c.reasons, "long") {
		prefix := commandPrefix(c.code)
		for cmd := range run {
			if cmd == prefix || strings.HasPrefix(cmd, prefix+" ") {
				return ""
			}
		}
		return fmt.Sprintf("marked long, but no journey runs `%s` with smaller flags", prefix)
	}
	return ""
}

// cliAccepts checks args (after "gpuhost") against the command tree:
// an existing, runnable command and flags it takes.
func cliAccepts(args []string) error {
	c, rest, err := newRootCmd().Find(args)
	if err != nil {
		return err
	}
	if !c.Runnable() {
		return fmt.Errorf("%s runs nothing by itself (a subcommand is missing or unknown)", c.CommandPath())
	}
	if c.DisableFlagParsing {
		return nil
	}
	if err := c.ParseFlags(rest); err != nil {
		return err
	}
	if c.HasAvailableSubCommands() && c.Flags().NArg() > 0 {
		return fmt.Errorf("unknown command %q for %q", c.Flags().Arg(0), c.CommandPath())
	}
	return c.ValidateArgs(c.Flags().Args())
}

// commandPrefix is a command line up to its first flag.
func commandPrefix(code string) string {
	words := strings.Fields(code)
	for i, w := range words {
		if strings.HasPrefix(w, "-") {
			return strings.Join(words[:i], " ")
		}
	}
	return code
}

// splitShellComment splits a shell line into its code and its comment
// (a # outside quotes, at the start or after a blank).
func splitShellComment(line string) (code, comment string) {
	var quote rune
	for i, r := range line {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			}
		case r == '\'' || r == '"':
			quote = r
		case r == '#' && (i == 0 || line[i-1] == ' ' || line[i-1] == '\t'):
			return strings.TrimSpace(line[:i]), line[i+1:]
		}
	}
	return strings.TrimSpace(line), ""
}

// splitShellWords splits a command line into words, as the shell does
// for plain words and single- or double-quoted ones.
func splitShellWords(line string) []string {
	var words []string
	var cur strings.Builder
	var quote rune
	inWord := false
	for _, r := range line {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			cur.WriteRune(r)
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words
}

// TestDocsGoCommandsNameTheToolchain: a page that shows a `go` command
// says which toolchain it needs (go.mod's), since a machine whose own Go
// is older refuses the module unless GOTOOLCHAIN names it.
func TestDocsGoCommandsNameTheToolchain(t *testing.T) {
	mod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\S+)$`).FindSubmatch(mod)
	if m == nil {
		t.Fatal("go.mod: no go directive")
	}
	want := "GOTOOLCHAIN=go" + string(m[1])
	pages, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	goCmd := regexp.MustCompile("(?m)(?:^|[\\s`(])go (?:test|run|build|vet|generate|install) ")
	shown := 0
	for _, page := range append([]string{"README.md"}, pages...) {
		raw, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		if !goCmd.Match(raw) {
			continue
		}
		shown++
		if !strings.Contains(string(raw), want) {
			t.Errorf("%s shows a go command but does not say %s (export it once, or write it in the line)", page, want)
		}
	}
	if shown < 3 {
		t.Fatalf("only %d pages show a go command: the scan is broken", shown)
	}
}

// TestDocShellCommandsParse: what the docs check counts as a command.
func TestDocShellCommandsParse(t *testing.T) {
	page := strings.Join([]string{
		"```sh",
		"# a comment line",
		"export GPUHOST_URL=http://127.0.0.1:8080",
		"gpuhost ask 'a # in quotes'   # a comment — not run: client, network",
		"gpuhost bench run \\",
		"  --repeats 2",
		"",
		"```",
		"```console",
		"$ gpuhost status",
		"state:   active",
		"```",
		"```text",
		"gpuhost switch x",
		"```",
		"```",
		"gpuhost doctor",
		"```",
	}, "\n")
	cmds, problems := docShellCommands("p.md", page)
	var got []string
	for _, c := range cmds {
		got = append(got, fmt.Sprintf("%s %s %v", c.where, c.code, c.reasons))
	}
	want := []string{
		"p.md:4 gpuhost ask 'a # in quotes' [client network]",
		"p.md:5 gpuhost bench run --repeats 2 []",
		"p.md:10 gpuhost status []",
	} // an untagged fence's lines are not read: the fence is a problem
	if !slices.Equal(got, want) {
		t.Errorf("commands:\n got %q\nwant %q", got, want)
	}
	if len(problems) != 1 || !strings.Contains(problems[0], "p.md:16: a fence without a language") {
		t.Errorf("problems: %q, want the untagged fence at line 16", problems)
	}
}
