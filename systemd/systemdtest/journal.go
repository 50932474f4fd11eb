package systemdtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"
)

// UnitEventKind is what one of PID 1's messages about a unit says.
type UnitEventKind string

const (
	// UnitStarting: a start job began ("Starting u..."). systemd leaves it
	// out for starts that complete at once (Type=simple without
	// ExecStartPre), which log only UnitStarted.
	UnitStarting UnitEventKind = "starting"
	// UnitStarted: a start job finished successfully ("Started u.").
	UnitStarted UnitEventKind = "started"
	// UnitStartFailed: a start job failed ("Failed to start u.").
	UnitStartFailed UnitEventKind = "start-failed"
	// UnitStopping: a stop job began ("Stopping u...").
	UnitStopping UnitEventKind = "stopping"
	// UnitStopped: a stop job finished ("Stopped u."): the unit is
	// inactive or failed, its processes are gone.
	UnitStopped UnitEventKind = "stopped"
	// UnitSucceeded: the unit went inactive ("u: Deactivated
	// successfully."), with or without a stop job.
	UnitSucceeded UnitEventKind = "succeeded"
	// UnitFailed: the unit entered the failed state ("u: Failed with
	// result ..."), with or without a stop job.
	UnitFailed UnitEventKind = "failed"
)

// unitMessageKinds maps the MESSAGE_IDs of PID 1's structured messages (see
// systemd's catalog, /usr/lib/systemd/catalog/systemd.catalog) to what they
// say. The IDs are stable across systemd versions.
var unitMessageKinds = map[string]UnitEventKind{
	"7d4958e842da4a758f6c1cdc7b36dcc5": UnitStarting,
	"39f53479d3a045ac8e11786248231fbf": UnitStarted,
	"be02cf6855d2428ba40df7e9d022f03d": UnitStartFailed,
	"de5b426a63be47a7b6ac3eaac82e2f6f": UnitStopping,
	"9d1aaa27d60140bd96365438aad20286": UnitStopped,
	"7ad2d189f7e94e70a38c781354912448": UnitSucceeded,
	"d9b373ed55a64feb8242e02dbe79a49c": UnitFailed,
}

// UnitEvent is one job or state message of PID 1 about a unit, from the
// private systemd's journal.
type UnitEvent struct {
	Seq     uint64 // journald's sequence number: the order PID 1 sent them in
	Unit    string
	Kind    UnitEventKind
	Message string
}

func (e UnitEvent) String() string {
	return fmt.Sprintf("#%d %s %s (%q)", e.Seq, e.Unit, e.Kind, e.Message)
}

// UnitEvents returns PID 1's job and state messages about units, in the
// order PID 1 sent them. Unlike sampling unit states over D-Bus, the
// sequence has no blind spots between samples, whatever the machine's
// speed. journald receives PID 1's messages asynchronously: a caller that
// expects an event polls until it is there. Without a deadline in ctx it
// gives up after 30 s.
func (s *Systemd) UnitEvents(ctx context.Context, units ...string) ([]UnitEvent, error) {
	if len(units) == 0 {
		return nil, errors.New("unit events: no unit named")
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
	}
	args := []string{"--no-pager", "--quiet", "--output=json", "_PID=1"}
	for _, u := range units {
		if u == "" || strings.ContainsAny(u, "= \n") {
			return nil, fmt.Errorf("unit events: bad unit name %q", u)
		}
		args = append(args, "UNIT="+u) // the same field twice: either value
	}
	cmd := s.Command(ctx, "journalctl", args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("unit events of %s: journalctl inside PID %d: %w: %s",
			strings.Join(units, ", "), s.PID, err, bytes.TrimSpace(stderr.Bytes()))
	}
	evs, err := parseUnitEvents(&stdout)
	if err != nil {
		return nil, fmt.Errorf("unit events of %s: %w", strings.Join(units, ", "), err)
	}
	return evs, nil
}

// parseUnitEvents reads journalctl's JSON output and keeps the entries whose
// MESSAGE_ID is a unit job or state message, ordered by sequence number.
func parseUnitEvents(r io.Reader) ([]UnitEvent, error) {
	dec := json.NewDecoder(r)
	var out []UnitEvent
	for i := 0; ; i++ {
		var entry map[string]any
		err := dec.Decode(&entry)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return out, fmt.Errorf("parse journalctl JSON entry %d: %w", i, err)
		}
		id, _ := entry["MESSAGE_ID"].(string)
		kind, ok := unitMessageKinds[id]
		if !ok {
			continue
		}
		unit, _ := entry["UNIT"].(string)
		seq, err := entrySeq(entry)
		if err != nil {
			return out, fmt.Errorf("journal entry %d: %w", i, err)
		}
		msg, _ := entry["MESSAGE"].(string)
		out = append(out, UnitEvent{Seq: seq, Unit: unit, Kind: kind, Message: msg})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Seq < out[j].Seq })
	return out, nil
}

// Overlaps checks mutual exclusion on a sequence of unit events: a unit
// counts as running from its first start message (UnitStarting, or
// UnitStarted where systemd logs no UnitStarting) until a message that it
// is inactive or failed (UnitStopped, UnitSucceeded, UnitFailed,
// UnitStartFailed). It returns one line for every start of a unit while
// another one was running, and the number of starts it saw (so that a
// caller can tell an empty journal from a clean one).
func Overlaps(events []UnitEvent) (violations []string, starts int) {
	running := map[string]UnitEvent{} // unit → the event that started it
	for _, ev := range events {
		switch ev.Kind {
		case UnitStarting, UnitStarted:
			if _, ok := running[ev.Unit]; ok {
				continue // Started after Starting: the same start
			}
			starts++
			others := make([]string, 0, len(running))
			for u, since := range running {
				others = append(others, fmt.Sprintf("%s (running since %s)", u, since))
			}
			sort.Strings(others)
			if len(others) > 0 {
				violations = append(violations, fmt.Sprintf("%s while %s", ev, strings.Join(others, ", ")))
			}
			running[ev.Unit] = ev
		case UnitStopped, UnitSucceeded, UnitFailed, UnitStartFailed:
			delete(running, ev.Unit)
		}
	}
	return violations, starts
}

// entrySeq returns an entry's sequence number: __SEQNUM (journalctl 254 and
// later), or the i= part of __CURSOR (hexadecimal), which every version
// prints.
func entrySeq(entry map[string]any) (uint64, error) {
	if text, ok := entry["__SEQNUM"].(string); ok {
		seq, err := strconv.ParseUint(text, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("__SEQNUM %q: %w", text, err)
		}
		return seq, nil
	}
	cursor, _ := entry["__CURSOR"].(string)
	for _, part := range strings.Split(cursor, ";") {
		if hex, ok := strings.CutPrefix(part, "i="); ok {
			seq, err := strconv.ParseUint(hex, 16, 64)
			if err != nil {
				return 0, fmt.Errorf("__CURSOR %q: sequence number: %w", cursor, err)
			}
			return seq, nil
		}
	}
	return 0, fmt.Errorf("no __SEQNUM and no sequence number in __CURSOR %q", cursor)
}
