package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
)

// The proxy routes on the request's "model" but must not re-encode the body:
// a decode/encode round trip reorders keys, rewrites numbers (1e400, big
// integers, 1.0 → 1), normalises strings and costs far more than the proxy's
// latency budget on a 30 KB opencode request. So the body is scanned once,
// structurally, to find the top-level "model" member and its byte range; the
// only edits ever made are a byte-level replacement of that value (an alias
// becomes the served name) or the insertion of a "model" member when there is
// none (Ollama requires one). Every other byte goes upstream unchanged.

// maxDepth bounds nesting like encoding/json does, so a hostile body cannot
// make the scanner's bracket stack grow without bound.
const maxDepth = 10000

// modelField is what peekModel found about the top-level "model" member.
type modelField struct {
	// KeyFound reports a top-level "model" key (the last one wins, as in
	// Python's json and Go's encoding/json).
	KeyFound bool
	// IsString reports that its value is a string; Name is then the decoded
	// value. Null reports a null value.
	IsString bool
	Null     bool
	Name     string
	// Start and End delimit the value's bytes (quotes included) when
	// KeyFound.
	Start, End int
	// ObjStart is the index of the top-level '{'; Empty reports an object
	// without members (where an inserted member needs no comma).
	ObjStart int
	Empty    bool
	// MaxTokens is the largest of the request's top-level max_tokens,
	// max_completion_tokens and max_output_tokens (0: none given), and
	// Choices its "n" (0: not given); they bound the usage the answer may
	// report (usagecheck.go).
	MaxTokens int64
	Choices   int64
}

// syntaxError is a body that is not a JSON object, with the byte offset where
// the scan gave up.
type syntaxError struct {
	Offset int
	Msg    string
}

func (e *syntaxError) Error() string { return fmt.Sprintf("%s at byte %d", e.Msg, e.Offset) }

func synErr(off int, format string, args ...any) error {
	return &syntaxError{Offset: off, Msg: fmt.Sprintf(format, args...)}
}

// errModelNotString is returned for a "model" that is neither a string nor
// null: there is nothing to route on, and the backend would refuse it too.
var errModelNotString = fmt.Errorf("\"model\" must be a string")

// peekModel scans a JSON object body and reports its top-level "model"
// member. It checks the structure (matching brackets, terminated strings,
// members separated by commas, nothing after the object) but not every
// literal inside nested values: a body it accepts that is still not JSON is
// the backend's to refuse, with its own message.
func peekModel(b []byte) (modelField, error) {
	var f modelField
	i := skipWS(b, 0)
	if i >= len(b) {
		return f, synErr(i, "empty body: expected a JSON object")
	}
	if b[i] != '{' {
		return f, synErr(i, "expected a JSON object, found %q", b[i])
	}
	f.ObjStart = i
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		f.Empty = true
		return f, trailing(b, i+1)
	}
	for {
		if i >= len(b) {
			return f, synErr(i, "unexpected end of body inside the object")
		}
		if b[i] != '"' {
			return f, synErr(i, "expected a member name, found %q", b[i])
		}
		keyEnd, err := stringEnd(b, i)
		if err != nil {
			return f, err
		}
		keyStart := i
		isModel, err := keyIs(b[i:keyEnd], "model")
		if err != nil {
			return f, synErr(i, "invalid member name: %v", err)
		}
		i = skipWS(b, keyEnd)
		if i >= len(b) || b[i] != ':' {
			return f, synErr(i, "expected ':' after a member name")
		}
		i = skipWS(b, i+1)
		valEnd, err := skipValue(b, i)
		if err != nil {
			return f, err
		}
		if !isModel {
			f.noteLimit(b[keyStart:keyEnd], b[i:valEnd])
		}
		if isModel {
			// Keep scanning even for a bad value: a later "model" wins.
			f.KeyFound, f.Start, f.End = true, i, valEnd
			f.IsString, f.Null, f.Name = false, false, ""
			switch {
			case b[i] == '"':
				name, err := decodeString(b[i:valEnd])
				if err != nil {
					return f, synErr(i, "invalid \"model\" string: %v", err)
				}
				f.IsString, f.Name = true, name
			case string(b[i:valEnd]) == "null":
				f.Null = true
			}
		}
		i = skipWS(b, valEnd)
		if i >= len(b) {
			return f, synErr(i, "unexpected end of body inside the object")
		}
		switch b[i] {
		case ',':
			i = skipWS(b, i+1)
		case '}':
			if err := trailing(b, i+1); err != nil {
				return f, err
			}
			if f.KeyFound && !f.IsString && !f.Null {
				return f, errModelNotString
			}
			return f, nil
		default:
			return f, synErr(i, "expected ',' or '}' after a member, found %q", b[i])
		}
	}
}

