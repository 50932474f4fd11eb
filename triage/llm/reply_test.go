package llm

import (
	"slices"
	"strings"
	"testing"
)

func TestParseReply(t *testing.T) {
	schema, err := compileClassifySchema()
	if err != nil {
		t.Fatal(err)
	}
	const ok = `{"isRealConversation":true,"contactType":"lead","importance":7,"reasoning":"Asks for a quote."}`
	tests := []struct {
		name   string
		raw    string
		want   Classification
		reason string // "" = accepted
	}{
		{"valid", ok, Classification{true, "lead", 7, "Asks for a quote."}, ""},
		{"whitespace and fence", "\n```json\n" + ok + "\n```\n", Classification{true, "lead", 7, "Asks for a quote."}, ""},
		{"integer written as 7.0", strings.Replace(ok, "7,", "7.0,", 1), Classification{true, "lead", 7, "Asks for a quote."}, ""},
		{"empty", "  ", Classification{}, "empty"},
		{"prose", "Sure! It is a lead.", Classification{}, "not a JSON object"},
		{"prose then JSON", "Here: " + ok, Classification{}, "not a JSON object"},
		{"trailing text", ok + " hope this helps", Classification{}, "not valid JSON"},
		{"truncated", ok[:40], Classification{}, "not valid JSON"},
		{"importance 42", strings.Replace(ok, "7,", "42,", 1), Classification{}, "at '/importance': maximum"},
		{"importance 0", strings.Replace(ok, "7,", "0,", 1), Classification{}, "minimum"},
		{"fractional importance", strings.Replace(ok, "7,", "7.5,", 1), Classification{}, "/importance"},
		{"unknown contact type", strings.Replace(ok, `"lead"`, `"friend"`, 1), Classification{}, "/contactType"},
		{"missing field", `{"isRealConversation":true,"contactType":"lead","importance":7}`, Classification{}, "reasoning"},
		{"extra field", strings.Replace(ok, `{`, `{"confidence":0.9,`, 1), Classification{}, "confidence"},
		{"wrong type", strings.Replace(ok, "true", `"yes"`, 1), Classification{}, "/isRealConversation"},
		{"array", "[" + ok + "]", Classification{}, "not a JSON object"},
		{"other fence language", "```python\n" + ok + "\n```", Classification{}, "not a JSON object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseReply(schema, tt.raw)
			if tt.reason == "" {
				if err != nil || got != tt.want {
					t.Fatalf("got %+v, %v; want %+v", got, err, tt.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.reason) {
				t.Fatalf("err %v, want it to say %q", err, tt.reason)
			}
			if strings.Contains(err.Error(), "\n") || len(err.Error()) > 400 {
				t.Errorf("reason is not one short line: %q", err)
			}
		})
	}
	long := strings.Replace(ok, "Asks for a quote.", strings.Repeat("blah ", 500), 1)
	got, err := parseReply(schema, long)
	if err != nil || len([]rune(got.Reasoning)) != maxReasoningChars+1 || !strings.HasSuffix(got.Reasoning, "…") {
		t.Errorf("long reasoning kept as %d runes, err %v", len([]rune(got.Reasoning)), err)
	}
}

// FuzzParseReply: a model reply is outside input. No panic; an accepted
// reply always satisfies the schema's promises.
func FuzzParseReply(f *testing.F) {
	schema, err := compileClassifySchema()
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{
		`{"isRealConversation":true,"contactType":"lead","importance":7,"reasoning":"x"}`,
		"```json\n{\"isRealConversation\":false,\"contactType\":\"other\",\"importance\":1e0,\"reasoning\":\"\"}\n```",
		`{"importance":1e400}`, `{"importance":-0}`, `{`, "```", "``````", "```\n```", `null`, "\x00", `{"a":` + strings.Repeat("[", 10000),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		c, err := parseReply(schema, raw)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty reason")
			}
			return
		}
		if !slices.Contains(contactTypes, c.ContactType) || c.Importance < 1 || c.Importance > 10 ||
			len([]rune(c.Reasoning)) > maxReasoningChars+1 {
			t.Fatalf("accepted %q as %+v", raw, c)
		}
	})
}

func TestClipBytes(t *testing.T) {
	for _, tt := range []struct {
		in   string
		n    int
		want string
	}{
		{"abc", 5, "abc"}, {"abc", 2, "ab"}, {"äö", 3, "ä"}, {"äö", 1, ""}, {"", 0, ""},
	} {
		if got := clipBytes(tt.in, tt.n); got != tt.want {
			t.Errorf("clipBytes(%q, %d) = %q, want %q", tt.in, tt.n, got, tt.want)
		}
	}
}
