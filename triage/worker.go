package triage

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"gpuhost/triage/sink"
	"gpuhost/triage/source"
)

// Status is the worker's state for GET /api/triage.
type Status struct {
	Mailbox             string     `json:"mailbox"`
	Checkpoint          Checkpoint `json:"checkpoint"`
	LastPoll            time.Time  `json:"last_poll,omitzero"`
	LastPollOK          time.Time  `json:"last_poll_ok,omitzero"`
	LastError           string     `json:"last_error,omitempty"`
	ConsecutiveFailures int        `json:"consecutive_failures"`
	// FailingSince is the first failed poll of the current streak (zero
	// while polls succeed).
	FailingSince time.Time `json:"failing_since,omitzero"`
	Alerting     bool      `json:"alerting"`
	// LastAlert is when the poll-failure alert or its latest reminder was
	// raised (reached a sink, or the log when no sink carries alerts);
	// LastAllClear when the all-clear after one was sent. Both outlive the
	// streak, so the panel can say what the team was last told.
	LastAlert    time.Time `json:"last_alert,omitzero"`
	LastAllClear time.Time `json:"last_all_clear,omitzero"`
	Processed    int       `json:"processed"`
}

// Key is the mail's identity across restarts and in the sinks.
func Key(mailbox string, uidValidity, uid uint32) string {
	return mailbox + "/" + strconv.FormatUint(uint64(uidValidity), 10) + "/" + strconv.FormatUint(uint64(uid), 10)
}

// Run polls until ctx ends: fetch, process every new mail in UID order,
// wait Interval (or less when the source announces new mail). A failed
// poll is logged, counted for the alert and retried after Interval. It
// returns nil when ctx ends.
func (w *Worker) Run(ctx context.Context) error {
	w.log.Info("triage: worker started", "interval", w.o.Interval, "last_uid", w.current().LastUID, "sinks", len(w.o.Sinks))
	for {
		n, err := w.Once(ctx)
		if ctx.Err() != nil {
			w.log.Info("triage: worker stopped")
			return nil
		}
		if err != nil {
			wait := w.failedPollWait()
			w.log.Error("triage: poll failed; retrying after the interval", "wait", wait, "err", err, "processed", n)
			if !w.sleep(ctx, wait) {
				return nil
			}
			continue
		}
		if werr := w.o.Source.Wait(ctx, w.o.Interval); werr != nil {
			if ctx.Err() != nil {
				w.log.Info("triage: worker stopped")
				return nil
			}
			w.log.Warn("triage: waiting for new mail failed; sleeping the interval instead", "err", werr)
			if !w.sleep(ctx, w.o.Interval) {
				return nil
			}
		}
	}
}

// failedPollWait is how long to wait after a failed poll: the interval,
// or longer while a sink's Retry-After has not run out.
func (w *Worker) failedPollWait() time.Duration {
	wait := w.o.Interval
	now := w.o.Clock.Now()
	w.smu.Lock()
	defer w.smu.Unlock()
	for _, until := range w.hold {
		wait = max(wait, until.Sub(now))
	}
	return wait
}

// holdErr is the error for a call to a sink that asked (Retry-After) not
// to be called before a time still ahead; nil when the sink may be called.
func (w *Worker) holdErr(name string) error {
	now := w.o.Clock.Now()
	w.smu.Lock()
	defer w.smu.Unlock()
	until, ok := w.hold[name]
	if !ok {
		return nil
	}
	if !now.Before(until) {
		delete(w.hold, name)
		return nil
	}
	return fmt.Errorf("%s asked not to be called before %s (Retry-After); not calling it", name, until.UTC().Format(time.RFC3339))
}

// noteHold remembers a sink error's Retry-After for the polls that follow.
func (w *Worker) noteHold(name string, err error) {
	d := sink.RetryAfter(err)
	if d <= 0 {
		return
	}
	until := w.o.Clock.Now().Add(d)
	w.smu.Lock()
	defer w.smu.Unlock()
	if w.hold == nil {
		w.hold = map[string]time.Time{}
	}
	w.hold[name] = until
	w.log.Warn("triage: sink rate limited; not calling it again before its Retry-After", "sink", name, "retry_after", d, "until", until)
}

