package triage

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"gpuhost/triage/customer"
	"gpuhost/triage/llm"
	"gpuhost/triage/mail"
	"gpuhost/triage/sink"
	"gpuhost/triage/source"
	"gpuhost/triage/unsubscribe"
)

// Class names beyond the model's contact types.
const (
	// ClassUnclassified is a mail whose model reply stayed invalid.
	ClassUnclassified = "unclassified"
	// RuleUnclassified is the rule that gives an unclassified mail the
	// important threshold.
	RuleUnclassified = "unclassified mail: a person has to judge it"
)

// Limits on what the model and the post see of a mail.
const (
	maxBodyBytes       = 32 << 10 // body text sent to the classifier
	maxTranscriptBytes = 16 << 10 // transcript text sent to the classifier
	excerptRunes       = 300      // transcript excerpt in the post
)

// Result is one triaged mail as GET /api/triage and the CLI show it: what
// was decided and why, what it cost, where it went. It holds no mail body
// and no transcript, only the formatted post for the CLI (not in JSON).
type Result struct {
	Key             string             `json:"key"`
	UID             uint32             `json:"uid,omitempty"`
	Manual          bool               `json:"manual,omitempty"`
	DryRun          bool               `json:"dry_run,omitempty"`
	At              time.Time          `json:"at"`
	DurationMS      float64            `json:"duration_ms"`
	MessageID       string             `json:"message_id,omitempty"`
	From            string             `json:"from"`
	Subject         string             `json:"subject"`
	Class           string             `json:"class"`
	Unclassified    string             `json:"unclassified,omitempty"`
	Real            bool               `json:"real"`
	Importance      int                `json:"importance"`
	ModelImportance int                `json:"model_importance,omitempty"`
	Rule            string             `json:"rule,omitempty"`
	Important       bool               `json:"important"`
	Reasoning       string             `json:"reasoning,omitempty"`
	Transcribed     []string           `json:"transcribed,omitempty"`
	TranscriptNote  string             `json:"transcript_note,omitempty"`
	Unsubscribe     unsubscribe.Result `json:"unsubscribe,omitzero"`
	Customer        *customer.Customer `json:"customer,omitempty"`
	Cost            Cost               `json:"cost"`
	Problems        []string           `json:"problems,omitempty"`
	// Posted are the sinks that accepted the post in this run;
	// AlreadyPosted those that had it from a run that crashed.
	Posted        []string `json:"posted,omitempty"`
	AlreadyPosted []string `json:"already_posted,omitempty"`

	// Post is what goes to the sinks; Text is sink.Text of it, the plain
	// text Telegram gets (what `gpuhost triage mail --dry-run` prints).
	Post sink.Post `json:"-"`
	Text string    `json:"-"`
}

// errRetry marks an error that leaves the mail for the next poll.
type retryError struct {
	what string
	err  error
}

func (e *retryError) Error() string { return e.what + ": " + e.err.Error() }
func (e *retryError) Unwrap() error { return e.err }

// process runs the pipeline for one mail up to (not including) the posting.
// An error means the mail could not be judged now (the model endpoint is
// unreachable, ctx ended) and must be retried; everything about the mail
// itself — broken MIME, an invalid model reply, a failed transcription or
// CRM lookup — is carried in the Result instead. cl records each paid call
// before its result is used, and hands back the calls an earlier run
// finished (nil for a hand run).
func (w *Worker) process(ctx context.Context, m source.Mail, key string, cl *callLog) (*Result, error) {
	start := time.Now()
	log := w.log.With("key", key)
	res := &Result{Key: key, UID: m.UID, At: w.o.Clock.Now()}
	problem := func(msg string, attrs ...any) {
		res.Problems = append(res.Problems, msg)
		log.Warn("triage: "+msg, attrs...)
	}
	msg := w.readMail(m, res, problem)

	// Voice memos first: their text counts like the body.
	var calls []localUsage
	transcript, note, tcalls, err := w.transcribe(ctx, log, msg, res, cl)
	if err != nil {
		return nil, err
	}
	calls = append(calls, tcalls...)
	res.TranscriptNote = note

	ccalls, err := w.classify(ctx, log, key, msg, transcript, res, cl)
	if err != nil {
		return nil, err
	}
	calls = append(calls, ccalls...)

	internal := w.applyRules(msg, res)
	findUnsubscribe(msg, res)
	if w.o.Customers != nil && !internal && msg.From.Addr != "" {
		if err := w.lookupCustomer(ctx, msg.From.Addr, res, problem); err != nil {
			return nil, err
		}
	}

	w.finish(log, res, calls, transcript, start)
	if cl != nil {
		res.Cost.Repeats = cl.repeats
	}
	return res, nil
}

