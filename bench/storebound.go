package bench

import "fmt"

// Bounds on what one stored result and the whole store may cost in memory
// once parsed. A result's JSON is small, but a Go value of it costs more
// per element than its bytes (a one-character note is 4 bytes of JSON and
// about 24 of Go), so bytes alone do not bound memory: 580k one-character
// notes in a 3.4 MB upload held ~14 MB each, and a listing of 61 MB of
// them held ~160 MB. A real result has a few hundred values.
const (
	// MaxResultValues is the most JSON values (objects, arrays, members
	// and elements) one result may hold; ParseResult refuses more, before
	// decoding it.
	MaxResultValues = 20_000
	// maxStoreValues bounds the values of all stored results together:
	// Save prunes the earliest arrivals beyond it, as beyond max_results
	// and max_bytes. With it, what List holds parsed is about the bytes on
	// disk plus 24 bytes per value (~24 MiB at this bound).
	maxStoreValues = 1 << 20
)

// countValues estimates the JSON values in data without decoding it: one
// per opening bracket and per separating comma outside strings, plus one.
// It counts every member and element of a well-formed document at least
// once, and costs one pass over the bytes.
func countValues(data []byte) int {
	n, inString, escaped := 1, false, false
	for _, c := range data {
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '{' || c == '[' || c == ',':
			n++
		}
	}
	return n
}

// checkValues refuses a document with more than MaxResultValues values.
func checkValues(data []byte) error {
	if n := countValues(data); n > MaxResultValues {
		return fmt.Errorf("not a bench result: %d JSON values, more than the %d a result may hold (a real one has a few hundred)", n, MaxResultValues)
	}
	return nil
}