func (w *Worker) sleep(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-w.o.Clock.After(d):
		return true
	}
}

// Once is one poll: it fetches and processes every mail after the
// checkpoint (batch after batch until the mailbox is drained) and returns
// how many mails it finished. An error stops at the mail that could not be
// finished, leaving the checkpoint before it.
func (w *Worker) Once(ctx context.Context) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, err := w.poll(ctx)
	now := w.o.Clock.Now()
	switch {
	case err != nil && ctx.Err() != nil:
		return n, err // shutting down: not a failure
	case err != nil:
		w.pollFailed(ctx, now, err)
	default:
		w.pollOK(ctx, now)
	}
	return n, err
}

func (w *Worker) poll(ctx context.Context) (int, error) {
	n := 0
	reset := false
	for {
		after := w.st.LastUID
		batch, err := w.o.Source.Fetch(ctx, after, w.o.BatchSize, w.o.MaxMessageBytes)
		if err != nil {
			return n, fmt.Errorf("fetch from %s after UID %d: %w", w.name, after, err)
		}
		if batch.UIDValidity != w.st.UIDValidity {
			if reset {
				return n, fmt.Errorf("mailbox %s changed its UIDVALIDITY twice in one poll (now %d); trying again next poll", w.name, batch.UIDValidity)
			}
			if err := w.uidValidityChanged(ctx, batch); err != nil {
				return n, err
			}
			if w.st.LastUID != after {
				reset = true
				continue // fetch again from the new position
			}
		}
		for _, m := range batch.Mails {
			if m.UID <= w.st.LastUID {
				continue // a source that returns too much must not repeat mail
			}
			if err := w.handle(ctx, batch.UIDValidity, m); err != nil {
				return n, err
			}
			n++
		}
		if len(batch.Mails) < w.o.BatchSize {
			return n, nil
		}
	}
}

// uidValidityChanged adopts a new UIDVALIDITY: on the first poll simply,
// after a change by re-baselining (continue after the mailbox's highest
// UID) or by starting over, as configured.
func (w *Worker) uidValidityChanged(ctx context.Context, batch source.Batch) error {
	st := w.st.clone()
	old := st.UIDValidity
	st.Mailbox = w.name
	st.UIDValidity = batch.UIDValidity
	st.Inflight = nil // its key names the old UIDVALIDITY
	var text string
	switch {
	case old == 0 && st.LastUID == 0 && w.o.StartAtEnd:
		// First poll of this mailbox (first_run: new): its history is not
		// news; start after what is there now.
		st.LastUID = batch.HighestUID
		w.log.Info("triage: first poll of this mailbox; starting after its current mails (first_run: new; send older ones with gpuhost triage mail --uid N)",
			"mailbox", w.name, "uidvalidity", batch.UIDValidity, "after_uid", batch.HighestUID)
	case old == 0 && st.LastUID == 0:
		// First poll of this mailbox (first_run: all): from the first mail.
	case w.o.Rebaseline:
		st.LastUID = batch.HighestUID
		text = fmt.Sprintf("triage: mailbox %s changed its UIDVALIDITY (%d → %d); re-baselined at UID %d. Mails that arrived since the last poll were NOT triaged — check the mailbox by hand.",
			w.name, old, batch.UIDValidity, batch.HighestUID)
	default:
		st.LastUID = 0
		text = fmt.Sprintf("triage: mailbox %s changed its UIDVALIDITY (%d → %d); every mail in it is triaged again (rebaseline_on_uidvalidity is off).",
			w.name, old, batch.UIDValidity)
	}
	if err := w.save(st); err != nil {
		return err
	}
	if text != "" {
		w.log.Error(text, "old_uidvalidity", old, "uidvalidity", batch.UIDValidity, "last_uid", st.LastUID)
		w.alertAll(ctx, text)
	}
	return nil
}