// readMail parses the mail into res's sender, subject and message id;
// what is wrong with the mail (over the size limit, broken MIME) becomes
// a problem, never an error.
func (w *Worker) readMail(m source.Mail, res *Result, problem func(msg string, attrs ...any)) *mail.Message {
	if m.HeaderOnly {
		problem(fmt.Sprintf("mail is %d bytes, over the %d-byte limit: judged from its headers only", m.Size, w.o.MaxMessageBytes))
	}

	msg, err := parseMail(m.Raw, w.o.MaxAudioBytes)
	if err != nil {
		problem("unreadable mail, judged on what could be read: "+err.Error(), "err", err)
	}
	for _, p := range msg.Problems {
		problem("mail: " + p)
	}
	res.MessageID = clean(msg.MessageID, 200)
	res.From = formatAddr(msg.From)
	if msg.FromCount > 1 {
		shown := []string{res.From}
		for _, a := range msg.FromOthers {
			shown = append(shown, formatAddr(a))
		}
		res.From = clean(strings.Join(shown, ", "), 600)
		problem(fmt.Sprintf("From lists %d addresses (%s): the first is treated as the sender, and no sender rule trusts a multi-address From", msg.FromCount, res.From))
	}
	res.Subject = clean(msg.Subject, 300)
	return msg
}

// classify asks the model about the mail (with the transcript) and puts
// its judgement in res; a reply that stayed invalid makes the mail
// unclassified at the important threshold. An error (the endpoint failed,
// ctx ended) leaves the mail for the next poll. calls are the model
// requests made, for the cost.
func (w *Worker) classify(ctx context.Context, log *slog.Logger, key string, msg *mail.Message, transcript string, res *Result, cl *callLog) (calls []localUsage, err error) {
	var (
		cls  llm.Classification
		cerr error
	)
	if rec := cl.done(callClassification, ""); rec != nil {
		log.Info("triage: reusing the classification an earlier run paid for", "calls", len(rec.Usages))
		calls = fromCallUsages(rec.Usages)
		if rec.Classification != nil {
			cls = *rec.Classification
		} else {
			cerr = &llm.UnclassifiedError{Reason: rec.Unclassified}
		}
	} else {
		var rerr error
		if calls, cls, cerr, rerr = w.callClassifier(ctx, msg, transcript, cl); rerr != nil {
			return nil, rerr
		}
	}
	var unc *llm.UnclassifiedError
	switch {
	case errors.As(cerr, &unc):
		res.Class = ClassUnclassified
		res.Unclassified = clean(unc.Reason, 500)
		// Nobody judged this mail: it goes where people look first
		// (unless a rule below knows better).
		res.Importance = w.o.Threshold
		res.Rule = RuleUnclassified
		log.Warn("triage: the model's reply stayed invalid after a retry; posting the mail as unclassified", "reason", res.Unclassified)
	case cerr != nil:
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, &retryError{what: "classify " + key, err: cerr}
	default:
		res.Class = cls.ContactType
		res.Real = cls.IsRealConversation
		res.ModelImportance = cls.Importance
		res.Importance = cls.Importance
		res.Reasoning = clean(cls.Reasoning, 1000)
	}
	return calls, nil
}

