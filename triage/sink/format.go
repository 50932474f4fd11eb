package sink

import (
	"fmt"
	"net/url"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/slack-go/slack"
)

// Limits of the targets. Clipping counts UTF-16 code units, which is what
// Telegram counts and never less than the characters Slack counts, so one
// measure keeps both within bounds.
const (
	// TelegramMaxUnits is Telegram's limit on a message's text; longer
	// texts are refused with 400 "message is too long".
	TelegramMaxUnits = 4096
	// SlackTextLimit bounds the fallback `text` of a Slack message: Slack
	// truncates longer messages, and the blocks carry the full content.
	SlackTextLimit = 4000
	// Block Kit limits (https://docs.slack.dev/reference/block-kit/blocks).
	slackHeaderLimit  = 150
	slackSectionLimit = 3000
	slackFieldLimit   = 2000
	slackContextLimit = 2000
	slackMaxFields    = 10
	// maxURLUnits bounds a URL shown as text. maxLinkUnits bounds one
	// escaped <url|label> construct: a longer one is shown as text, not
	// linked, so two links always fit a section and a clip can never cut a
	// link in half.
	maxURLUnits  = 1500
	maxLinkUnits = 1400
)

// Per-field clips, so that one huge field (a 50 kB transcript) cannot push
// the others out of a message.
const (
	clipLine       = 300
	clipRule       = 200
	clipReasoning  = 1500
	clipTranscript = 1500
	clipNote       = 500
	clipProblem    = 300
	maxProblems    = 10
	clipKey        = 500
)

// MetadataEventType is the event_type of the Slack message metadata every
// triage post carries; its event_payload holds "key" (Post.Key) and
// "important" (Post.Important), which is how Posted finds a post again.
const MetadataEventType = "gpuhost_triage"

// keyPrefix starts the footer line that carries the key in the text and in
// the Slack context block, the fallback Posted uses when metadata is absent.
const keyPrefix = "key: "

// Text is the human text of a post: the Telegram message (sent as plain
// text, no parse mode, so nothing in a mail can become markup) and, escaped
// for mrkdwn, the fallback text of the Slack message. It is at most
// TelegramMaxUnits UTF-16 units and always ends with the cost footer and the
// "key: …" line, which survive any clipping of the body above them.
func Text(p Post) string {
	return render(p, TelegramMaxUnits, func(s string) string { return s })
}

// alertLine is an operator alert as both chats show it: one line (CR, LF,
// tab and other control characters become spaces, bidirectional overrides
// go, as in a post's one-line fields), so that an error text from a mail
// server can neither fake further lines nor carry a "key: …" line that the
// Slack history check could mistake for a post, clipped to limit UTF-16
// units after esc.
func alertLine(text string, limit int, esc func(string) string) string {
	return clipEscaped(esc(oneLine(text, limit)), limit)
}

// slackText is Text escaped for Slack mrkdwn and clipped to SlackTextLimit.
func slackText(p Post) string {
	return render(p, SlackTextLimit, EscapeMrkdwn)
}

// render builds the text with every piece passed through esc, the body
// clipped so that body, blank line and footer fit in limit units.
func render(p Post, limit int, esc func(string) string) string {
	var b strings.Builder
	line := func(s string) {
		b.WriteString(esc(s))
		b.WriteByte('\n')
	}
	line(headline(p))
	line("From: " + orDefault(oneLine(p.From, clipLine), "(unknown sender)"))
	line("Class: " + classText(p))
	line("Real conversation: " + yesNo(p.Real))
	line("Importance: " + importanceText(p))
	if c := customerText(p); c != "" {
		line("Customer: " + c)
	}
	if u := oneLine(p.Unsubscribe, maxURLUnits); u != "" {
		line("Unsubscribe: " + u + oneClickMark(p))
	}
	if r := multiLine(p.Reasoning, clipReasoning); r != "" {
		line("\nReasoning:\n" + r)
	}
	if t := transcriptText(p); t != "" {
		line("\n" + t)
	}
	if pr := problemsText(p, "- "); pr != "" {
		line("\nProblems:\n" + pr)
	}
	body := strings.TrimRight(b.String(), "\n")
	footer := esc(footerText(p))
	room := limit - utf16Len(footer) - 2 // "\n\n"
	body = clipEscaped(body, room)
	if body == "" {
		return clipEscaped(footer, limit)
	}
	return body + "\n\n" + footer
}