// handle processes one mail and posts it, with the checkpoint protocol:
// inflight marker before the first paid call, each call recorded before
// its result is used (calllog.go), the judged result before the first
// post, each accepting sink recorded, then last_uid and the cleared marker
// in one write. A mail whose marker already holds its judged result is not
// processed again, and one whose marker holds finished calls reuses them:
// it is classified and its cost counted once.
func (w *Worker) handle(ctx context.Context, uidValidity uint32, m source.Mail) error {
	key := Key(w.name, uidValidity, m.UID)
	st := w.st.clone()
	resumed := st.Inflight != nil && st.Inflight.Key == key
	// A marker with a judged result (or an old one without call records)
	// may have reached some sinks; one with only calls has not.
	posting := resumed && (st.Inflight.Judged != nil || len(st.Inflight.Calls) == 0)
	var res *Result
	if resumed && st.Inflight.Judged != nil {
		// An earlier poll (or run) judged this mail and paid for it; only
		// its post is still missing.
		res = st.Inflight.Judged.result()
		w.log.Info("triage: reusing the mail's judged result from an earlier attempt; not classifying it again",
			"key", key, "class", res.Class, "judged_at", res.At)
	} else {
		var err error
		res, err = w.process(ctx, m, key, &callLog{w: w, key: key, uid: m.UID})
		if err != nil {
			return err
		}
		st = w.st.clone() // process recorded its calls
		if st.Inflight == nil || st.Inflight.Key != key {
			st.Inflight = &Inflight{UID: m.UID, Key: key, Since: w.o.Clock.Now()}
		}
		// The judged result holds the calls' cost; their records go.
		st.Inflight.Judged, st.Inflight.Calls = newJudged(res), nil
		st.Costs = addDayCost(st.Costs, res.At, res.Cost)
		if err := w.save(st); err != nil {
			return err
		}
		st = w.st.clone()
	}
	done := map[string]bool{}
	if posting {
		// A run before this one may have begun posting this mail.
		if err := w.checkPosted(ctx, key, st.Inflight.Posted, done, res); err != nil {
			return err
		}
	}
	for i, s := range w.o.Sinks {
		if done[s.Name()] {
			continue
		}
		if err := w.holdErr(s.Name()); err != nil {
			return &retryError{what: fmt.Sprintf("post %s to %s", key, s.Name()), err: err}
		}
		pctx, cancel := context.WithTimeout(ctx, w.o.CallTimeout)
		err := s.Post(pctx, res.Post)
		cancel()
		if err != nil {
			w.noteHold(s.Name(), err)
			w.metrics.postErrors.WithLabelValues(s.Name()).Inc()
			return &retryError{what: fmt.Sprintf("post %s to %s", key, s.Name()), err: err}
		}
		res.Posted = append(res.Posted, s.Name())
		if i < len(w.o.Sinks)-1 {
			st = st.clone()
			st.Inflight.Posted = append(st.Inflight.Posted, s.Name())
			if err := w.save(st); err != nil {
				return err
			}
		}
	}
	st = st.clone()
	st.LastUID = m.UID
	st.Inflight = nil
	if err := w.save(st); err != nil {
		return err
	}
	w.metrics.mails.WithLabelValues(res.Class).Inc()
	w.remember(*res, true)
	w.log.Info("triage: mail posted", "key", key, "posted", res.Posted, "already_posted", res.AlreadyPosted)
	return nil
}

// checkPosted fills done with the sinks that already have the mail: those
// the marker records, and those a sink.Checker says hold the post.
func (w *Worker) checkPosted(ctx context.Context, key string, posted []string, done map[string]bool, res *Result) error {
	for _, name := range posted {
		done[name] = true
	}
	for _, s := range w.o.Sinks {
		c, ok := s.(sink.Checker)
		if !ok || done[s.Name()] {
			continue
		}
		if err := w.holdErr(s.Name()); err != nil {
			return &retryError{what: fmt.Sprintf("check whether %s already has %s", s.Name(), key), err: err}
		}
		cctx, cancel := context.WithTimeout(ctx, w.o.CallTimeout)
		posted, err := c.Posted(cctx, key)
		cancel()
		w.metrics.checks.WithLabelValues(s.Name(), strconv.FormatBool(posted && err == nil)).Inc()
		if err != nil {
			w.noteHold(s.Name(), err)
			return &retryError{what: fmt.Sprintf("check whether %s already has %s", s.Name(), key), err: err}
		}
		if posted {
			done[s.Name()] = true
			w.log.Warn("triage: the post survived the crash; not posting it again", "key", key, "sink", s.Name())
		}
	}
	for name := range done {
		res.AlreadyPosted = append(res.AlreadyPosted, name)
	}
	slices.Sort(res.AlreadyPosted)
	return nil
}

