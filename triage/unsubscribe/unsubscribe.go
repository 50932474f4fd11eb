// Package unsubscribe finds a mail's unsubscribe link by deterministic code,
// never by the model (docs/design.md decision 3): first the
// List-Unsubscribe header (RFC 2369) taken byte for byte, only without it
// the HTML anchors. A wrong link is worse than none.
package unsubscribe

// Result is the link found, if any.
type Result struct {
	URL      string `json:"url,omitempty"`       // the https (or http) URI, byte for byte
	Mailto   string `json:"mailto,omitempty"`    // the mailto: URI when present
	OneClick bool   `json:"one_click,omitempty"` // RFC 8058 List-Unsubscribe-Post: List-Unsubscribe=One-Click
	Source   string `json:"source,omitempty"`    // "header" | "html" | "" (none)
}

// Best is the link to show: URL when set, else Mailto.
func (r Result) Best() string {
	if r.URL != "" {
		return r.URL
	}
	return r.Mailto
}