// SlackBlocks lays a post out in Block Kit: a header (the subject), a
// section of fields, sections for reasoning, transcript, links and problems,
// and a context footer with the cost and the "key: …" line.
//
// Everything that comes from a mail or a model is put in plain_text
// objects, which Slack never parses: mrkdwn can escape only & < > (so
// "<!channel>" cannot ping), not *, _, ~ or `, so a subject like "*bold*"
// would still format. The one mrkdwn object is the links section, built
// from our own labels and URLs escaped with EscapeMrkdwn; a URL that is not
// http(s) or mailto, or too long, is shown as plain text instead.
func SlackBlocks(p Post) []slack.Block {
	blocks := []slack.Block{
		slack.NewHeaderBlock(plain(headline(p), slackHeaderLimit)),
	}
	fields := []*slack.TextBlockObject{
		plain("From: "+orDefault(oneLine(p.From, clipLine), "(unknown sender)"), slackFieldLimit),
		plain("Class: "+classText(p), slackFieldLimit),
		plain("Real conversation: "+yesNo(p.Real), slackFieldLimit),
		plain("Importance: "+importanceText(p), slackFieldLimit),
	}
	if n := oneLine(p.CustomerName, clipLine); n != "" {
		fields = append(fields, plain("Customer: "+n, slackFieldLimit))
	}
	blocks = append(blocks, slack.NewSectionBlock(nil, fields[:min(len(fields), slackMaxFields)], nil))
	if r := multiLine(p.Reasoning, clipReasoning); r != "" {
		blocks = append(blocks, slack.NewSectionBlock(plain("Reasoning:\n"+r, slackSectionLimit), nil, nil))
	}
	if t := transcriptText(p); t != "" {
		blocks = append(blocks, slack.NewSectionBlock(plain(t, slackSectionLimit), nil, nil))
	}
	var links, unlinked []string
	if u := oneLine(p.Unsubscribe, maxURLUnits); u != "" {
		if l, ok := slackLink(u, "Unsubscribe"); ok {
			links = append(links, l+EscapeMrkdwn(oneClickMark(p)))
		} else {
			unlinked = append(unlinked, "Unsubscribe: "+u+oneClickMark(p))
		}
	}
	if u := oneLine(p.CustomerURL, maxURLUnits); u != "" {
		if l, ok := slackLink(u, "Customer profile"); ok {
			links = append(links, l)
		} else {
			unlinked = append(unlinked, "Customer profile: "+u)
		}
	}
	if len(links) > 0 {
		// Two links of at most maxLinkUnits each, a mark and a separator:
		// within slackSectionLimit.
		blocks = append(blocks, slack.NewSectionBlock(
			slack.NewTextBlockObject(slack.MarkdownType, strings.Join(links, "  ·  "), false, true), nil, nil))
	}
	if len(unlinked) > 0 {
		blocks = append(blocks, slack.NewSectionBlock(plain(strings.Join(unlinked, "\n"), slackSectionLimit), nil, nil))
	}
	if pr := problemsText(p, "• "); pr != "" {
		blocks = append(blocks, slack.NewSectionBlock(plain("Problems:\n"+pr, slackSectionLimit), nil, nil))
	}
	var footer []slack.MixedElement
	if c := oneLine(p.Cost, clipLine); c != "" {
		footer = append(footer, plain(c, slackContextLimit))
	}
	footer = append(footer, plain(keyPrefix+keyText(p.Key), slackContextLimit))
	blocks = append(blocks, slack.NewContextBlock("", footer...))
	return blocks
}

