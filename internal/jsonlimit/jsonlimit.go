// Package jsonlimit bounds what decoding a JSON document may allocate
// before it is decoded. A byte cap bounds the body, not the decoder: a
// 4 MiB array of empty objects decodes into ~1.4 million maps (about
// 160 MB), a few MB of one-character strings into as many string headers.
// Check walks the bytes once, allocating nothing, and refuses a document
// that nests deeper or holds more values than its Limits; what it counts
// (Counts.DecodeCost) is what a caller reserves in the daemon's memory
// budget (internal/membudget) while the document is decoded.
//
// Check is a bound, not a validator: it follows strings and brackets
// exactly (so its counts are right for every valid document) and leaves
// the rest of the syntax to the decoder, which stops at the first error.
package jsonlimit

import "fmt"

// Limits bound one document. Zero fields are not checked.
type Limits struct {
	// MaxDepth bounds nesting of objects and arrays.
	MaxDepth int
	// MaxValues bounds the values in the document: every object, array,
	// string, number and literal, object keys included (a key is a string
	// the decoder allocates too).
	MaxValues int
	// MaxStrings bounds the strings among them (keys included).
	MaxStrings int
}

// Default are the limits used where no configuration sets them (the
// Telegram Bot API's answers): far above any legitimate document the
// daemon reads, far below what a hostile one of the same size holds.
var Default = Limits{MaxDepth: 64, MaxValues: 50_000, MaxStrings: 50_000}

// Counts are what Check found.
type Counts struct {
	Depth   int // deepest nesting
	Values  int // values, keys included
	Strings int // strings, keys included
	Bytes   int // the document's length
}

// CostPerValue is what decoding one value is charged, in bytes: Go's
// decoder into interfaces, maps or slices spends 50-120 bytes per value
// (measured on 1.4 million empty objects: ~114 bytes each), and a request
// may be decoded more than once (a JSON-RPC envelope, then its arguments).
const CostPerValue = 256

// DecodeCost estimates the bytes decoding the document allocates beyond
// its own buffer: its values, and its strings copied out (at most its
// length).
func (c Counts) DecodeCost() int64 {
	return int64(c.Values)*CostPerValue + int64(c.Bytes)
}

// Error is a document over a limit, or one that is not JSON (brackets
// that do not match, a byte no JSON token starts with).
type Error struct {
	// Kind is "depth", "values", "strings" or "syntax".
	Kind string
	// Limit is the limit that was passed (0 for syntax).
	Limit int
	// Offset is the byte where the walk stopped.
	Offset int
}

func (e *Error) Error() string {
	switch e.Kind {
	case "depth":
		return fmt.Sprintf("JSON nests deeper than %d levels (at byte %d)", e.Limit, e.Offset)
	case "values":
		return fmt.Sprintf("JSON holds more than %d values (at byte %d)", e.Limit, e.Offset)
	case "strings":
		return fmt.Sprintf("JSON holds more than %d strings (at byte %d)", e.Limit, e.Offset)
	}
	return fmt.Sprintf("not JSON (at byte %d)", e.Offset)
}

// Check walks b and returns its counts, or an *Error at the first limit
// passed. It allocates nothing.
func Check(b []byte, l Limits) (Counts, error) {
	c := Counts{Bytes: len(b)}
	depth := 0
	over := func(kind string, n, limit, at int) error {
		if limit > 0 && n > limit {
			return &Error{Kind: kind, Limit: limit, Offset: at}
		}
		return nil
	}
	for i := 0; i < len(b); i++ {
		switch ch := b[i]; {
		case ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == ',' || ch == ':':
		case ch == '{' || ch == '[':
			depth++
			c.Values++
			c.Depth = max(c.Depth, depth)
			if err := over("depth", depth, l.MaxDepth, i); err != nil {
				return c, err
			}
		case ch == '}' || ch == ']':
			depth--
			if depth < 0 {
				return c, &Error{Kind: "syntax", Offset: i}
			}
		case ch == '"':
			i = skipString(b, i+1)
			c.Values++
			c.Strings++
			if err := over("strings", c.Strings, l.MaxStrings, i); err != nil {
				return c, err
			}
		case ch == '-' || ch >= '0' && ch <= '9' || ch == 't' || ch == 'f' || ch == 'n':
			// A number or literal: one value up to the next delimiter.
			for i+1 < len(b) && !delimiter(b[i+1]) {
				i++
			}
			c.Values++
		default: // not JSON (an HTML error page): the decoder's to refuse
			return c, &Error{Kind: "syntax", Offset: i}
		}
		if err := over("values", c.Values, l.MaxValues, i); err != nil {
			return c, err
		}
	}
	if depth != 0 {
		return c, &Error{Kind: "syntax", Offset: len(b)}
	}
	return c, nil
}

// skipString returns the index of the quote closing the string whose
// contents start at i (len(b) when it is not closed).
func skipString(b []byte, i int) int {
	for ; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i
		}
	}
	return len(b)
}

func delimiter(ch byte) bool {
	switch ch {
	case ' ', '\t', '\n', '\r', ',', ':', '{', '}', '[', ']', '"':
		return true
	}
	return false
}
