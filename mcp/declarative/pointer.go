package declarative

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// pointer is a parsed RFC 6901 JSON pointer: the unescaped reference
// tokens; empty selects the whole document.
type pointer []string

// parsePointer checks the syntax at load time, so a typo in `select` is a
// file error instead of a failure on every call.
func parsePointer(s string) (pointer, error) {
	if s == "" {
		return nil, nil
	}
	if !strings.HasPrefix(s, "/") {
		return nil, fmt.Errorf("%q must be empty or start with / (RFC 6901 JSON pointer)", s)
	}
	parts := strings.Split(s[1:], "/")
	for i, p := range parts {
		// "~" must be followed by 0 or 1 (RFC 6901 section 3).
		for j := 0; j < len(p); j++ {
			if p[j] == '~' && (j+1 == len(p) || (p[j+1] != '0' && p[j+1] != '1')) {
				return nil, fmt.Errorf("%q: ~ must be written ~0 and / must be written ~1", s)
			}
		}
		// Order matters: ~1 first, then ~0 (section 4).
		parts[i] = strings.ReplaceAll(strings.ReplaceAll(p, "~1", "/"), "~0", "~")
	}
	return parts, nil
}

// String renders the pointer back in RFC 6901 form.
func (p pointer) String() string {
	var b strings.Builder
	for _, t := range p {
		b.WriteByte('/')
		b.WriteString(strings.ReplaceAll(strings.ReplaceAll(t, "~", "~0"), "/", "~1"))
	}
	return b.String()
}

// errSelect marks a pointer that did not match the response: the API's
// shape differs from what the file expects (the operator must fix select).
var errSelect = errors.New("select does not match the response")

// resolve applies p to a document decoded by encoding/json (maps, slices,
// json.Number, strings, bools, nil).
func (p pointer) resolve(doc any) (any, error) {
	cur := doc
	for i, tok := range p {
		at := pointer(p[:i]).String()
		if at == "" {
			at = "the top level"
		}
		switch v := cur.(type) {
		case map[string]any:
			next, ok := v[tok]
			if !ok {
				return nil, fmt.Errorf("no key %q at %s (keys there: %s)", tok, at, keyList(v))
			}
			cur = next
		case []any:
			idx, err := arrayIndex(tok)
			if err != nil {
				return nil, fmt.Errorf("%q at %s %v", tok, at, err)
			}
			if idx >= len(v) {
				return nil, fmt.Errorf("index %d at %s is past the end (%d elements)", idx, at, len(v))
			}
			cur = v[idx]
		default:
			return nil, fmt.Errorf("%s is a %s, not an object or array", at, jsonKind(cur))
		}
	}
	return cur, nil
}

// arrayIndex parses an array reference token: digits without leading
// zeros; "-" (past the end) never names an element.
func arrayIndex(tok string) (int, error) {
	if tok == "" || (len(tok) > 1 && tok[0] == '0') || strings.TrimLeft(tok, "0123456789") != "" {
		return 0, errors.New("is not an array index")
	}
	n, err := strconv.Atoi(tok)
	if err != nil {
		return 0, errors.New("is not an array index")
	}
	return n, nil
}

func keyList(m map[string]any) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	const show = 10
	if len(keys) > show {
		return strings.Join(keys[:show], ", ") + fmt.Sprintf(" and %d more", len(keys)-show)
	}
	if len(keys) == 0 {
		return "none"
	}
	return strings.Join(keys, ", ")
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "string"
	case bool:
		return "boolean"
	case map[string]any:
		return "object"
	case []any:
		return "array"
	default:
		return "number"
	}
}
