package triage

import (
	"context"
	"strings"
	"testing"
)

// TestEveryFromAddressShown: a From header with several addresses shows
// all of them in the post, with a problem line that says so; one address
// shows no such line.
func TestEveryFromAddressShown(t *testing.T) {
	for _, tt := range []struct {
		name, from  string
		wantFrom    string
		wantProblem bool
	}{
		{"one address", "boss@example.com", "boss@example.com", false},
		{"two addresses", "boss@example.com, att@evil.test", "boss@example.com, att@evil.test", true},
		{"three with names", `Boss <boss@example.com>, "Eve" <att@evil.test>, x@y.test`, "Boss <boss@example.com>, Eve <att@evil.test>, x@y.test", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := newUnit(t, nil)
			e.src.add(eml(tt.from, "sales@example.com", "hello", "body"))
			if n, err := e.w.Once(context.Background()); n != 1 || err != nil {
				t.Fatalf("Once = %d, %v", n, err)
			}
			p := e.a.Posts()[0]
			if p.From != tt.wantFrom {
				t.Errorf("post From = %q, want %q", p.From, tt.wantFrom)
			}
			found := false
			for _, pr := range p.Problems {
				if strings.Contains(pr, "From lists") && strings.Contains(pr, "att@evil.test") {
					found = true
				}
			}
			if found != tt.wantProblem {
				t.Errorf("problems %q: multi-address line present %v, want %v", p.Problems, found, tt.wantProblem)
			}
		})
	}
}
