package unsubscribe

import (
	"strings"
	"testing"
	"unicode/utf8"
)

var findCases = []struct {
	name         string
	header, post string
	html         string
	want         Result
}{
	{
		name:   "Mailchimp: mailto and https, one-click",
		header: "<https://example.us1.list-manage.com/unsubscribe?u=9f1a2b3c4d&id=5e6f7a8b9c&t=b&e=0a1b2c3d4e&c=1f2e3d4c5b>, <mailto:unsubscribe-mc.us1_9f1a2b3c4d.5e6f7a8b9c-0a1b2c3d4e@mailchimpapp.net?subject=unsubscribe>",
		post:   "List-Unsubscribe=One-Click",
		want: Result{
			URL:      "https://example.us1.list-manage.com/unsubscribe?u=9f1a2b3c4d&id=5e6f7a8b9c&t=b&e=0a1b2c3d4e&c=1f2e3d4c5b",
			Mailto:   "mailto:unsubscribe-mc.us1_9f1a2b3c4d.5e6f7a8b9c-0a1b2c3d4e@mailchimpapp.net?subject=unsubscribe",
			OneClick: true, Source: "header",
		},
	},
	{
		name:   "Google Groups: mailto first, then https; no Post header",
		header: "<mailto:googlegroups-manage+123456789012+unsubscribe@googlegroups.com>,<https://groups.google.com/d/optout>",
		want: Result{
			URL:    "https://groups.google.com/d/optout",
			Mailto: "mailto:googlegroups-manage+123456789012+unsubscribe@googlegroups.com",
			Source: "header",
		},
	},
	{
		name:   "only mailto: never one-click",
		header: "<mailto:leave-12345@lists.example.org>",
		post:   "List-Unsubscribe=One-Click",
		want:   Result{Mailto: "mailto:leave-12345@lists.example.org", Source: "header"},
	},
	{
		name:   "query string and percent escapes kept byte for byte",
		header: "<https://news.example.com/u/4711?list=weekly&sig=Zm9v%2Bbar%3D%3D&e=a%40b.de&x=%7e>",
		post:   "  list-unsubscribe=one-click ",
		want:   Result{URL: "https://news.example.com/u/4711?list=weekly&sig=Zm9v%2Bbar%3D%3D&e=a%40b.de&x=%7e", OneClick: true, Source: "header"},
	},
	{
		name:   "folded header (unfolded by the mail parser) and comments outside brackets",
		header: "(Use this link) <mailto:u@example.com?subject=unsub>,\t <https://example.com/u?a=1>  (or write us)",
		want:   Result{URL: "https://example.com/u?a=1", Mailto: "mailto:u@example.com?subject=unsub", Source: "header"},
	},
	{
		name:   "https preferred over an earlier http",
		header: "<http://plain.example.com/u>, <HTTPS://secure.example.com/u>",
		want:   Result{URL: "HTTPS://secure.example.com/u", Source: "header"},
	},
	{
		name:   "http when there is no https, never one-click (RFC 8058 needs https)",
		header: "<http://plain.example.com/u?id=1>",
		post:   "List-Unsubscribe=One-Click",
		want:   Result{URL: "http://plain.example.com/u?id=1", Source: "header"},
	},
	{
		name:   "https with the Post header is one-click, also in upper case",
		header: "<mailto:u@example.com>, <HTTPS://secure.example.com/u>",
		post:   "List-Unsubscribe=One-Click",
		want:   Result{URL: "HTTPS://secure.example.com/u", Mailto: "mailto:u@example.com", OneClick: true, Source: "header"},
	},
	{
		name:   "wrong Post value is not one-click",
		header: "<https://example.com/u>",
		post:   "List-Unsubscribe=One-Click, extra",
		want:   Result{URL: "https://example.com/u", Source: "header"},
	},
	{
		name:   "garbage without brackets yields nothing",
		header: "https://example.com/unsubscribe, mailto:u@example.com",
		want:   Result{},
	},
	{
		name:   "spaces inside brackets are rejected, the next good one is kept",
		header: "<https://example.com/un subscribe>, < https://example.com/u >, <https://example.com/ok>",
		want:   Result{URL: "https://example.com/ok", Source: "header"},
	},
	{
		name:   "only broken URIs: nothing, even with a Post header",
		header: "<https://example.com/a b>, <https:///nohost>, <javascript:alert(1)>, <mailto:>, <ftp://example.com/u>",
		post:   "List-Unsubscribe=One-Click",
		want:   Result{},
	},
	{
		name:   "unclosed bracket",
		header: "<https://example.com/u",
		want:   Result{},
	},
	{
		name:   "header wins over HTML",
		header: "<https://header.example.com/u>",
		html:   `<a href="https://html.example.com/unsubscribe">Unsubscribe</a>`,
		want:   Result{URL: "https://header.example.com/u", Source: "header"},
	},
	{
		name:   "unusable header falls back to HTML",
		header: "<https://example.com/with space>",
		html:   `<p>Newsletter</p><a href="https://shop.example.com/abmelden?id=7&amp;h=x%2F">Vom Newsletter abmelden</a>`,
		want:   Result{URL: "https://shop.example.com/abmelden?id=7&h=x%2F", Source: "html"},
	},
	{
		name: "HTML: link text beats an earlier link whose only the URL matches",
		html: `<a href="https://track.example.com/click?to=unsubscribe-survey">Survey</a>
<p>Sie erhalten diese Mail, weil ... <a href="https://mail.example.de/p/9a8b">Hier  austragen</a></p>`,
		want: Result{URL: "https://mail.example.de/p/9a8b", Source: "html"},
	},
	{
		name: "HTML: URL match when no text matches",
		html: `<a href="https://example.com/shop">Shop</a> <a href="https://example.com/Unsubscribe?u=1">click here</a>`,
		want: Result{URL: "https://example.com/Unsubscribe?u=1", Source: "html"},
	},
	{
		name: "HTML: javascript, data, relative and fragment links never count",
		html: `<a href="javascript:unsubscribe()">Unsubscribe</a><a href="data:text/html,unsubscribe">Unsubscribe</a>
<a href="/unsubscribe">Unsubscribe</a><a href="#unsubscribe">Unsubscribe</a><a href="//example.com/unsubscribe">Unsubscribe</a>`,
		want: Result{},
	},
	{
		name: "HTML: mailto anchor, opt out across a line break, image alt text",
		html: `<a href="https://example.com/home"><img src="logo.png" alt="Home"></a>
<a href=" mailto:optout@example.com?subject=stop "><img alt="Opt
 out"></a>`,
		want: Result{Mailto: "mailto:optout@example.com?subject=stop", Source: "html"},
	},
	{
		name: "HTML: an anchor without a closing tag ends at the next one",
		html: `<a href="https://example.com/x">Abbestellen<a href="https://example.com/y">other</a>`,
		want: Result{URL: "https://example.com/x", Source: "html"},
	},
	{
		name: "HTML: keywords in ordinary text outside anchors do not count",
		html: `<p>To unsubscribe, reply STOP.</p><a href="https://example.com/">Home</a>`,
		want: Result{},
	},
	{
		name: "nothing at all",
		want: Result{},
	},
}

