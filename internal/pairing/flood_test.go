package pairing

import (
	"errors"
	"testing"
	"time"
)

// floodRun drives the store with the flood on the fake clock:
// `strangers` distinct senders writing at `rate` per second in turn (each
// sender every strangers/rate seconds when retry is set, else once), and
// from `newAt` on a new person writing every `every`. It returns on which
// of the person's tries the code came (their own answer or a code handed
// to them on someone else's request), 0 when none came within maxTries.
func floodRun(t *testing.T, strangers, rate int, retry bool, newAt, every time.Duration, maxTries int) (tries, granted int) {
	t.Helper()
	s, c := newStore(t)
	start := c.Now()
	const person = int64(1 << 40)
	step := time.Second / time.Duration(rate)
	next := start.Add(newAt)
	for i := 0; tries < maxTries; i++ {
		id := int64(100 + i%strangers)
		if !retry && i >= strangers {
			id = int64(100 + strangers + i) // a flood of ever new senders
		}
		out, err := s.Request(Sender{UserID: id, ChatID: id})
		if err != nil && !errors.Is(err, ErrRateLimited) {
			t.Fatal(err)
		}
		for _, g := range out.Grants {
			if g.UserID == person {
				return tries, granted + 1
			}
			granted++
		}
		if out.Action == ActionNewCode {
			granted++
		}
		c.Advance(step)
		if !c.Now().Before(next) {
			tries++
			out, err := s.Request(Sender{UserID: person, ChatID: person})
			if err != nil && !errors.Is(err, ErrRateLimited) {
				t.Fatal(err)
			}
			if out.Action == ActionNewCode {
				return tries, granted + 1
			}
			next = next.Add(every)
		}
	}
	return 0, granted
}

// TestFloodNewPersonGetsACode is the flood: 4,500 strangers at 25
// /start per second (each once), and a new person who tries every 12 s
// from a minute into the flood (on 119e2ce: no code in 15 tries, all 80
// codes of those minutes went to strangers). Codes go to the waiting
// sender with the most tries, so the person's second try puts them first
// in line and the next freed code is theirs. With a flood that retries (100 senders, each
// every 4 s, as persistent as the person and there before them), the line
// is served oldest first at the rate: the person waits their turn, bounded
// by the senders ahead of them divided by NewCodesPerMinute.
func TestFloodNewPersonGetsACode(t *testing.T) {
	if testing.Short() {
		t.Skip("writes pending.json some thousands of times")
	}
	// The person starts off the flood's 40 ms grid, as a real one would.
	tries, granted := floodRun(t, 4500, 25, false, time.Minute+1300*time.Millisecond, 12*time.Second, 15)
	t.Logf("one-shot flood (4,500 strangers at 25/s): the person got a code on try %d; %d codes issued in all", tries, granted)
	if tries == 0 || tries > 2 {
		t.Errorf("the person got a code on try %d (0: none in 15), want by the second", tries)
	}
	// Starting while the first minute's codes still fill the rate: the
	// person is first in line from the second try and gets the first code
	// the minute frees (try 5 at 12 s intervals).
	tries, granted = floodRun(t, 4500, 25, false, 11300*time.Millisecond, 12*time.Second, 15)
	t.Logf("one-shot flood, the person from second 11: code on try %d; %d codes issued in all", tries, granted)
	if tries == 0 || tries > 6 {
		t.Errorf("the person got a code on try %d (0: none in 15), want within 6", tries)
	}
	tries, granted = floodRun(t, 100, 25, true, time.Minute+1300*time.Millisecond, 12*time.Second, 40)
	t.Logf("retrying flood (100 senders, each every 4 s): the person got a code on try %d (%s after the first); %d codes issued in all",
		tries, time.Duration(tries-1)*12*time.Second, granted)
	// At most 100 senders ahead, 20 codes a minute: 5 minutes, 26 tries.
	if tries == 0 || tries > 26 {
		t.Errorf("the person got a code on try %d (0: none in 40), want within 26", tries)
	}
}
