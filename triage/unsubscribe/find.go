package unsubscribe

import (
	"net/url"
	"strings"

	"golang.org/x/net/html"
	"golang.org/x/net/html/atom"
)

// Sources a Result can come from.
const (
	SourceHeader = "header"
	SourceHTML   = "html"
)

// oneClick is the only List-Unsubscribe-Post value RFC 8058 defines.
const oneClick = "List-Unsubscribe=One-Click"

// Find returns the mail's unsubscribe link. listUnsubscribe and
// listUnsubscribePost are the raw (unfolded) header values, html the HTML
// body. The header wins whenever it yields a usable URI, because it is
// meant for machines; the HTML is only searched when it yields nothing.
// Every URL is returned byte for byte as the sender wrote it (header) or
// as the HTML parser decoded it (entities resolved): no normalisation,
// no unescaping, since a changed byte can break a signed link.
func Find(listUnsubscribe, listUnsubscribePost, html string) Result {
	if r := fromHeader(listUnsubscribe, listUnsubscribePost); r.Best() != "" {
		return r
	}
	return fromHTML(html)
}

// fromHeader reads an RFC 2369 List-Unsubscribe value: angle-bracketed
// URIs, comma-separated, with anything outside brackets (comments,
// whitespace, folding) ignored. A bracketed URI containing whitespace or
// control characters is rejected rather than repaired: guessing how a
// broken URL was meant is how a wrong link gets clicked. The first https
// URI is preferred over the first http one; the first mailto is kept too.
func fromHeader(value, post string) Result {
	var r Result
	var firstHTTP string
	for rest := value; ; {
		lt := strings.IndexByte(rest, '<')
		if lt < 0 {
			break
		}
		gt := strings.IndexByte(rest[lt:], '>')
		if gt < 0 {
			break
		}
		uri := rest[lt+1 : lt+gt]
		rest = rest[lt+gt+1:]
		switch scheme(uri) {
		case "https":
			if r.URL == "" && validHTTP(uri) {
				r.URL = uri
			}
		case "http":
			if firstHTTP == "" && validHTTP(uri) {
				firstHTTP = uri
			}
		case "mailto":
			if r.Mailto == "" && validMailto(uri) {
				r.Mailto = uri
			}
		}
	}
	if r.URL == "" {
		r.URL = firstHTTP
	}
	if r.URL != "" || r.Mailto != "" {
		r.Source = SourceHeader
	}
	// RFC 8058: one-click needs the exact Post value and an HTTPS URI to
	// POST to (section 3.1: a plain http URI is not one-click, whatever
	// the Post header says).
	r.OneClick = scheme(r.URL) == "https" && strings.EqualFold(strings.TrimSpace(post), oneClick)
	return r
}

// scheme returns the lower-cased URI scheme, or "" when there is none.
func scheme(uri string) string {
	i := strings.IndexByte(uri, ':')
	if i <= 0 {
		return ""
	}
	return strings.ToLower(uri[:i])
}

// clean reports whether uri has no whitespace, no control characters and
// no angle brackets: such a URI was mangled in transit or is an attack.
func clean(uri string) bool {
	for i := 0; i < len(uri); i++ {
		if c := uri[i]; c <= ' ' || c == 0x7f || c == '<' || c == '>' {
			return false
		}
	}
	return true
}

// validHTTP checks an http(s) URI without changing it: clean, parseable,
// with a host.
func validHTTP(uri string) bool {
	if !clean(uri) {
		return false
	}
	u, err := url.Parse(uri)
	return err == nil && u.Host != "" && u.Opaque == ""
}

// validMailto checks a mailto URI: clean, with an address (something@…)
// before any query.
func validMailto(uri string) bool {
	if !clean(uri) {
		return false
	}
	addr, _, _ := strings.Cut(uri[len("mailto:"):], "?")
	at := strings.IndexByte(addr, '@')
	return at > 0 && at < len(addr)-1
}

// keywords mark an unsubscribe link, in English and German.
var keywords = []string{"unsubscribe", "abmelden", "abbestellen", "austragen", "opt-out", "opt out"}

func matches(s string) bool {
	s = strings.ToLower(strings.Join(strings.Fields(s), " "))
	for _, k := range keywords {
		if strings.Contains(s, k) {
			return true
		}
	}
	return false
}

// anchor is one <a href> of the HTML body.
type anchor struct {
	href string
	text strings.Builder
}

// fromHTML picks the unsubscribe anchor of an HTML body: the first anchor
// whose visible text (including image alt text) names unsubscribing, else
// the first whose href does. Only absolute http(s) and mailto hrefs count;
// javascript:, data:, relative and fragment links never do.
func fromHTML(src string) Result {
	if src == "" {
		return Result{}
	}
	z := html.NewTokenizer(strings.NewReader(src))
	var cur *anchor
	var byURL string
	done := func() (Result, bool) {
		a := cur
		cur = nil
		if a == nil || !usable(a.href) {
			return Result{}, false
		}
		if matches(a.text.String()) {
			return result(a.href), true
		}
		if byURL == "" && matches(a.href) {
			byURL = a.href
		}
		return Result{}, false
	}
	for {
		tt := z.Next()
		switch tt {
		case html.ErrorToken:
			if r, ok := done(); ok {
				return r
			}
			if byURL != "" {
				return result(byURL)
			}
			return Result{}
		case html.TextToken:
			if cur != nil {
				cur.text.Write(z.Text())
				cur.text.WriteByte(' ')
			}
		case html.StartTagToken, html.SelfClosingTagToken, html.EndTagToken:
			tok := z.Token()
			switch {
			case tok.DataAtom == atom.A:
				// Anchors do not nest: a new one (or </a>) ends the last.
				if r, ok := done(); ok {
					return r
				}
				if tt == html.StartTagToken {
					cur = &anchor{href: attr(tok, "href")}
				}
			case tok.DataAtom == atom.Img && cur != nil:
				cur.text.WriteString(attr(tok, "alt"))
				cur.text.WriteByte(' ')
			}
		}
	}
}

func attr(tok html.Token, name string) string {
	for _, a := range tok.Attr {
		if a.Key == name {
			// Browsers strip leading and trailing whitespace from URLs.
			return strings.Trim(a.Val, " \t\r\n\f")
		}
	}
	return ""
}

func usable(href string) bool {
	switch scheme(href) {
	case "https", "http":
		return validHTTP(href)
	case "mailto":
		return validMailto(href)
	}
	return false
}

func result(href string) Result {
	if scheme(href) == "mailto" {
		return Result{Mailto: href, Source: SourceHTML}
	}
	return Result{URL: href, Source: SourceHTML}
}
