package mail

import (
	"strings"

	"golang.org/x/net/html"
	"golang.org/x/net/html/atom"
)

// BodyText is the text to classify: Text when the mail has a plain-text
// body, else the readable text of the HTML body (many newsletters and
// notification mails are HTML only).
func (m *Message) BodyText() string {
	if strings.TrimSpace(m.Text) != "" {
		return m.Text
	}
	return HTMLText(m.HTML)
}

// HTMLText extracts what a reader of the HTML would see: text nodes with
// entities decoded, script/style/head content dropped, block elements as
// line breaks, whitespace collapsed, and the invisible padding characters
// marketing mails put into preheaders removed.
func HTMLText(src string) string {
	if strings.TrimSpace(src) == "" {
		return ""
	}
	out := htmlText(src, true)
	if out == "" { // a <head> never closed would have hidden everything
		out = htmlText(src, false)
	}
	return out
}

// hidden are elements whose content is never shown as text.
var hidden = map[atom.Atom]bool{
	atom.Script: true, atom.Style: true, atom.Template: true, atom.Title: true,
}

// blocks are elements that start a new line.
var blocks = map[atom.Atom]bool{
	atom.P: true, atom.Div: true, atom.Br: true, atom.Tr: true, atom.Li: true, atom.Table: true,
	atom.H1: true, atom.H2: true, atom.H3: true, atom.H4: true, atom.H5: true, atom.H6: true,
	atom.Blockquote: true, atom.Pre: true, atom.Hr: true, atom.Ul: true, atom.Ol: true, atom.Dl: true,
	atom.Dt: true, atom.Dd: true, atom.Section: true, atom.Article: true, atom.Header: true,
	atom.Footer: true, atom.Center: true, atom.Body: true,
}

func htmlText(src string, skipHead bool) string {
	z := html.NewTokenizer(strings.NewReader(src))
	var b strings.Builder
	var skip atom.Atom // the hidden element we are inside, 0 when none
	inHead := false
	for {
		switch z.Next() {
		case html.ErrorToken:
			return tidy(b.String())
		case html.TextToken:
			if skip == 0 && !inHead {
				// Source line breaks are plain whitespace in HTML; only
				// block elements break lines.
				b.WriteString(strings.ReplaceAll(string(z.Text()), "\n", " "))
			}
		case html.StartTagToken, html.SelfClosingTagToken, html.EndTagToken:
			tok := z.Token()
			a := tok.DataAtom
			start := tok.Type != html.EndTagToken
			switch {
			case hidden[a]:
				// A self-closing <script/> is a start tag to browsers and to
				// the tokenizer: what follows is script until </script>.
				if tok.Type != html.EndTagToken && skip == 0 {
					skip = a
				} else if tok.Type == html.EndTagToken && skip == a {
					skip = 0
				}
			case a == atom.Head:
				inHead = skipHead && tok.Type == html.StartTagToken
			case a == atom.Body && start:
				inHead = false
				b.WriteByte('\n')
			case blocks[a]:
				b.WriteByte('\n')
			case a == atom.Td || a == atom.Th:
				b.WriteByte(' ')
			}
		}
	}
}

// tidy collapses whitespace inside lines, trims lines, keeps at most one
// empty line in a row, and drops zero-width and soft-hyphen characters.
func tidy(s string) string {
	s = strings.Map(func(r rune) rune {
		switch r {
		case '\u200b', '\u200c', '\u200d', '\u2060', '\ufeff', '\u034f', '\u00ad':
			return -1
		case '\u00a0', '\t', '\r', '\f', '\v':
			return ' '
		}
		return r
	}, s)
	var out []string
	blank := true // no leading empty lines
	for _, line := range strings.Split(s, "\n") {
		line = strings.Join(strings.Fields(line), " ")
		if line == "" {
			if !blank {
				out = append(out, "")
			}
			blank = true
			continue
		}
		out = append(out, line)
		blank = false
	}
	return strings.TrimSpace(strings.Join(out, "\n"))
}