// save writes the checkpoint and, once it is on disk, adopts it.
func (w *Worker) save(st Checkpoint) error {
	st.Mailbox = w.name
	st.Updated = w.o.Clock.Now().UTC()
	if err := saveCheckpoint(w.path, st); err != nil {
		return &retryError{what: "checkpoint " + w.name, err: err}
	}
	w.st = st
	w.metrics.checkpoint.Set(float64(st.LastUID))
	w.smu.Lock()
	w.status.Checkpoint = st.clone()
	w.smu.Unlock()
	return nil
}

func (w *Worker) current() Checkpoint {
	w.smu.Lock()
	defer w.smu.Unlock()
	return w.status.Checkpoint.clone()
}

// ProcessUID sends one mail of the mailbox through the pipeline by hand
// (`gpuhost triage mail --uid N`). It does not move the checkpoint; with
// dryRun it posts nothing and the result's Text is what would be posted.
// The Source must allow Get while Run waits (both sources do).
func (w *Worker) ProcessUID(ctx context.Context, uid uint32, dryRun bool) (Result, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	m, err := w.o.Source.Get(ctx, uid, w.o.MaxMessageBytes)
	if errors.Is(err, source.ErrNotFound) {
		return Result{}, fmt.Errorf("mailbox %s has no mail with UID %d: %w", w.name, uid, err)
	}
	if err != nil {
		return Result{}, fmt.Errorf("fetch UID %d from %s: %w", uid, w.name, err)
	}
	return w.manual(ctx, m, "manual/"+w.name+"/"+strconv.FormatUint(uint64(uid), 10), dryRun)
}

// ProcessRaw sends one raw RFC 5322 mail (an .eml file) through the
// pipeline by hand; see ProcessUID.
func (w *Worker) ProcessRaw(ctx context.Context, raw []byte, dryRun bool) (Result, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	sum := sha256.Sum256(raw)
	m := source.Mail{Raw: raw, Size: int64(len(raw))}
	return w.manual(ctx, m, "manual/eml/"+hex.EncodeToString(sum[:6]), dryRun)
}

// manual keys carry a "manual/" prefix so that the Slack check after a
// crash never mistakes a hand-sent post for the automatic one.
func (w *Worker) manual(ctx context.Context, m source.Mail, key string, dryRun bool) (Result, error) {
	res, err := w.process(ctx, m, key, nil)
	if err != nil {
		return Result{}, err
	}
	res.Manual, res.DryRun = true, dryRun
	w.countManual(res)
	if !dryRun {
		for _, s := range w.o.Sinks {
			pctx, cancel := context.WithTimeout(ctx, w.o.CallTimeout)
			err := s.Post(pctx, res.Post)
			cancel()
			if err != nil {
				w.remember(*res, false)
				return *res, fmt.Errorf("post %s to %s: %w", key, s.Name(), err)
			}
			res.Posted = append(res.Posted, s.Name())
		}
		w.metrics.mails.WithLabelValues(res.Class).Inc()
	}
	w.remember(*res, false)
	return *res, nil
}

// remember keeps the result for Recent.
func (w *Worker) remember(r Result, automatic bool) {
	w.smu.Lock()
	defer w.smu.Unlock()
	w.recent = append(w.recent, r)
	if over := len(w.recent) - w.o.KeepResults; over > 0 {
		w.recent = slices.Delete(w.recent, 0, over)
	}
	if automatic {
		w.status.Processed++
	}
}

// Recent returns the last KeepResults results, newest last.
func (w *Worker) Recent() []Result {
	w.smu.Lock()
	defer w.smu.Unlock()
	return slices.Clone(w.recent)
}

// State returns the poll and checkpoint state.
func (w *Worker) State() Status {
	w.smu.Lock()
	defer w.smu.Unlock()
	s := w.status
	s.Mailbox = w.name
	s.Checkpoint = s.Checkpoint.clone()
	s.ConsecutiveFailures = w.alert.Failures
	if w.alert.Failures > 0 {
		s.FailingSince = w.alert.FirstFail
	}
	s.Alerting = w.alert.Alerted
	return s
}
