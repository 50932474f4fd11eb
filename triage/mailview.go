package triage

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"gpuhost/api"
	"gpuhost/triage/sink"
	"gpuhost/triage/source"
)

// The worker as the panel's Mail page reads it, in the plain types of
// package api, so the panel links nothing of triage (IMAP, the model
// client, the chat SDKs).

// MailStatus is the worker's poll, alert and checkpoint state.
func (w *Worker) MailStatus() api.MailStatus { return MailStatusOf(w.State()) }

// MailStatusOf is a Status as the Mail page shows it (the cost tally's
// amounts formatted in their currency).
func MailStatusOf(st Status) api.MailStatus {
	cp := st.Checkpoint
	out := api.MailStatus{
		Mailbox: st.Mailbox, LastPoll: st.LastPoll, LastPollOK: st.LastPollOK, LastError: st.LastError,
		ConsecutiveFailures: st.ConsecutiveFailures, Alerting: st.Alerting,
		FailingSince: st.FailingSince, LastAlert: st.LastAlert, LastAllClear: st.LastAllClear, Processed: st.Processed,
		UIDValidity: cp.UIDValidity, LastUID: cp.LastUID, Written: cp.Updated,
	}
	if in := cp.Inflight; in != nil {
		out.Inflight = &api.MailInflight{UID: in.UID, Since: in.Since, Posted: slices.Clone(in.Posted)}
	}
	for _, d := range cp.Costs {
		money := func(v float64) string { return FormatMoney(v, d.Currency) }
		out.Days = append(out.Days, api.MailDay{Day: d.Day, Mails: d.Mails, Total: money(d.Total),
			Model: money(d.Classification), Audio: money(d.Transcription), Energy: money(d.Energy), EnergyWh: d.EnergyWh,
			Calls: d.Calls, Repeats: d.Repeats})
	}
	return out
}

// MailPosts are the worker's last results, oldest first.
func (w *Worker) MailPosts() []api.MailPost {
	rs := w.Recent()
	out := make([]api.MailPost, 0, len(rs))
	for _, r := range rs {
		out = append(out, MailPostOf(r))
	}
	return out
}

// RerunMail is ProcessUID as the Mail page shows it.
func (w *Worker) RerunMail(ctx context.Context, uid uint32, dryRun bool) (api.MailPost, error) {
	return MailRerunOf(w.ProcessUID(ctx, uid, dryRun))
}

// MailRerunOf is ProcessUID's answer as the Mail page shows it: the result
// only when it was judged (also when a sink then refused it), and a UID
// the mailbox lacks as an api.ErrMailNotFound.
func MailRerunOf(r Result, err error) (api.MailPost, error) {
	if errors.Is(err, source.ErrNotFound) {
		err = fmt.Errorf("%w: %w", api.ErrMailNotFound, err)
	}
	if r.Key == "" {
		return api.MailPost{}, err
	}
	return MailPostOf(r), err
}

// MailPostOf is a result as the Mail page shows it; the post's text
// leaves the transcript excerpt out.
func MailPostOf(r Result) api.MailPost {
	post := r.Post
	p := api.MailPost{
		At: r.At, Key: r.Key, UID: r.UID, Manual: r.Manual, DryRun: r.DryRun,
		From: r.From, Subject: r.Subject, Class: r.Class, Unclassified: r.Unclassified,
		Importance: r.Importance, ModelImportance: r.ModelImportance, Rule: r.Rule, Important: r.Important,
		Overridden:     r.Rule != "" && r.Class != ClassUnclassified && r.ModelImportance != r.Importance,
		UnsubscribeURL: r.Unsubscribe.URL, UnsubscribeMailto: r.Unsubscribe.Mailto, OneClick: r.Unsubscribe.OneClick,
		Cost: FormatMoney(r.Cost.Total, r.Cost.Currency), CostDetail: r.Cost.Footer(),
		Posted: append(slices.Clone(r.AlreadyPosted), r.Posted...), Problems: len(r.Problems),
		TranscriptLeftOut: post.Transcript != "",
	}
	if c := r.Customer; c != nil {
		p.CustomerName, p.CustomerURL = c.Name, c.URL
		if p.CustomerName == "" {
			p.CustomerName = c.Email
		}
	}
	post.Transcript = ""
	p.Text = sink.Text(post)
	return p
}
