package mcp

import (
	"encoding/base64"
	"gpuhost/mcp/connector"
	"net/url"
	"strings"
	"testing"
)

func scrubberFor(secret string) *scrubber {
	s := connector.NewSecrets(func(string) (string, bool) { return secret, true })
	_, _ = s.Get("X")
	return newScrubber(s)
}

func TestScrubForms(t *testing.T) {
	const secret = "p@ss w/rd+?&=long"
	sc := scrubberFor(secret)
	tests := []struct{ name, in string }{
		{"plain", "key=" + secret + ";"},
		{"query", "GET /x?k=" + url.QueryEscape(secret)},
		{"path", "/v1/" + url.PathEscape(secret) + "/x"},
		{"base64", base64.StdEncoding.EncodeToString([]byte(secret))},
		{"raw url base64", base64.RawURLEncoding.EncodeToString([]byte(secret))},
		{"basic auth, 0 offset", base64.StdEncoding.EncodeToString([]byte("ab:" + secret))},
		{"basic auth, 1 offset", base64.StdEncoding.EncodeToString([]byte("abcd:" + secret))},
		{"basic auth, 2 offset", base64.StdEncoding.EncodeToString([]byte("abcde:" + secret))},
		{"json", `{"k":"p@ss w/rd+?\u0026=long"}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := sc.Scrub(tc.in)
			if !strings.Contains(got, connector.Redacted) {
				t.Fatalf("Scrub(%q) = %q: nothing redacted", tc.in, got)
			}
			// The secret's recognisable middle is gone in every form.
			for _, frag := range []string{"w/rd", "w%2Frd", "dyByZ", "dy9yZ"} {
				if strings.Contains(got, frag) && strings.Contains(tc.in, frag) && !strings.Contains(tc.in, "ab") {
					t.Errorf("Scrub(%q) = %q still has %q", tc.in, got, frag)
				}
			}
		})
	}
	if got := sc.Scrub("nothing to see"); got != "nothing to see" {
		t.Errorf("Scrub changed clean text: %q", got)
	}
	if got := newScrubber(connector.NewSecrets(func(string) (string, bool) { return "", false })).Scrub("x"); got != "x" {
		t.Errorf("no secrets: %q", got)
	}
}

// FuzzScrub: whatever the text around it, a scrubbed string never
// contains a secret that was handed out (secrets are restricted to
// characters outside connector.Redacted, which could otherwise form a new match
// together with the replacement).
func FuzzScrub(f *testing.F) {
	f.Add("hunter22", "pre ", " post")
	f.Add("tok+/=", "a", "b")
	f.Add("x", "", "")
	f.Fuzz(func(t *testing.T, secret, before, after string) {
		if secret == "" || strings.ContainsAny(secret, "[]redact") {
			return
		}
		sc := scrubberFor(secret)
		out := sc.Scrub(before + secret + after + url.QueryEscape(secret))
		if strings.Contains(out, secret) {
			t.Fatalf("secret %q survives in %q", secret, out)
		}
	})
}
