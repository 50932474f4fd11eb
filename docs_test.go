package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// mdLink matches an inline Markdown link's target: [text](target).
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestDocsLinksResolve follows every relative link in README.md and
// docs/*.md: the file must exist and a #fragment must name a heading of
// the target (GitHub's anchor rule), so moving text between pages cannot
// leave a dead link behind.
func TestDocsLinksResolve(t *testing.T) {
	pages, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	pages = append([]string{"README.md"}, pages...)
	checked := 0
	for _, page := range pages {
		raw, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range mdLink.FindAllStringSubmatch(stripCode(string(raw)), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			checked++
			if msg := checkLink(page, target); msg != "" {
				t.Errorf("%s: link %q: %s", page, target, msg)
			}
		}
	}
	if checked < 20 {
		t.Fatalf("only %d relative links found: the link scan is broken", checked)
	}
}

// checkLink returns why target, linked from page, does not resolve, or "".
func checkLink(page, target string) string {
	file, frag, _ := strings.Cut(target, "#")
	path := page
	if file != "" {
		path = filepath.Join(filepath.Dir(page), file)
	}
	info, err := os.Stat(path)
	if err != nil {
		return "no such file " + path
	}
	if frag == "" {
		return ""
	}
	if info.IsDir() || !strings.HasSuffix(path, ".md") {
		return "an anchor into a file that is not Markdown"
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if !mdAnchors(string(raw))[frag] {
		return "no heading in " + path + " gives the anchor #" + frag
	}
	return ""
}

// stripCode removes fenced code blocks and inline code, where brackets
// and parentheses are not links.
func stripCode(text string) string {
	var b strings.Builder
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			b.WriteString(regexp.MustCompile("`[^`]*`").ReplaceAllString(line, "``"))
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// mdAnchors returns the anchors GitHub gives the headings of a page:
// lower case, punctuation dropped, spaces to hyphens, repeats numbered.
func mdAnchors(text string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
		}
		if fenced || !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(title) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r > 127:
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out[a+"-"+itoa(n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + string(rune('0'+n%10))
}
