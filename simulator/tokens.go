package simulator

import (
	"encoding/json"
	"hash/fnv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The simulated tokenizer is deterministic and cheap, and lands within a small
// factor of a real BPE tokenizer on English text and code: leading whitespace
// joins the next token (" word"), letter runs are cut every maxWordRunes,
// digits go in groups of three (as Qwen and Llama 3 do), each punctuation mark,
// symbol or CJK character is a token, a run of newlines is one token, and chat
// markers such as <|im_start|> are single special tokens. /tokenize and every
// usage.prompt_tokens count come from this one function, so they agree.
const (
	maxWordRunes  = 10
	maxDigitRunes = 3
	// vocabSize is Qwen2/3's regular vocabulary; special tokens follow it.
	vocabSize = 151643
)

var specialTokenIDs = map[string]int{
	"<|endoftext|>": 151643,
	"<|im_start|>":  151644,
	"<|im_end|>":    151645,
}

// tokenize splits s into simulated tokens whose concatenation is s.
func tokenize(s string) []string {
	var toks []string
	start := 0 // start of the pending token (includes leading blanks)
	i := 0
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == '<' && strings.HasPrefix(s[i:], "<|"):
			if end := specialEnd(s[i:]); end > 0 {
				toks = appendPending(toks, s, start, i)
				toks = append(toks, s[i:i+end])
				i += end
				start = i
				continue
			}
			toks = append(toks, s[start:i+size])
			i += size
			start = i
		case r == '\n' || r == '\r':
			toks = appendPending(toks, s, start, i)
			j := i
			for j < len(s) && (s[j] == '\n' || s[j] == '\r') {
				j++
			}
			toks = append(toks, s[i:j])
			i, start = j, j
		case unicode.IsSpace(r):
			i += size // joins the next token
		case isCJK(r):
			toks = append(toks, s[start:i+size])
			i += size
			start = i
		case unicode.IsLetter(r) || unicode.IsMark(r):
			j, n := i, 0
			for j < len(s) && n < maxWordRunes {
				r2, sz := utf8.DecodeRuneInString(s[j:])
				if !(unicode.IsLetter(r2) || unicode.IsMark(r2)) || isCJK(r2) {
					break
				}
				j += sz
				n++
			}
			toks = append(toks, s[start:j])
			i, start = j, j
		case unicode.IsDigit(r):
			j, n := i, 0
			for j < len(s) && n < maxDigitRunes {
				r2, sz := utf8.DecodeRuneInString(s[j:])
				if !unicode.IsDigit(r2) {
					break
				}
				j += sz
				n++
			}
			toks = append(toks, s[start:j])
			i, start = j, j
		default: // punctuation, symbols, invalid bytes
			toks = append(toks, s[start:i+size])
			i += size
			start = i
		}
	}
	return appendPending(toks, s, start, len(s))
}

// appendPending emits blanks that no token absorbed (trailing spaces, or
// spaces before a newline or special token) as a token of their own.
func appendPending(toks []string, s string, start, end int) []string {
	if end > start {
		toks = append(toks, s[start:end])
	}
	return toks
}

// specialEnd returns the length of a <|name|> marker at the start of s, or 0.
func specialEnd(s string) int {
	const maxLen = 40
	for j := 2; j < len(s) && j < maxLen; j++ {
		c := s[j]
		if c == '|' && j+1 < len(s) && s[j+1] == '>' && j > 2 {
			return j + 2
		}
		if !(c == '_' || c == '-' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			return 0
		}
	}
	return 0
}

func isCJK(r rune) bool {
	return r >= 0x2E80 && (unicode.Is(unicode.Han, r) || unicode.Is(unicode.Hiragana, r) ||
		unicode.Is(unicode.Katakana, r) || unicode.Is(unicode.Hangul, r))
}

// tokenID maps a simulated token to a stable id in Qwen's id space.
func tokenID(tok string) int {
	if id, ok := specialTokenIDs[tok]; ok {
		return id
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(tok))
	return int(h.Sum32() % vocabSize)
}

func tokenIDs(toks []string) []int {
	ids := make([]int, len(toks))
	for i, t := range toks {
		ids[i] = tokenID(t)
	}
	return ids
}

// chatMessage is one message of a chat prompt, already reduced to text.
type chatMessage struct {
	Role    string
	Content string
	// ToolCalls is the JSON of an assistant message's tool calls, if any.
	ToolCalls string
}

// renderChat applies a ChatML template (as Qwen models use), so a chat's token
// count includes role markers and, like a real template, the tool
// definitions in the system turn.
func renderChat(msgs []chatMessage, tools json.RawMessage, addGenerationPrompt bool) string {
	var b strings.Builder
	if len(tools) > 0 && string(tools) != "null" {
		b.WriteString("<|im_start|>system\n# Tools\n\nYou may call one or more functions:\n<tools>\n")
		b.Write(tools)
		b.WriteString("\n</tools><|im_end|>\n")
	}
	for _, m := range msgs {
		b.WriteString("<|im_start|>")
		b.WriteString(m.Role)
		b.WriteString("\n")
		b.WriteString(m.Content)
		if m.ToolCalls != "" {
			b.WriteString("\n<tool_call>\n")
			b.WriteString(m.ToolCalls)
			b.WriteString("\n</tool_call>")
		}
		b.WriteString("<|im_end|>\n")
	}
	if addGenerationPrompt {
		b.WriteString("<|im_start|>assistant\n")
	}
	return b.String()
}

// replyWords is the simulated model's answer, repeated as needed. Every entry
// is exactly one simulated token (letters ≤ maxWordRunes, or one mark), so the
// text of n generated tokens tokenizes back to n tokens.
var replyWords = strings.Fields("This mock server streams plain words at a steady pace so that " +
	"clients can count tokens , time the first token and check usage .")

// replyToken returns generated token i (0-based): words after the first get a
// leading space, punctuation does not.
func replyToken(i int) string {
	w := replyWords[i%len(replyWords)]
	if i == 0 || w == "," || w == "." {
		return w
	}
	return " " + w
}

// replyText is the text of the first n generated tokens.
func replyText(n int) string {
	var b strings.Builder
	for i := 0; i < n; i++ {
		b.WriteString(replyToken(i))
	}
	return b.String()
}
