package activity

import (
	"strconv"
	"testing"
)

// FuzzFilter: a status filter comes from the page's query string. Whatever
// it is, Match never panics; an invalid one matches nothing, and a valid
// exact code matches exactly that status.
func FuzzFilter(f *testing.F) {
	for _, s := range []string{"", "ok", "error", "2xx", "5xx", "503", "099", "600", "+20", "1e2", "5x", "\x00"} {
		f.Add(s, 503)
	}
	f.Fuzz(func(t *testing.T, status string, code int) {
		r := Request{Status: code}
		got := Filter{Status: status}.Match(r)
		if !ValidStatus(status) && got {
			t.Fatalf("invalid filter %q matched status %d", status, code)
		}
		if n, err := strconv.Atoi(status); err == nil && ValidStatus(status) && len(status) == 3 && got != (n == code) {
			t.Fatalf("filter %q on status %d: %v", status, code, got)
		}
	})
}

// BenchmarkRecord is what the proxy pays per request for the Activity log
// (a full ring, two subscribers that never read):
//
//	go test -run '^$' -bench BenchmarkRecord ./internal/activity/
func BenchmarkRecord(b *testing.B) {
	l := NewLog(DefaultLogSize)
	for range 2 {
		_, cancel := l.Subscribe()
		defer cancel()
	}
	r := Request{Client: "127.0.0.1", Method: "POST", Path: "/v1/chat/completions", Model: "qwen3-coder", Status: 200,
		PromptTokens: 512, CompletionTokens: 128}
	b.ReportAllocs()
	for b.Loop() {
		l.Record(r)
	}
}
