package sink

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/slack-go/slack"
)

// Slack defaults.
const (
	// DefaultSlackAPIURL is Slack's Web API base.
	DefaultSlackAPIURL = "https://slack.com/api/"
	// DefaultSlackTimeout bounds one Web API call.
	DefaultSlackTimeout = 30 * time.Second
	// DefaultHistoryMessages is how far back Posted looks: the crash it
	// covers happened moments ago, so the post is among the newest.
	DefaultHistoryMessages = 200
	// historyPage is the page size of conversations.history (Slack
	// recommends no more than 200).
	historyPage = 100
	// maxPartial bounds the keys remembered between Posted and Post.
	maxPartial = 1000
)

// SlackOptions configures the Slack sink.
type SlackOptions struct {
	// Token returns the bot token (xoxb-…). It is called for every Post and
	// Posted, so a rotated token is picked up without a restart; its error
	// for a missing token must name where the token is looked for (the
	// environment variable), since the sink does not know.
	Token func() (string, error)
	// TokenSource says where the token comes from ("environment variable
	// SLACK_BOT_TOKEN"), for the error when Slack refuses it. Optional.
	TokenSource string
	// APIURL is the Web API base (default DefaultSlackAPIURL); tests point
	// it at slacktest. A missing trailing "/" is added.
	APIURL string
	// Channel gets every post (an ID like C0123 or a name like #triage).
	Channel string
	// ImportantChannel also gets posts with Important set; "" = none.
	ImportantChannel string
	// HTTPClient is used for every call; nil means a plain client (each
	// call is bounded by Timeout through its context).
	HTTPClient *http.Client
	// Timeout bounds one Web API call (default DefaultSlackTimeout).
	Timeout time.Duration
	// HistoryMessages is how many of Channel's newest messages Posted
	// reads (default DefaultHistoryMessages).
	HistoryMessages int
	// Log gets warnings (rate limits); nil means slog.Default().
	Log *slog.Logger
}

// Slack posts triage results with chat.postMessage: Block Kit blocks, the
// plain text as fallback and message metadata carrying the post's key. It
// implements Sink and Checker.
//
// Ordering and crash recovery: Post writes to Channel first, then to
// ImportantChannel. Posted looks in Channel; when it finds the post and the
// post's metadata says it was important, it also looks in ImportantChannel.
// If the main post is there but the important copy is missing (a crash or
// an error between the two), Posted answers false and remembers the key, and
// the following Post for that key only posts the missing important copy. So
// the worker's protocol is simply: for a mail whose in-flight marker is set,
// call Posted; on false call Post; on true skip the Slack post. Neither
// channel gets a post twice and none is lost, as long as the post is among
// the newest HistoryMessages of Channel.
type Slack struct {
	o       SlackOptions
	apiURL  string
	hc      *http.Client
	timeout time.Duration
	history int
	log     *slog.Logger

	mu sync.Mutex
	// partial holds keys whose main post exists but whose important copy
	// does not: Post skips the main channel for them.
	partial map[string]bool
}

var (
	_ Sink    = (*Slack)(nil)
	_ Checker = (*Slack)(nil)
)

