package simulator

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestTokenize(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"Hello world", []string{"Hello", " world"}},
		{"Hello, world!", []string{"Hello", ",", " world", "!"}},
		{"internationalization", []string{"internatio", "nalization"}},
		{"year 2025", []string{"year", " 202", "5"}},
		{"a\n\nb", []string{"a", "\n\n", "b"}},
		{"  indented", []string{"  indented"}},
		{"trailing  ", []string{"trailing", "  "}},
		{"<|im_start|>user\nhi<|im_end|>", []string{"<|im_start|>", "user", "\n", "hi", "<|im_end|>"}},
		{"<|not special", []string{"<", "|", "not", " special"}},
		{"日本語", []string{"日", "本", "語"}},
		{`{"a":1}`, []string{"{", `"`, "a", `"`, ":", "1", "}"}},
	}
	for _, tt := range tests {
		got := tokenize(tt.in)
		if strings.Join(got, "\x00") != strings.Join(tt.want, "\x00") {
			t.Errorf("tokenize(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// The reply's text tokenizes back to the number of tokens generated, so a
// client counting tokens itself agrees with usage.completion_tokens.
func TestReplyTextRoundTrips(t *testing.T) {
	for _, n := range []int{0, 1, 2, 25, 26, 64, 1000} {
		if got := len(tokenize(replyText(n))); got != n {
			t.Errorf("tokenize(replyText(%d)) has %d tokens", n, got)
		}
	}
}

// A chat's count includes role markers and the tool definitions, and a real
// tokenizer's count for English prose is within a factor of two.
func TestChatTemplateCounts(t *testing.T) {
	msgs := []chatMessage{{Role: "user", Content: "Hello"}}
	bare := len(tokenize(renderChat(msgs, nil, true)))
	// <|im_start|> user \n Hello <|im_end|> \n <|im_start|> assistant \n
	if bare != 9 {
		t.Fatalf("templated count %d, want 9", bare)
	}
	withTools := len(tokenize(renderChat(msgs, json.RawMessage(`[{"type":"function","function":{"name":"f"}}]`), true)))
	if withTools <= bare+10 {
		t.Fatalf("tools not counted: %d vs %d", withTools, bare)
	}
	prose := "The quick brown fox jumps over the lazy dog while the programmer writes a small HTTP server in Go."
	// cl100k/Qwen tokenizers give 22-24 tokens for this sentence.
	if n := len(tokenize(prose)); n < 12 || n > 48 {
		t.Fatalf("prose count %d is not within a factor of two of ~23", n)
	}
}

func TestTokenIDsStable(t *testing.T) {
	a, b := tokenIDs(tokenize("same text")), tokenIDs(tokenize("same text"))
	if len(a) != 2 || a[0] != b[0] || a[1] != b[1] {
		t.Fatalf("ids not stable: %v %v", a, b)
	}
	if tokenID("<|im_start|>") != 151644 {
		t.Fatalf("special token id %d", tokenID("<|im_start|>"))
	}
	for _, id := range a {
		if id < 0 || id >= vocabSize {
			t.Fatalf("id %d out of vocabulary", id)
		}
	}
}

func FuzzTokenize(f *testing.F) {
	f.Add("Hello, world! 12345 <|im_start|>user\n日本語 \xff\xfe")
	f.Add("<|||>  \r\n\t<|a|>")
	f.Fuzz(func(t *testing.T, s string) {
		toks := tokenize(s)
		if strings.Join(toks, "") != s {
			t.Fatalf("tokens %q do not concatenate to %q", toks, s)
		}
		for _, tok := range toks {
			if tok == "" {
				t.Fatalf("empty token in %q", toks)
			}
		}
		if len(toks) > len(s) {
			t.Fatalf("%d tokens for %d bytes", len(toks), len(s))
		}
	})
}