// noteLimit records a top-level output limit or choice count (plain
// positive integers; anything else is the backend's to refuse). Only keys
// without escapes are looked at: the comparison then allocates nothing.
func (f *modelField) noteLimit(quoted, val []byte) {
	if len(quoted) < 3 || len(val) == 0 || val[0] < '1' || val[0] > '9' {
		return
	}
	var dst *int64
	switch string(quoted[1 : len(quoted)-1]) {
	case "max_tokens", "max_completion_tokens", "max_output_tokens":
		dst = &f.MaxTokens
	case "n":
		dst = &f.Choices
	default:
		return
	}
	if v, err := strconv.ParseInt(string(val), 10, 64); err == nil && v > *dst {
		*dst = v
	}
}

// trailing accepts only white space after the top-level value.
func trailing(b []byte, i int) error {
	if j := skipWS(b, i); j < len(b) {
		return synErr(j, "unexpected data after the JSON object")
	}
	return nil
}

func skipWS(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// stringEnd returns the index just past the closing quote of the string that
// starts at b[i] == '"'. It jumps from quote to quote (bytes.IndexByte is
// vectorised) and counts the backslashes before each to tell an escaped
// quote from the end.
func stringEnd(b []byte, i int) (int, error) {
	j := i + 1
	for {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return 0, synErr(i, "unterminated string")
		}
		q := j + k
		n := 0
		for p := q - 1; p > i && b[p] == '\\'; p-- {
			n++
		}
		if n%2 == 0 {
			return q + 1, nil
		}
		j = q + 1
	}
}

// skipValue returns the index just past the value starting at b[i].
func skipValue(b []byte, i int) (int, error) {
	if i >= len(b) {
		return 0, synErr(i, "unexpected end of body: expected a value")
	}
	switch c := b[i]; c {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		return containerEnd(b, i)
	default:
		j := i
		for j < len(b) && isLiteralByte(b[j]) {
			j++
		}
		if j == i {
			return 0, synErr(i, "unexpected %q: expected a value", c)
		}
		if !validLiteral(b[i:j]) {
			return 0, synErr(i, "invalid literal %q", truncate(string(b[i:j]), 32))
		}
		return j, nil
	}
}

// containerEnd returns the index just past the object or array that starts
// at b[i], checking that brackets match; strings inside are skipped whole.
func containerEnd(b []byte, i int) (int, error) {
	stack := make([]byte, 1, 16)
	stack[0] = closer(b[i])
	j := i + 1
	for j < len(b) {
		switch c := b[j]; c {
		case '"':
			end, err := stringEnd(b, j)
			if err != nil {
				return 0, err
			}
			j = end
			continue
		case '{', '[':
			if len(stack) >= maxDepth {
				return 0, synErr(j, "nesting deeper than %d", maxDepth)
			}
			stack = append(stack, closer(c))
		case '}', ']':
			if stack[len(stack)-1] != c {
				return 0, synErr(j, "mismatched %q", c)
			}
			stack = stack[:len(stack)-1]
			if len(stack) == 0 {
				return j + 1, nil
			}
		}
		j++
	}
	return 0, synErr(i, "unterminated %s", map[byte]string{'}': "object", ']': "array"}[stack[0]])
}

func closer(open byte) byte {
	if open == '{' {
		return '}'
	}
	return ']'
}

func isLiteralByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '+' || c == '.' || c == 'E'
}

// validLiteral accepts true, false, null and anything shaped like a JSON
// number (a leading '-' or digit); the backend judges the number itself.
func validLiteral(s []byte) bool {
	switch string(s) {
	case "true", "false", "null":
		return true
	}
	return s[0] == '-' || s[0] >= '0' && s[0] <= '9'
}

// keyIs reports whether the quoted key equals want, decoding escapes only
// when there are any (a client may write "mod\u0065l").
func keyIs(quoted []byte, want string) (bool, error) {
	raw := quoted[1 : len(quoted)-1]
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw) == want, nil
	}
	s, err := decodeString(quoted)
	if err != nil {
		return false, err
	}
	return s == want, nil
}

// decodeString decodes a quoted JSON string, without allocating more than
// the result when it has no escapes.
func decodeString(quoted []byte) (string, error) {
	raw := quoted[1 : len(quoted)-1]
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw), nil
	}
	var s string
	if err := json.Unmarshal(quoted, &s); err != nil {
		return "", err
	}
	return s, nil
}

// withModel returns a copy of body whose top-level "model" is name: the old
// value's bytes are replaced (alias → served name, null → name), or, when
// there was no "model", a member is inserted right after the opening brace.
// Nothing else changes.
func withModel(body []byte, f modelField, name string) []byte {
	q, _ := json.Marshal(name) // a Go string always encodes
	if f.KeyFound {
		out := make([]byte, 0, len(body)-(f.End-f.Start)+len(q))
		out = append(out, body[:f.Start]...)
		out = append(out, q...)
		return append(out, body[f.End:]...)
	}
	out := make([]byte, 0, len(body)+len(q)+10)
	out = append(out, body[:f.ObjStart+1]...)
	out = append(out, `"model":`...)
	out = append(out, q...)
	if !f.Empty {
		out = append(out, ',')
	}
	return append(out, body[f.ObjStart+1:]...)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
