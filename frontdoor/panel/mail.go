package panel

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"gpuhost/api"
)

// Mail is the triage worker as the Mail page reads it (*triage.Worker
// implements it, in the wire types of package api, so the panel links
// nothing of triage: not the IMAP client, the model client or the chat
// SDKs): its poll, alert and checkpoint state, its recent results, and
// one mail run again by hand, as `gpuhost triage mail --uid N` does (with
// dryRun nothing is posted).
type Mail interface {
	MailStatus() api.MailStatus
	// MailPosts are the last results, oldest first.
	MailPosts() []api.MailPost
	// RerunMail runs mailbox UID uid through the pipeline again. A result
	// that was judged and then not posted comes back with the error (Key
	// set); a UID the mailbox lacks is an api.ErrMailNotFound.
	RerunMail(ctx context.Context, uid uint32, dryRun bool) (api.MailPost, error)
}

// Bounds of the Mail page.
const (
	// MailRerunTimeout bounds one "run this mail again": a classification
	// on the box's model plus the posts (each bounded by the worker's own
	// call timeout) fit well inside it, and a request must not hang on a
	// model that never answers.
	MailRerunTimeout = 2 * time.Minute
	// mailShown is how many recent results the page lists (the worker
	// keeps triage.Options.KeepResults, 100 by default).
	mailShown = 50
)

// mailState is what SetMail derives from a Mail: the source and the one
// slot for a rerun, so two clicks (or two operators) never run the
// pipeline twice at once; the second gets a clear "busy".
type mailState struct {
	src     Mail
	timeout time.Duration

	mu      sync.Mutex
	running bool
	uid     uint32    // the rerun in progress
	since   time.Time // when it started
}

// SetMail enables the Mail page; without it (or with nil) the page says
// that triage is off and how to turn it on. It may be called before or
// after Register: the daemon builds the triage worker after the panel.
func (p *Panel) SetMail(m Mail) {
	var st *mailState
	if m != nil {
		st = &mailState{src: m, timeout: MailRerunTimeout}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mail = st
}

func (p *Panel) mailState() *mailState {
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.mail
}

// errMailBusy is the answer to a rerun while another one runs.
var errMailBusy = errors.New("busy")

// rerun runs uid through the pipeline in the one slot, bounded by the
// timeout. The run is detached from the request: a real run that the
// browser leaves must not stop between two sinks, and the slot stays
// taken until the worker has returned (which a poll in progress can
// delay), so a rerun never overlaps one that timed out.
func (m *mailState) rerun(ctx context.Context, uid uint32, dryRun bool) (api.MailPost, error) {
	m.mu.Lock()
	if m.running {
		uid0, since := m.uid, m.since
		m.mu.Unlock()
		return api.MailPost{}, fmt.Errorf("%w: the rerun of UID %d started at %s is still running; try again when it has finished",
			errMailBusy, uid0, since.Format("15:04:05"))
	}
	m.running, m.uid, m.since = true, uid, time.Now()
	m.mu.Unlock()

	type outcome struct {
		res api.MailPost
		err error
	}
	done := make(chan outcome, 1)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.timeout)
	go func() {
		res, err := m.src.RerunMail(rctx, uid, dryRun)
		// The slot is free before the outcome is handed over: a client that
		// got its answer may ask for the next rerun at once.
		m.mu.Lock()
		m.running = false
		m.mu.Unlock()
		done <- outcome{res, err}
		cancel()
	}()
	timedOut := func(cause error) error {
		return fmt.Errorf("UID %d did not finish within %s (a poll in progress, a slow model or sink); it stops at its next step: %w",
			uid, m.timeout, cause)
	}
	finished := func(o outcome) (api.MailPost, error) {
		if o.err != nil && errors.Is(rctx.Err(), context.DeadlineExceeded) {
			return o.res, timedOut(o.err)
		}
		return o.res, o.err
	}
	select {
	case o := <-done:
		return finished(o)
	case <-rctx.Done():
		// rctx ends by its deadline or by the run's own cancel, which
		// comes after its outcome is sent.
		if !errors.Is(rctx.Err(), context.DeadlineExceeded) {
			return finished(<-done)
		}
		return api.MailPost{}, timedOut(context.DeadlineExceeded)
	case <-ctx.Done():
		return api.MailPost{}, ctx.Err()
	}
}

// mailView is the body of the Mail page.
type mailView struct {
	Disabled bool
	State    api.MailStatus
	Days     []dayRow
	Posts    []mailRow
	Form     rerunForm
	Rerun    *rerunView
	Notice   *noticeView
}

// rerunForm is what the "run again" form shows: the UID as typed and the
// dry-run box (checked unless the operator unchecked it).
type rerunForm struct {
	UID    string
	DryRun bool
}

// dayRow is one day of the cost tally, newest first.
type dayRow struct {
	api.MailDay
	Today bool
}

// mailRow is one recent result as the page lists it: no body, no
// transcript, links only when they are http(s).
type mailRow struct {
	api.MailPost
	// UnsubscribeURL replaces the post's with "" unless it is http(s);
	// UnsubscribeText is what there is otherwise (a mailto: address,
	// shown as text). CustomerURL likewise.
	UnsubscribeURL, UnsubscribeText string
	CustomerURL                     string
}