// callClassifier makes the classification call, recorded in cl before it
// starts and, with its result and cost, before the result is used. cerr is
// the classifier's error; rerr a failure to record the call (the mail is
// retried).
func (w *Worker) callClassifier(ctx context.Context, msg *mail.Message, transcript string, cl *callLog) (calls []localUsage, cls llm.Classification, cerr, rerr error) {
	in := llm.Input{
		From:       msg.From.Addr,
		To:         addrsOf(msg.To),
		Subject:    msg.Subject,
		Body:       truncateBytes(msg.BodyText(), maxBodyBytes),
		Transcript: truncateBytes(transcript, maxTranscriptBytes),
	}
	if err := cl.start(callClassification, ""); err != nil {
		return nil, cls, nil, err
	}
	var usages []llm.Usage
	watts, measured := w.measure(ctx, w.o.ClassifierLocal, func() {
		cls, usages, cerr = w.o.Classifier.Classify(ctx, in)
	})
	for _, u := range usages {
		if u.Kind == "" {
			u.Kind = "classification"
		}
		calls = append(calls, localUsage{Usage: u, Local: w.o.ClassifierLocal, Watts: watts, Power: measured})
	}
	rec := CallRecord{Kind: callClassification}
	var unc *llm.UnclassifiedError
	switch {
	case errors.As(cerr, &unc):
		rec.Unclassified = unc.Reason
	case cerr != nil:
		// No reply to reuse: a later run makes the call afresh.
		cl.abandon(callClassification, "")
		return nil, cls, cerr, nil
	default:
		rec.Classification = &cls
	}
	if err := cl.finish(rec, calls); err != nil {
		return nil, cls, nil, err
	}
	return calls, cls, cerr, nil
}

// applyRules lets the configured rules override the model's importance
// (code decides what code can decide) and settles res.Important. internal
// says the sender is internal (no CRM lookup).
func (w *Worker) applyRules(msg *mail.Message, res *Result) (internal bool) {
	// Code decides what code can decide.
	rr := w.o.Rules.apply(msg)
	if rr.Rule != "" {
		res.Importance = rr.Importance
		res.Rule = rr.Rule
	}
	res.Important = res.Importance >= w.o.Threshold
	return rr.Internal
}

// findUnsubscribe looks for a way to unsubscribe from a list mail, and in
// the HTML of a promotional or other one.
func findUnsubscribe(msg *mail.Message, res *Result) {
	if msg.ListUnsubscribe != "" || res.Class == "promotional" || res.Class == "other" {
		html := ""
		if res.Class == "promotional" || res.Class == "other" {
			html = msg.HTML
		}
		res.Unsubscribe = unsubscribe.Find(msg.ListUnsubscribe, msg.ListUnsubscribePost, html)
	}
}

// lookupCustomer finds the sender in the CRM for res.Customer. A failed
// lookup is a problem; only ctx ending is an error.
func (w *Worker) lookupCustomer(ctx context.Context, addr string, res *Result, problem func(msg string, attrs ...any)) error {
	cctx, cancel := context.WithTimeout(ctx, w.o.CallTimeout)
	c, err := w.o.Customers.Find(cctx, addr)
	cancel()
	switch {
	case err != nil && ctx.Err() != nil:
		return ctx.Err()
	case err != nil:
		// The CRM being down must not hold the mail back.
		problem("customer lookup failed: "+err.Error(), "err", err)
	case c != nil:
		res.Customer = c
	}
	return nil
}

// finish prices the calls, builds the post, and records and logs the
// judged mail.
func (w *Worker) finish(log *slog.Logger, res *Result, calls []localUsage, transcript string, start time.Time) {
	res.Cost = w.price(calls)
	res.Post = w.post(res, transcript)
	res.Text = sink.Text(res.Post)
	res.DurationMS = float64(time.Since(start).Microseconds()) / 1000
	w.metrics.observe(res)
	log.Info("triage: mail judged",
		"class", res.Class, "importance", res.Importance, "rule", res.Rule, "important", res.Important,
		"customer", res.Customer != nil, "unsubscribe", res.Unsubscribe.Source,
		slog.Group("cost",
			"total", FormatMoney(res.Cost.Total, res.Cost.Currency), "currency", res.Cost.Currency,
			"classification", FormatMoney(res.Cost.Classification, res.Cost.Currency),
			"transcription", FormatMoney(res.Cost.Transcription, res.Cost.Currency),
			"energy", FormatMoney(res.Cost.Energy, res.Cost.Currency), "energy_wh", res.Cost.EnergyWh,
			"prompt_tokens", res.Cost.PromptTokens, "completion_tokens", res.Cost.CompletionTokens,
			"audio_seconds", res.Cost.AudioSeconds),
		"problems", len(res.Problems), "duration_ms", res.DurationMS)
}