func TestFind(t *testing.T) {
	for _, tc := range findCases {
		t.Run(tc.name, func(t *testing.T) {
			got := Find(tc.header, tc.post, tc.html)
			if got != tc.want {
				t.Errorf("Find() =\n  %+v\nwant\n  %+v", got, tc.want)
			}
		})
	}
}

func TestBest(t *testing.T) {
	tests := []struct {
		r    Result
		want string
	}{
		{Result{URL: "https://a", Mailto: "mailto:b@c"}, "https://a"},
		{Result{Mailto: "mailto:b@c"}, "mailto:b@c"},
		{Result{}, ""},
	}
	for _, tc := range tests {
		if got := tc.r.Best(); got != tc.want {
			t.Errorf("%+v.Best() = %q, want %q", tc.r, got, tc.want)
		}
	}
}

func FuzzFind(f *testing.F) {
	for _, tc := range findCases {
		f.Add(tc.header, tc.post, tc.html)
	}
	f.Fuzz(func(t *testing.T, header, post, html string) {
		r := Find(header, post, html)
		for _, u := range []string{r.URL, r.Mailto} {
			if u != "" && !usable(u) {
				t.Fatalf("returned an unusable link %q", u)
			}
		}
		if r.URL != "" && !strings.HasPrefix(strings.ToLower(r.URL), "http") {
			t.Fatalf("URL %q is not http(s)", r.URL)
		}
		if r.Mailto != "" && !strings.HasPrefix(strings.ToLower(r.Mailto), "mailto:") {
			t.Fatalf("Mailto %q is not mailto:", r.Mailto)
		}
		if r.OneClick && (r.URL == "" || r.Source != SourceHeader) {
			t.Fatalf("one-click without a header URL: %+v", r)
		}
		if (r.Best() == "") != (r.Source == "") {
			t.Fatalf("Source %q does not fit the result %+v", r.Source, r)
		}
		// Header links are substrings of the header, byte for byte.
		if r.Source == SourceHeader {
			for _, u := range []string{r.URL, r.Mailto} {
				if u != "" && !strings.Contains(header, "<"+u+">") {
					t.Fatalf("header link %q is not byte for byte from %q", u, header)
				}
			}
		}
		if utf8.ValidString(header) && utf8.ValidString(html) && !utf8.ValidString(r.Best()) {
			t.Fatalf("invalid UTF-8 from valid input: %q", r.Best())
		}
	})
}