// rerunView is the outcome of one "run again": the judged post (zero when
// nothing was judged) and the error, if any. UID and DryRun are the form's
// (they shadow the post's, which say the same once it was judged).
type rerunView struct {
	api.MailPost
	UID    uint32
	DryRun bool
	Error  string
}

// httpLink returns s when it is an absolute http(s) URL with a host, else
// "": a link from a mail (unsubscribe) or the CRM must never become a
// javascript: or data: href, whatever html/template would make of it.
func httpLink(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return ""
	}
	return s
}

func mailRowOf(r api.MailPost) mailRow {
	row := mailRow{MailPost: r, UnsubscribeURL: httpLink(r.UnsubscribeURL), CustomerURL: httpLink(r.CustomerURL)}
	// A URL that is not http(s) is left out; a mailto: is shown as text.
	if row.UnsubscribeURL == "" {
		row.UnsubscribeText = r.UnsubscribeMailto
	}
	return row
}

// mailPage builds the page from the worker's state now.
func (p *Panel) mailPage(ms *mailState, form rerunForm) mailView {
	v := mailView{Form: form}
	if ms == nil {
		v.Disabled = true
		return v
	}
	v.State = ms.src.MailStatus()
	today := p.now().UTC().Format(time.DateOnly)
	for _, d := range slices.Backward(v.State.Days) {
		v.Days = append(v.Days, dayRow{MailDay: d, Today: d.Day == today})
	}
	recent := ms.src.MailPosts()
	for i := len(recent) - 1; i >= 0 && len(v.Posts) < mailShown; i-- {
		v.Posts = append(v.Posts, mailRowOf(recent[i]))
	}
	return v
}

func (p *Panel) handleMail(c echo.Context) error {
	form := rerunForm{DryRun: true}
	if q := c.QueryParam("uid"); q != "" {
		if _, err := parseUID(q); err == nil {
			form.UID = q // a link from a listed mail prefills the form
		}
	}
	return p.renderMail(c, http.StatusOK, p.mailPage(p.mailState(), form))
}

func (p *Panel) renderMail(c echo.Context, code int, v mailView) error {
	return p.render(c, code, "mail", p.pageData(c, "mail", "Mail", v))
}

// parseUID reads the form's UID: a mailbox UID is a positive 32-bit
// integer (RFC 3501).
func parseUID(s string) (uint32, error) {
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 32)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("uid must be a positive integer (a mailbox UID, 1 to %d), not %q", uint32(1<<32-1), s)
	}
	return uint32(n), nil
}

// formDryRun reads the dry-run checkbox. The form sends a hidden
// dry_run=0 before the checkbox's dry_run=1, so an unchecked box sends
// "0" alone; anything else — the box checked, or a POST without the field
// at all — is a dry run: only an explicit choice posts to the team.
func formDryRun(values []string) bool {
	return !(slices.Contains(values, "0") && !slices.Contains(values, "1"))
}

// handleMailRerun is POST /mail/rerun (session and CSRF checked by the
// guard): one mail of the mailbox through the pipeline again, shown on
// the Mail page with what was judged, or why not.
func (p *Panel) handleMailRerun(c echo.Context) error {
	ms := p.mailState()
	form := rerunForm{UID: c.FormValue("uid"), DryRun: true}
	if f, err := c.FormParams(); err == nil {
		form.DryRun = formDryRun(f["dry_run"])
	}
	v := p.mailPage(ms, form)
	if ms == nil {
		v.Notice = &noticeView{Kind: "error", Message: "Mail triage is off in this daemon; there is no mail to run again."}
		return p.renderMail(c, http.StatusNotFound, v)
	}
	uid, err := parseUID(form.UID)
	if err != nil {
		v.Notice = &noticeView{Kind: "error", Message: "Not run: " + err.Error()}
		return p.renderMail(c, http.StatusBadRequest, v)
	}
	log := p.log.With("uid", uid, "dry_run", form.DryRun, "remote", c.RealIP())
	log.Info("mail rerun requested from the panel")
	res, err := ms.rerun(c.Request().Context(), uid, form.DryRun)
	code := http.StatusOK
	switch {
	case errors.Is(err, errMailBusy):
		code = http.StatusConflict
	case errors.Is(err, api.ErrMailNotFound):
		code = http.StatusNotFound
	case errors.Is(err, context.DeadlineExceeded):
		code = http.StatusGatewayTimeout
	case err != nil:
		code = http.StatusBadGateway
	}
	if err != nil {
		log.Warn("mail rerun from the panel failed", "err", err)
		// res is the judged post when a sink refused it after judging, else zero.
		v.Rerun = &rerunView{MailPost: res, UID: uid, DryRun: form.DryRun, Error: err.Error()}
		return p.renderMail(c, code, v)
	}
	log.Info("mail rerun from the panel done", "class", res.Class, "importance", res.Importance, "posted", res.Posted)
	v = p.mailPage(ms, form) // the rerun is now among the recent results
	v.Rerun = &rerunView{MailPost: res, UID: uid, DryRun: form.DryRun}
	return p.renderMail(c, code, v)
}
