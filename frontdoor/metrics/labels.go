package metrics

import (
	"strings"
	"sync"
	"unicode/utf8"
)

// maxLabelBytes caps a label value taken from outside (a client's model
// name, a profile name from an event): long values bloat every sample.
const maxLabelBytes = 128

// cleanLabel makes s safe as a Prometheus label value: client_golang panics
// on invalid UTF-8, so invalid bytes become U+FFFD; the result is cut to at
// most maxLabelBytes on a rune boundary.
func cleanLabel(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= maxLabelBytes {
		return s
	}
	cut := maxLabelBytes
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// boundedLabel hands out label values for a label fed from outside and
// keeps their number bounded: the first max distinct (cleaned) values are
// passed through, later new ones become "other". An empty value is
// "unknown". Safe for concurrent use.
type boundedLabel struct {
	max  int
	mu   sync.Mutex
	seen map[string]struct{}
}

func newBoundedLabel(max int) *boundedLabel {
	return &boundedLabel{max: max, seen: make(map[string]struct{})}
}

// Values that stand in for a raw label value.
const (
	labelOther   = "other"
	labelUnknown = "unknown"
)

func (b *boundedLabel) value(raw string) string {
	v := cleanLabel(raw)
	if v == "" {
		return labelUnknown
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.seen[v]; ok {
		return v
	}
	if len(b.seen) >= b.max {
		return labelOther
	}
	b.seen[v] = struct{}{}
	return v
}