// parseMail never returns nil: a mail that cannot be parsed at all is
// still triaged (and posted) from what little is known.
func parseMail(raw []byte, maxAttachment int64) (msg *mail.Message, err error) {
	defer func() {
		// mail.Parse promises not to panic; a bug there must still not
		// cost the mail or the worker.
		if r := recover(); r != nil {
			msg, err = &mail.Message{}, fmt.Errorf("MIME parser panicked: %v", r)
		}
	}()
	msg, err = mail.Parse(raw, mail.Limits{MaxAttachmentBytes: maxAttachment})
	if msg == nil {
		msg = &mail.Message{}
	}
	if err != nil {
		err = fmt.Errorf("parse MIME: %w", err)
	}
	return msg, err
}

// transcribe runs the mail's audio attachments through the transcriber,
// at most MaxTranscriptions of them and until MaxAudioSeconds are reached;
// the note names the ones left out. Only ctx ending (or a call that could
// not be recorded) is an error; every other failure becomes the note.
func (w *Worker) transcribe(ctx context.Context, log *slog.Logger, msg *mail.Message, res *Result, cl *callLog) (text, note string, calls []localUsage, err error) {
	var texts, notes, skipped []string
	// Audio the parser did not keep (over its limit) is not in Audio();
	// the post still has to say why there is no transcript.
	for _, a := range msg.Attachments {
		if a.Truncated && a.IsAudio() {
			n := fmt.Sprintf("%s: %d bytes, over the %d-byte transcription limit; not transcribed", displayName(a), a.Size, w.o.MaxAudioBytes)
			notes = append(notes, n)
			log.Warn("triage: "+n, "attachment", displayName(a))
		}
	}
	audio := msg.Audio()
	made, seconds := 0, 0.0
	for i, a := range audio {
		name := displayName(a)
		switch {
		case w.o.Transcriber == nil:
			notes = append(notes, name+": transcription is disabled")
			continue
		case a.Truncated || a.Data == nil || int64(len(a.Data)) > w.o.MaxAudioBytes:
			n := fmt.Sprintf("%s: %d bytes, over the %d-byte transcription limit; not transcribed", name, a.Size, w.o.MaxAudioBytes)
			notes = append(notes, n)
			log.Warn("triage: "+n, "attachment", name)
			continue
		case made >= w.o.MaxTranscriptions || seconds >= w.o.MaxAudioSeconds:
			skipped = append(skipped, name)
			continue
		}
		made++
		u, tr, failed, err := w.transcribeOne(ctx, log, a, name, strconv.Itoa(i)+":"+name, cl)
		if err != nil {
			return "", "", nil, err
		}
		if failed != "" {
			notes = append(notes, failed)
			continue
		}
		calls = append(calls, u)
		seconds += u.AudioSeconds
		res.Transcribed = append(res.Transcribed, name)
		if len(audio) > 1 {
			texts = append(texts, "["+name+"] "+tr)
		} else {
			texts = append(texts, tr)
		}
	}
	if len(skipped) > 0 {
		n := fmt.Sprintf("%d audio attachment(s) not transcribed, over the per-mail limit of %d transcriptions or %.0f s of audio (%d made, %.0f s): %s",
			len(skipped), w.o.MaxTranscriptions, w.o.MaxAudioSeconds, made, seconds, nameList(skipped, 10))
		notes = append(notes, n)
		log.Warn("triage: "+n, "skipped", len(skipped))
	}
	return strings.Join(texts, "\n"), strings.Join(notes, "; "), calls, nil
}

// nameList joins the first max names and says how many more there are.
func nameList(names []string, max int) string {
	if len(names) <= max {
		return strings.Join(names, ", ")
	}
	return strings.Join(names[:max], ", ") + fmt.Sprintf(" and %d more", len(names)-max)
}