// slackMetadata is the message metadata of a post (see MetadataEventType).
func slackMetadata(p Post) slack.SlackMetadata {
	return slack.SlackMetadata{
		EventType:    MetadataEventType,
		EventPayload: map[string]any{"key": p.Key, "important": p.Important},
	}
}

// EscapeMrkdwn escapes the three characters Slack treats as control
// characters in mrkdwn (& < >), so that text cannot form links, mentions
// or "<!channel>". It cannot stop *bold* or _italic_: Slack has no escape
// for those, which is why SlackBlocks keeps mail content in plain_text.
func EscapeMrkdwn(s string) string {
	return mrkdwnEscaper.Replace(s)
}

var mrkdwnEscaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;")

// slackLink returns <url|label> for an http(s) or mailto URL short enough
// to be linked whole; ok is false for anything else.
func slackLink(raw, label string) (string, bool) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", false
	}
	switch strings.ToLower(u.Scheme) {
	case "http", "https":
		if u.Host == "" {
			return "", false
		}
	case "mailto":
		if u.Opaque == "" && u.Path == "" {
			return "", false
		}
	default:
		return "", false
	}
	// "|" would end the URL part early; everything else is escaped.
	target := strings.ReplaceAll(u.String(), "|", "%7C")
	link := "<" + EscapeMrkdwn(target) + "|" + EscapeMrkdwn(label) + ">"
	if utf16Len(link) > maxLinkUnits {
		return "", false
	}
	return link, true
}

// plain is a plain_text object clipped to limit, never empty (Slack
// refuses empty text), with emoji shortcodes left as typed.
func plain(s string, limit int) *slack.TextBlockObject {
	s = clipUnits(s, limit)
	if strings.TrimSpace(s) == "" {
		s = "-"
	}
	return slack.NewTextBlockObject(slack.PlainTextType, s, false, false)
}

func headline(p Post) string {
	mark := "📧 "
	if p.Important {
		mark = "❗ "
	}
	return mark + orDefault(oneLine(p.Subject, clipLine), "(no subject)")
}

// classText is the class, or "unclassified: <reason>".
func classText(p Post) string {
	class := oneLine(p.Class, clipLine)
	if class == "" || class == "unclassified" || p.Unclassified != "" {
		reason := oneLine(p.Unclassified, clipLine)
		if reason == "" {
			return "unclassified"
		}
		return "unclassified: " + reason
	}
	return class
}

// importanceText is "10 (rule: priority mailbox support@…)" or "6 (model)".
func importanceText(p Post) string {
	if r := oneLine(p.Rule, clipRule); r != "" {
		return fmt.Sprintf("%d (rule: %s)", p.Importance, r)
	}
	return fmt.Sprintf("%d (model)", p.Importance)
}

func customerText(p Post) string {
	name := oneLine(p.CustomerName, clipLine)
	link := oneLine(p.CustomerURL, maxURLUnits)
	switch {
	case name != "" && link != "":
		return name + " — " + link
	case name != "":
		return name
	default:
		return link
	}
}

func oneClickMark(p Post) string {
	if p.OneClick {
		return " (one-click)"
	}
	return ""
}

// transcriptText is the excerpt under a heading, with the note saying what
// was not transcribed (over the caps, failed, too large) when there is one.
func transcriptText(p Post) string {
	t := multiLine(p.Transcript, clipTranscript)
	n := oneLine(p.TranscriptNote, clipNote)
	switch {
	case t != "" && n != "":
		// The note first: a long excerpt must not push what was left out
		// past a block's limit.
		return "Transcript: " + n + "\n" + t
	case t != "":
		return "Transcript:\n" + t
	case n != "":
		return "Transcript: " + n
	}
	return ""
}

