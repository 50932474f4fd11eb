package systemd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

const (
	// journalTimeout bounds journalctl when the caller's context has no
	// deadline.
	journalTimeout = 10 * time.Second
	// maxJournalLines caps what one call may ask for, so a status view
	// cannot make the daemon read an unbounded journal into memory.
	maxJournalLines = 10000
)

// JournalTail returns the last n messages journald holds for unit, oldest
// first (journalctl -u unit -n n -o json). It is empty when journald has
// nothing for the unit. Binary messages are returned as their bytes.
// journalctl runs in this process's namespaces, so it reads the journal of
// the systemd this process can see.
func JournalTail(ctx context.Context, unit string, n int) ([]string, error) {
	if err := checkUnitName(unit); err != nil {
		return nil, fmt.Errorf("read journal of unit %q: %w", unit, err)
	}
	if n <= 0 || n > maxJournalLines {
		return nil, fmt.Errorf("read journal of unit %s: line count %d out of range 1..%d", unit, n, maxJournalLines)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, journalTimeout)
		defer cancel()
	}
	cmd := exec.CommandContext(ctx, "journalctl", "--unit="+unit, "--lines="+strconv.Itoa(n),
		"--output=json", "--no-pager", "--quiet")
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("read journal of unit %s (journalctl): %w: %s", unit, err, strings.TrimSpace(stderr.String()))
	}
	msgs, err := parseJournalJSON(&stdout)
	if err != nil {
		return nil, fmt.Errorf("read journal of unit %s: %w", unit, err)
	}
	return msgs, nil
}

// parseJournalJSON reads journalctl's JSON output (one object per entry)
// and returns the MESSAGE of each entry. Entries without a message are
// skipped.
func parseJournalJSON(r io.Reader) ([]string, error) {
	dec := json.NewDecoder(r)
	var out []string
	for i := 0; ; i++ {
		var entry map[string]json.RawMessage
		err := dec.Decode(&entry)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, fmt.Errorf("parse journalctl JSON entry %d: %w", i, err)
		}
		raw, ok := entry["MESSAGE"]
		if !ok {
			continue
		}
		msg, ok, err := journalField(raw)
		if err != nil {
			return out, fmt.Errorf("parse MESSAGE of journal entry %d: %w", i, err)
		}
		if ok {
			out = append(out, msg)
		}
	}
}

// journalField decodes one field of journalctl's JSON: a string; an array of
// byte values (journald's form for binary or non-UTF-8 data); null (a field
// too large to show); or, for a field that appears several times in an
// entry, an array of those, which is joined with newlines.
func journalField(raw json.RawMessage) (string, bool, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", false, nil
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", false, err
		}
		return s, true, nil
	case '[':
		var items []json.RawMessage
		if err := json.Unmarshal(raw, &items); err != nil {
			return "", false, err
		}
		if len(items) == 0 {
			return "", true, nil
		}
		if first := bytes.TrimSpace(items[0]); len(first) > 0 && (first[0] == '-' || (first[0] >= '0' && first[0] <= '9')) {
			var bs []int
			if err := json.Unmarshal(raw, &bs); err != nil {
				return "", false, err
			}
			b := make([]byte, len(bs))
			for i, v := range bs {
				if v < 0 || v > 255 {
					return "", false, fmt.Errorf("byte value %d out of range", v)
				}
				b[i] = byte(v)
			}
			return string(b), true, nil
		}
		var parts []string
		for _, item := range items {
			s, ok, err := journalField(item)
			if err != nil {
				return "", false, err
			}
			if ok {
				parts = append(parts, s)
			}
		}
		return strings.Join(parts, "\n"), true, nil
	}
	return "", false, fmt.Errorf("unexpected JSON value %.20q", raw)
}