// NewSlack checks the options; it makes no network call and does not read
// the token yet.
func NewSlack(o SlackOptions) (*Slack, error) {
	if o.Token == nil {
		return nil, errors.New("slack sink: no token source (SlackOptions.Token is nil)")
	}
	o.Channel = strings.TrimSpace(o.Channel)
	o.ImportantChannel = strings.TrimSpace(o.ImportantChannel)
	if o.Channel == "" {
		return nil, errors.New("slack sink: no channel (set triage.slack.channel)")
	}
	apiURL := strings.TrimSpace(o.APIURL)
	if apiURL == "" {
		apiURL = DefaultSlackAPIURL
	}
	u, err := url.Parse(apiURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("slack sink: API URL %q (triage.slack.api_url) is not an http(s) URL", apiURL)
	}
	if !strings.HasSuffix(apiURL, "/") {
		apiURL += "/" // slack-go appends the method name
	}
	s := &Slack{
		o: o, apiURL: apiURL, hc: o.HTTPClient,
		timeout: o.Timeout, history: o.HistoryMessages, log: o.Log,
		partial: map[string]bool{},
	}
	if s.hc == nil {
		s.hc = &http.Client{}
	}
	if s.timeout <= 0 {
		s.timeout = DefaultSlackTimeout
	}
	if s.history <= 0 {
		s.history = DefaultHistoryMessages
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.log = s.log.With("sink", "slack")
	return s, nil
}

// Name is "slack".
func (s *Slack) Name() string { return "slack" }

// client reads the token and returns a Web API client for this call.
func (s *Slack) client() (*slack.Client, string, error) {
	tok, err := s.o.Token()
	if err != nil {
		return nil, "", fmt.Errorf("slack: read the bot token: %w", err)
	}
	tok = strings.TrimSpace(tok)
	if tok == "" {
		return nil, "", fmt.Errorf("slack: the bot token is empty%s", s.from())
	}
	return slack.New(tok, slack.OptionAPIURL(s.apiURL), slack.OptionHTTPClient(s.hc)), tok, nil
}

func (s *Slack) from() string {
	if s.o.TokenSource == "" {
		return ""
	}
	return " (" + s.o.TokenSource + ")"
}

// Post sends p to Channel and, when p.Important and ImportantChannel is
// set, to ImportantChannel (see Slack for the order and what a retry does).
// Link unfurling is off: Slack fetching an unsubscribe link to preview it
// could unsubscribe.
func (s *Slack) Post(ctx context.Context, p Post) error {
	c, tok, err := s.client()
	if err != nil {
		return err
	}
	opts := []slack.MsgOption{
		slack.MsgOptionText(slackText(p), false),
		slack.MsgOptionBlocks(SlackBlocks(p)...),
		slack.MsgOptionMetadata(slackMetadata(p)),
		slack.MsgOptionDisableMarkdown(), // the fallback text is plain
		slack.MsgOptionDisableLinkUnfurl(),
		slack.MsgOptionDisableMediaUnfurl(),
	}
	if !s.isPartial(p.Key) {
		if err := s.post(ctx, c, tok, s.o.Channel, p.Key, opts); err != nil {
			return err
		}
	}
	if p.Important && s.o.ImportantChannel != "" && s.o.ImportantChannel != s.o.Channel {
		if err := s.post(ctx, c, tok, s.o.ImportantChannel, p.Key, opts); err != nil {
			s.setPartial(p.Key, true)
			return fmt.Errorf("%w (the post is in %s; a retry posts only the important copy)", err, s.o.Channel)
		}
	}
	s.setPartial(p.Key, false)
	return nil
}

// Alert sends an operator alert (poll failures, their reminder, the
// all-clear, a UIDVALIDITY re-baseline; see triage.Alerter) as a plain
// chat.postMessage to Channel and, when it is set and different, to
// ImportantChannel, since the people who watch the important channel are
// the ones who must hear that no mail is being triaged. The text is one
// line, escaped for mrkdwn (so an error text cannot ping "<!channel>"),
// clipped to SlackTextLimit, without blocks or metadata (Posted never
// takes an alert for a post), mrkdwn and unfurling off.
//
// Both channels are tried even when the first fails: an alert that
// reached one channel has reached someone, so that is success, and the
// failed channel is logged; returning an error there would make the worker
// send the alert again to the channel that has it. Only when no channel
// got it is the error (naming the channels, never the token) returned.
// The worker itself uses AlertTo, to tell the channels apart.
func (s *Slack) Alert(ctx context.Context, text string) error {
	channels := s.AlertChannels()
	took, err := s.AlertTo(ctx, text, channels)
	switch {
	case err == nil:
		return nil
	case len(took) > 0:
		s.log.Error("slack: the alert reached only some channels", "err", err)
		return nil
	default:
		return err
	}
}

// AlertChannels are the channels an alert goes to: Channel and, when set
// and different, ImportantChannel.
func (s *Slack) AlertChannels() []string {
	channels := []string{s.o.Channel}
	if s.o.ImportantChannel != "" && s.o.ImportantChannel != s.o.Channel {
		channels = append(channels, s.o.ImportantChannel)
	}
	return channels
}

// AlertTo posts the alert to each of channels and returns those that took
// it; the error joins the refusals (each naming its channel).
func (s *Slack) AlertTo(ctx context.Context, text string, channels []string) (took []string, err error) {
	msg := alertLine(text, SlackTextLimit, EscapeMrkdwn)
	if strings.TrimSpace(msg) == "" {
		return nil, errors.New("slack: the alert text is empty; nothing sent")
	}
	c, tok, err := s.client()
	if err != nil {
		return nil, err
	}
	opts := []slack.MsgOption{
		slack.MsgOptionText(msg, false),
		slack.MsgOptionDisableMarkdown(),
		slack.MsgOptionDisableLinkUnfurl(),
		slack.MsgOptionDisableMediaUnfurl(),
	}
	var errs []error
	for _, ch := range channels {
		if err := s.post(ctx, c, tok, ch, "an alert", opts); err != nil {
			errs = append(errs, err)
			continue
		}
		took = append(took, ch)
	}
	return took, errors.Join(errs...)
}

func (s *Slack) post(ctx context.Context, c *slack.Client, tok, channel, key string, opts []slack.MsgOption) error {
	err := s.withRetry(ctx, "chat.postMessage", func(ctx context.Context) error {
		_, _, err := c.PostMessageContext(ctx, channel, opts...)
		return err
	})
	if err != nil {
		return scrub(fmt.Errorf("slack: post %s to channel %s: %w%s", key, channel, err, s.hint(err)), tok)
	}
	return nil
}

// Posted reports whether the post with this key is complete in Slack: in
// Channel, and in ImportantChannel too when it was important (see Slack).
func (s *Slack) Posted(ctx context.Context, key string) (bool, error) {
	c, tok, err := s.client()
	if err != nil {
		return false, err
	}
	m, found, err := s.find(ctx, c, tok, s.o.Channel, key)
	if err != nil || !found {
		s.setPartial(key, false)
		return false, err
	}
	important, _ := m.Metadata.EventPayload["important"].(bool)
	if !important || s.o.ImportantChannel == "" || s.o.ImportantChannel == s.o.Channel {
		return true, nil
	}
	_, found, err = s.find(ctx, c, tok, s.o.ImportantChannel, key)
	if err != nil {
		return false, err
	}
	if !found {
		s.log.Warn("triage post is in the main channel but not in the important channel; the next post completes it",
			"key", key, "channel", s.o.Channel, "important_channel", s.o.ImportantChannel)
		s.setPartial(key, true)
		return false, nil
	}
	return true, nil
}

// find reads the newest s.history messages of channel, page by page, for
// one carrying key.
func (s *Slack) find(ctx context.Context, c *slack.Client, tok, channel, key string) (slack.Message, bool, error) {
	cursor := ""
	for seen := 0; seen < s.history; {
		params := &slack.GetConversationHistoryParameters{
			ChannelID:          channel,
			Cursor:             cursor,
			Limit:              min(historyPage, s.history-seen),
			IncludeAllMetadata: true,
		}
		var resp *slack.GetConversationHistoryResponse
		err := s.withRetry(ctx, "conversations.history", func(ctx context.Context) error {
			var err error
			resp, err = c.GetConversationHistoryContext(ctx, params)
			return err
		})
		if err != nil {
			return slack.Message{}, false, scrub(fmt.Errorf("slack: read the history of channel %s (looking for %s): %w%s", channel, key, err, s.hint(err)), tok)
		}
		for _, m := range resp.Messages {
			if hasKey(m, key) {
				return m, true, nil
			}
		}
		seen += len(resp.Messages)
		cursor = resp.ResponseMetaData.NextCursor
		if cursor == "" || len(resp.Messages) == 0 {
			break
		}
	}
	return slack.Message{}, false, nil
}

// hasKey reports whether m is the post of key: by its metadata, or by a
// "key: …" line in its text or in a block (for a post whose metadata was
// dropped, say by a workspace policy).
func hasKey(m slack.Message, key string) bool {
	if m.Metadata.EventType == MetadataEventType {
		if k, ok := m.Metadata.EventPayload["key"].(string); ok && k == key {
			return true
		}
	}
	want := keyPrefix + keyText(key)
	wantEsc := EscapeMrkdwn(want)
	hasLine := func(text string) bool {
		for _, l := range strings.Split(text, "\n") {
			if l = strings.TrimSpace(l); l == want || l == wantEsc {
				return true
			}
		}
		return false
	}
	if hasLine(m.Text) {
		return true
	}
	for _, b := range m.Blocks.BlockSet {
		cb, ok := b.(*slack.ContextBlock)
		if !ok {
			continue
		}
		for _, e := range cb.ContextElements.Elements {
			if t, ok := e.(*slack.TextBlockObject); ok && hasLine(t.Text) {
				return true
			}
		}
	}
	return false
}

// withRetry runs one Web API call under the per-call timeout; when Slack
// answers 429, it waits Retry-After (bounded by ctx) and tries once more.
func (s *Slack) withRetry(ctx context.Context, method string, call func(context.Context) error) error {
	for attempt := 0; ; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, s.timeout)
		err := call(cctx)
		cancel()
		var rl *slack.RateLimitedError
		if err == nil || attempt > 0 || !errors.As(err, &rl) {
			return err
		}
		s.log.Warn("slack rate limit; retrying once", "method", method, "retry_after", rl.RetryAfter)
		if werr := waitRetry(ctx, rl.RetryAfter); werr != nil {
			return fmt.Errorf("%w (%w)", err, werr)
		}
	}
}

// hint explains the Slack errors an operator can fix.
func (s *Slack) hint(err error) string {
	var se slack.SlackErrorResponse
	if !errors.As(err, &se) {
		return ""
	}
	switch se.Err {
	case "invalid_auth", "not_authed", "token_revoked", "token_expired", "account_inactive":
		return " (Slack refuses the bot token" + s.from() + ")"
	case "channel_not_found":
		return " (no such channel, or the bot cannot see it: check the channel ID and invite the bot)"
	case "not_in_channel":
		return " (invite the bot to the channel)"
	case "missing_scope":
		if se.Needed != "" {
			return " (the bot token lacks the scope " + se.Needed + ")"
		}
		return " (the bot token lacks a scope: chat:write for posting, channels:history/groups:history for the history check)"
	}
	return ""
}

func (s *Slack) isPartial(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.partial[key]
}

func (s *Slack) setPartial(key string, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !on {
		delete(s.partial, key)
		return
	}
	if len(s.partial) >= maxPartial {
		// Only a worker that never calls Post after Posted gets here; a
		// forgotten key at worst re-posts the main copy.
		clear(s.partial)
	}
	s.partial[key] = true
}