func problemsText(p Post, bullet string) string {
	var lines []string
	for _, pr := range p.Problems {
		if pr = oneLine(pr, clipProblem); pr == "" {
			continue
		}
		if len(lines) == maxProblems {
			lines = append(lines, fmt.Sprintf("%s… and %d more", bullet, countNonEmpty(p.Problems)-maxProblems))
			break
		}
		lines = append(lines, bullet+pr)
	}
	return strings.Join(lines, "\n")
}

func countNonEmpty(ss []string) int {
	n := 0
	for _, s := range ss {
		if oneLine(s, 1) != "" {
			n++
		}
	}
	return n
}

func footerText(p Post) string {
	if c := oneLine(p.Cost, clipLine); c != "" {
		return c + "\n" + keyPrefix + keyText(p.Key)
	}
	return keyPrefix + keyText(p.Key)
}

// keyText is the key as it appears in text: on one line, bounded. Posted
// compares against the same normalisation.
func keyText(key string) string {
	return orDefault(oneLine(key, clipKey), "-")
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// oneLine makes an outside string safe for a one-line field: valid UTF-8,
// every control character (CR, LF, tab, …) a space, no bidirectional
// overrides (which could make a line read differently than it is), spaces
// collapsed, clipped to n units.
func oneLine(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	var b strings.Builder
	space := false
	for _, r := range s {
		switch {
		case unicode.Is(unicode.Bidi_Control, r):
			continue
		case unicode.IsControl(r) || unicode.IsSpace(r):
			space = true
			continue
		}
		if space && b.Len() > 0 {
			b.WriteByte(' ')
		}
		space = false
		b.WriteRune(r)
	}
	return clipUnits(b.String(), n)
}

// multiLine is oneLine for text with line breaks: CRLF and CR become LF,
// other control characters a space, more than one blank line in a row one.
func multiLine(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.ReplaceAll(s, "\r\n", "\n")
	s = strings.ReplaceAll(s, "\r", "\n")
	lines := strings.Split(s, "\n")
	out := make([]string, 0, len(lines))
	blank := false
	for _, l := range lines {
		l = oneLine(l, len(l)+1)
		if l == "" {
			if !blank && len(out) > 0 {
				out = append(out, "")
			}
			blank = true
			continue
		}
		blank = false
		out = append(out, l)
	}
	return clipUnits(strings.TrimRight(strings.Join(out, "\n"), "\n"), n)
}

// clipUnits cuts s to at most n UTF-16 units at a rune boundary, ending a
// cut string with "…".
func clipUnits(s string, n int) string {
	if n <= 0 {
		return ""
	}
	if utf16Len(s) <= n {
		return s
	}
	limit := n - 1 // room for "…"
	used := 0
	for i, r := range s {
		w := runeUnits(r)
		if used+w > limit {
			return s[:i] + "…"
		}
		used += w
	}
	return s
}

// clipEscaped is clipUnits for text escaped with EscapeMrkdwn: a cut
// inside an entity ("&am") drops the partial entity. Text that was not
// escaped has no '&' that is not followed by ';' only by accident, and
// losing those few characters at a cut does no harm.
func clipEscaped(s string, n int) string {
	if utf16Len(s) <= n {
		return s
	}
	c := strings.TrimSuffix(clipUnits(s, n), "…")
	if i := strings.LastIndexByte(c, '&'); i >= 0 && !strings.Contains(c[i:], ";") && len(c)-i <= len("&amp;") {
		c = c[:i]
	}
	if n <= 0 {
		return ""
	}
	return c + "…"
}

func runeUnits(r rune) int {
	if w := utf16.RuneLen(r); w > 0 {
		return w
	}
	return 1
}

func utf16Len(s string) int {
	n := 0
	for len(s) > 0 {
		r, size := utf8.DecodeRuneInString(s)
		n += runeUnits(r)
		s = s[size:]
	}
	return n
}