// transcribeOne transcribes one attachment, or reuses the transcript an
// earlier run recorded for it (part names it in cl). failed is the note of
// a transcription that failed; err only a failure to record the call or
// ctx ending.
func (w *Worker) transcribeOne(ctx context.Context, log *slog.Logger, a mail.Attachment, name, part string, cl *callLog) (u localUsage, text, failed string, err error) {
	if rec := cl.done(callTranscription, part); rec != nil {
		log.Info("triage: reusing the transcript an earlier run paid for", "attachment", name)
		if rec.Failed != "" || len(rec.Usages) == 0 {
			return u, "", rec.Failed, nil
		}
		return fromCallUsages(rec.Usages)[0], rec.Transcript, "", nil
	}
	if err := cl.start(callTranscription, part); err != nil {
		return u, "", "", err
	}
	var (
		tr  llm.Transcript
		lu  llm.Usage
		ter error
	)
	watts, measured := w.measure(ctx, w.o.TranscriberLocal, func() {
		tr, lu, ter = w.o.Transcriber.Transcribe(ctx, a.Filename, a.Data)
	})
	if ter != nil {
		if ctx.Err() != nil {
			cl.abandon(callTranscription, part)
			return u, "", "", ctx.Err()
		}
		failed = fmt.Sprintf("%s: transcription failed: %v", name, ter)
		log.Warn("triage: transcription failed; the mail goes on without it", "attachment", name, "err", ter)
		return u, "", failed, cl.finish(CallRecord{Kind: callTranscription, Part: part, Failed: failed}, nil)
	}
	if lu.Kind == "" {
		lu.Kind = "transcription"
	}
	if lu.AudioSeconds == 0 {
		lu.AudioSeconds = tr.Seconds
	}
	u = localUsage{Usage: lu, Local: w.o.TranscriberLocal, Watts: watts, Power: measured}
	if err := cl.finish(CallRecord{Kind: callTranscription, Part: part, Transcript: tr.Text}, []localUsage{u}); err != nil {
		return u, "", "", err
	}
	return u, tr.Text, "", nil
}

func displayName(a mail.Attachment) string {
	if name := clean(a.Filename, 100); name != "" {
		return name
	}
	return "(unnamed " + clean(a.ContentType, 60) + ")"
}

// post builds what the sinks get from a result.
func (w *Worker) post(res *Result, transcript string) sink.Post {
	p := sink.Post{
		Key:            res.Key,
		Important:      res.Important,
		From:           res.From,
		Subject:        res.Subject,
		Class:          res.Class,
		Unclassified:   res.Unclassified,
		Real:           res.Real,
		Importance:     res.Importance,
		Rule:           res.Rule,
		Reasoning:      res.Reasoning,
		Transcript:     excerpt(transcript, excerptRunes),
		TranscriptNote: res.TranscriptNote,
		Unsubscribe:    res.Unsubscribe.Best(),
		OneClick:       res.Unsubscribe.OneClick,
		Cost:           res.Cost.Footer(),
		Problems:       res.Problems,
	}
	if res.Customer != nil {
		p.CustomerName = clean(res.Customer.Name, 200)
		p.CustomerURL = res.Customer.URL
	}
	return p
}

// formatAddr shows the sender as the mail wrote it (Display); the
// normalised Addr only when that could not be read back.
func formatAddr(a mail.Address) string {
	shown := a.Display
	if shown == "" {
		shown = a.Addr
	}
	name, addr := clean(a.Name, 100), clean(shown, 254)
	switch {
	case name != "" && addr != "":
		return name + " <" + addr + ">"
	case addr != "":
		return addr
	case name != "":
		return name
	}
	return "(no sender)"
}

// clean makes outside text safe for one line of a post or a log
// (mail.CleanLine) and cuts it to max runes.
func clean(s string, max int) string {
	s = mail.CleanLine(s)
	if utf8.RuneCountInString(s) <= max {
		return s
	}
	r := []rune(s)
	return strings.TrimSpace(string(r[:max])) + "…"
}

// excerpt is the start of a transcript for the post, on one line.
func excerpt(s string, max int) string {
	return clean(s, max)
}

// truncateBytes cuts s to at most max bytes on a rune boundary.
func truncateBytes(s string, max int) string {
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}
