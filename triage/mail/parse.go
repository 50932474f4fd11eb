package mail

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	netmail "net/mail"
	"path"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/emersion/go-message"
	"github.com/emersion/go-message/charset"
	gomail "github.com/emersion/go-message/mail"
	"github.com/emersion/go-message/textproto"
)

// Defaults and bounds of Parse. The caps keep one hostile mail from
// costing the worker more than a normal large mail would.
const (
	// DefaultMaxAttachmentBytes is Limits.MaxAttachmentBytes when unset:
	// large enough for a voice message, small enough to hold a few at once.
	DefaultMaxAttachmentBytes int64 = 25 << 20
	// DefaultMaxTextBytes is Limits.MaxTextBytes when unset: far more text
	// than a classifier reads.
	DefaultMaxTextBytes int64 = 1 << 20
	// MaxHeaderBytes caps the header block; the rest of an oversized header
	// is skipped (and named in Problems) so the body is still read.
	MaxHeaderBytes = 1 << 20

	maxDepth    = 16  // multipart nesting
	maxParts    = 500 // parts walked in one message
	maxProblems = 50  // Problems kept; one more line says how many were dropped
	maxProblem  = 300 // bytes of one Problems line
	peekLen     = 1000
)

func (l Limits) withDefaults() Limits {
	if l.MaxAttachmentBytes <= 0 {
		l.MaxAttachmentBytes = DefaultMaxAttachmentBytes
	}
	if l.MaxTextBytes <= 0 {
		l.MaxTextBytes = DefaultMaxTextBytes
	}
	return l
}

// Parse parses one raw message; see ParseReader. A zero Limits means the
// defaults.
func Parse(raw []byte, lim Limits) (*Message, error) {
	return ParseReader(bytes.NewReader(raw), lim)
}

// ParseReader parses one message read from r. It streams: an attachment
// larger than lim.MaxAttachmentBytes is counted, not kept, so a 50 MB
// attachment never sits decoded in memory.
//
// It never gives up on a broken part, an unknown charset or transfer
// encoding, a malformed address or date: those become lines in
// Message.Problems and everything else is still read. It returns an error
// only when there is no usable header at all (empty input, garbage, or a
// read error inside the header block); the Message is then still non-nil
// and carries whatever could be read (a body after garbage becomes Text).
// A header-only message (the source fetched only the header of a large
// mail) parses without error or Problem.
func ParseReader(r io.Reader, lim Limits) (*Message, error) {
	p := &parser{m: &Message{}, lim: lim.withDefaults()}
	br := bufio.NewReaderSize(r, 32<<10)
	block, readErr := p.readHeaderBlock(br)
	h, err := textproto.ReadHeader(bufio.NewReader(bytes.NewReader(block)))
	if err != nil { // readHeaderBlock validated the lines; keep what was read
		p.problem("header: %v", err)
	}
	p.header(gomail.Header{Header: message.Header{Header: h}})
	if readErr != nil {
		return p.m, fmt.Errorf("mail: read the header block after %d bytes: %w", len(block), readErr)
	}

	if _, err := br.Peek(1); err == nil {
		e, err := message.New(message.Header{Header: h}, br)
		if err != nil {
			p.partProblem("body", err)
		}
		p.walk(e, "body", 0)
	} else if err != io.EOF {
		p.problem("body: read: %v", err)
	}
	p.m.Text = p.text.String()
	p.m.HTML = p.html.String()
	if h.Len() == 0 {
		return p.m, errors.New("mail: the input has no header fields (not a mail message)")
	}
	return p.m, nil
}

type parser struct {
	m          *Message
	lim        Limits
	text, html strings.Builder
	textFull   bool
	htmlFull   bool
	parts      int
	dropped    int
}

// problem records one non-fatal finding as a single, bounded line.
func (p *parser) problem(format string, args ...any) {
	if len(p.m.Problems) >= maxProblems {
		p.dropped++
		p.m.Problems[maxProblems-1] = fmt.Sprintf("%d more problems not listed", p.dropped+1)
		return
	}
	line := CleanLine(fmt.Sprintf(format, args...))
	if len(line) > maxProblem {
		line = string(trimIncompleteRune([]byte(line[:maxProblem]))) + "…"
	}
	p.m.Problems = append(p.m.Problems, line)
}

// partProblem names why go-message could not fully decode a part.
func (p *parser) partProblem(name string, err error) {
	switch {
	case message.IsUnknownCharset(err):
		p.problem("%s: %v; kept the raw bytes", name, err)
	case message.IsUnknownEncoding(err):
		p.problem("%s: %v; kept the undecoded bytes", name, err)
	default:
		p.problem("%s: %v", name, err)
	}
}

// readHeaderBlock reads the header lines up to and including the blank
// line and returns them ready for textproto.ReadHeader. A line that is not
// a header field ends the header without being consumed: it is the first
// line of the body (a mail without the blank separator loses nothing). A
// leading mbox "From " line is skipped. Memory stays bounded by
// MaxHeaderBytes whatever the input.
func (p *parser) readHeaderBlock(br *bufio.Reader) ([]byte, error) {
	var block []byte
	overflow := false
	for first := true; ; first = false {
		peek, err := br.Peek(peekLen)
		if len(peek) == 0 {
			if err == io.EOF {
				return block, nil // header-only message
			}
			return block, err
		}
		if first && bytes.HasPrefix(peek, []byte("\xef\xbb\xbf")) { // a UTF-8 byte order mark
			_, _ = br.Discard(3)
			peek = peek[3:]
			if len(peek) == 0 {
				continue
			}
		}
		switch {
		case peek[0] == '\n' || (peek[0] == '\r' && len(peek) > 1 && peek[1] == '\n'):
			_, err := br.ReadString('\n')
			if err != nil {
				return block, err
			}
			return block, nil
		case first && bytes.HasPrefix(peek, []byte("From ")) && !isFieldLine(peek):
			if _, _, err := readLine(br, 0); err != nil && err != io.EOF {
				return block, err
			}
			continue
		case peek[0] == ' ' || peek[0] == '\t':
			if len(block) == 0 {
				p.problem("header: the first line is indented; read it and what follows as the body")
				return block, nil
			}
		case !isFieldLine(peek):
			if len(block) == 0 {
				p.problem("header: the input does not start with a header field; read it as the body")
			} else {
				p.problem("header: a line is not a header field (no blank line before the body?); read it and what follows as the body")
			}
			return block, nil
		}
		line, tooLong, err := readLine(br, MaxHeaderBytes-len(block))
		if err != nil && err != io.EOF {
			return block, err
		}
		if tooLong && !overflow {
			overflow = true
			p.problem("header: larger than %d bytes; the rest of the header was skipped", MaxHeaderBytes)
		}
		if !overflow {
			line = bytes.TrimRight(line, "\r\n")
			block = append(append(block, line...), '\r', '\n')
		}
		if err == io.EOF {
			return block, nil
		}
	}
}

// readLine consumes one line (through '\n') and returns at most max bytes
// of it; tooLong says the line was longer and nothing of it was kept.
func readLine(br *bufio.Reader, max int) (line []byte, tooLong bool, err error) {
	for {
		frag, err := br.ReadSlice('\n')
		if !tooLong && len(line)+len(frag) <= max {
			line = append(line, frag...)
		} else {
			tooLong, line = true, nil
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		return line, tooLong, err
	}
}

// isFieldLine reports whether b starts with "name:" where name is a valid
// RFC 5322 field name (spaces before the colon are tolerated, as
// textproto.ReadHeader does).
func isFieldLine(b []byte) bool {
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		b = b[:i]
	}
	i := bytes.IndexByte(b, ':')
	if i < 0 {
		return false
	}
	key := bytes.TrimRight(b[:i], " \t")
	if len(key) == 0 {
		return false
	}
	for _, c := range key {
		if c < 33 || c > 126 || c == ':' {
			return false
		}
	}
	return true
}

// header fills the Message's header fields.
func (p *parser) header(h gomail.Header) {
	m := p.m
	if h.Has("Message-Id") {
		id, err := h.MessageID()
		if err != nil || id == "" {
			id = strings.Trim(strings.TrimSpace(h.Get("Message-Id")), "<>")
		}
		m.MessageID = CleanLine(id)
	}
	if v := h.Get("Subject"); v != "" {
		s, err := decodeWords(v)
		if err != nil {
			p.problem("subject: %v", err)
		}
		m.Subject = CleanLine(s)
	}
	if from := p.addresses(h, "From"); len(from) > 0 {
		m.From = from[0]
		m.From.Display = displayAddr(h.Get("From"), m.From.Addr)
		m.FromCount = len(from)
		m.FromOthers = from[1:]
	} else if sender := p.addresses(h, "Sender"); len(sender) > 0 {
		m.From = sender[0]
		m.From.Display = displayAddr(h.Get("Sender"), m.From.Addr)
	}
	m.To = p.addresses(h, "To")
	m.Cc = p.addresses(h, "Cc")
	m.DeliveredTo = plainAddresses(h.Values("Delivered-To"))
	m.XOriginalTo = plainAddresses(h.Values("X-Original-To"))
	if h.Get("Date") != "" {
		d, err := h.Date()
		if err != nil {
			p.problem("date: %q is not an RFC 5322 date", h.Get("Date"))
		} else {
			m.Date = d
		}
	}
	for _, v := range h.Values("Authentication-Results") {
		m.AuthResults = append(m.AuthResults, CleanLine(v))
	}
	m.ListUnsubscribe = rawValue(h.Header.Header, "List-Unsubscribe")
	m.ListUnsubscribePost = rawValue(h.Header.Header, "List-Unsubscribe-Post")
}

// rawValue returns the first field named key exactly as it was sent, only
// unfolded (every CRLF removed, the folding whitespace kept) and trimmed;
// it is not decoded, not even made valid UTF-8, because decoding could
// change a URL and RFC 2369 links must stay byte for byte.
func rawValue(h textproto.Header, key string) string {
	raw, err := h.Raw(key)
	if err != nil || raw == nil {
		return ""
	}
	i := bytes.IndexByte(raw, ':')
	if i < 0 {
		return ""
	}
	v := bytes.ReplaceAll(raw[i+1:], []byte("\r\n"), nil)
	v = bytes.ReplaceAll(v, []byte("\n"), nil)
	v = bytes.ReplaceAll(v, []byte("\r"), nil) // a bare CR is a line break to some readers
	return string(bytes.Trim(v, " \t"))
}

// addresses parses an address list header. A list net/mail rejects (very
// common in the wild: unquoted dots or commas in names, stray brackets) is
// read entry by entry with a lenient fallback, and named in Problems.
func (p *parser) addresses(h gomail.Header, key string) []Address {
	v := h.Get(key)
	if strings.TrimSpace(v) == "" {
		return nil
	}
	ap := netmail.AddressParser{WordDecoder: &mime.WordDecoder{CharsetReader: lenientCharsetReader}}
	list, err := ap.ParseList(v)
	if err == nil {
		out := make([]Address, 0, len(list))
		for _, a := range list {
			out = append(out, Address{Name: CleanLine(a.Name), Addr: cleanAddr(a.Address)})
		}
		return out
	}
	var out []Address
	pending := "" // pieces without an address: part of the next display name ("Müller, Hans <…>")
	for _, piece := range splitAddressList(v) {
		if !strings.Contains(piece, "@") {
			pending += piece + ","
			continue
		}
		piece, pending = pending+piece, ""
		if a, err := ap.Parse(piece); err == nil {
			out = append(out, Address{Name: CleanLine(a.Name), Addr: cleanAddr(a.Address)})
			continue
		}
		if a, ok := looseAddress(piece); ok {
			out = append(out, a)
		}
	}
	p.problem("%s: %q is not a valid address list; read %d address(es) leniently", strings.ToLower(key), v, len(out))
	return out
}

// splitAddressList splits on commas outside quotes and angle brackets; a
// quote that is never closed is ignored rather than swallowing the rest.
func splitAddressList(v string) []string {
	out, balanced := splitCommas(v, true)
	if !balanced {
		out, _ = splitCommas(v, false)
	}
	return out
}

func splitCommas(v string, quotes bool) (out []string, balanced bool) {
	inQuote, inAngle, start := false, false, 0
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case c == '\\' && inQuote:
			i++
		case c == '"' && quotes:
			inQuote = !inQuote
		case c == '<' && !inQuote:
			inAngle = true
		case c == '>' && !inQuote:
			inAngle = false
		case c == ',' && !inQuote && !inAngle:
			out = append(out, v[start:i])
			start = i + 1
		}
	}
	return append(out, v[start:]), !inQuote
}

var looseAddrRE = regexp.MustCompile(`[^\s<>(),;:"\[\]]+@[^\s<>(),;:"\[\]]+`)

// looseAddress takes "Name <addr>" apart without RFC 5322 rules, or finds
// the first thing that looks like local@domain.
func looseAddress(piece string) (Address, bool) {
	if lt := strings.LastIndexByte(piece, '<'); lt >= 0 {
		if gt := strings.IndexByte(piece[lt:], '>'); gt > 0 {
			addr := strings.TrimSpace(piece[lt+1 : lt+gt])
			if strings.Contains(addr, "@") && !strings.ContainsAny(addr, " \t") {
				name, _ := decodeWords(strings.Trim(strings.TrimSpace(piece[:lt]), `"`))
				return Address{Name: CleanLine(name), Addr: cleanAddr(addr)}, true
			}
		}
	}
	if a := looseAddrRE.FindString(piece); a != "" {
		return Address{Addr: cleanAddr(a)}, true
	}
	return Address{}, false
}

// plainAddresses cleans Delivered-To / X-Original-To values: bare
// addresses, sometimes in angle brackets, lower case, empty ones dropped.
func plainAddresses(vals []string) []string {
	var out []string
	for _, v := range vals {
		v = strings.TrimSpace(v)
		if a, err := netmail.ParseAddress(v); err == nil {
			v = a.Address
		}
		if v = cleanAddr(strings.Trim(v, "<>")); v != "" {
			out = append(out, v)
		}
	}
	return out
}

// displayAddr finds the first address of the header value v as written
// (inside its angle brackets, or the bare addr-spec) and returns it when it
// is the same mailbox as addr (the parsed, normalised address) apart from
// quoting, escapes, spaces and case; otherwise "".
func displayAddr(v, addr string) string {
	if addr == "" {
		return ""
	}
	for _, piece := range splitAddressList(v) {
		if !strings.Contains(piece, "@") {
			continue
		}
		spec := specOf(piece)
		if sameMailbox(spec, addr) {
			return CleanLine(spec)
		}
		return ""
	}
	return ""
}

// specOf is the addr-spec of one address list entry: the text in its last
// angle brackets outside quotes, or the entry itself without a group name.
func specOf(piece string) string {
	inQuote, lt, gt := false, -1, -1
	colon := -1
	for i := 0; i < len(piece); i++ {
		switch c := piece[i]; {
		case c == '\\' && inQuote:
			i++
		case c == '"':
			inQuote = !inQuote
		case c == '<' && !inQuote:
			lt, gt = i, -1
		case c == '>' && !inQuote && lt >= 0 && gt < 0:
			gt = i
		case c == ':' && !inQuote && lt < 0 && colon < 0:
			colon = i
		}
	}
	if lt >= 0 && gt > lt {
		return strings.TrimSpace(piece[lt+1 : gt])
	}
	if colon >= 0 {
		piece = piece[colon+1:]
	}
	return strings.TrimSpace(strings.TrimRight(strings.TrimSpace(piece), ";"))
}

// sameMailbox compares an addr-spec as written with a normalised address,
// ignoring quotes, backslashes, white space and case.
func sameMailbox(spec, addr string) bool {
	norm := func(s string) string {
		var b strings.Builder
		for i := 0; i < len(s); i++ {
			switch c := s[i]; c {
			case '"', '\\', ' ', '\t':
			default:
				b.WriteByte(c)
			}
		}
		return strings.ToLower(CleanLine(b.String()))
	}
	return norm(spec) == norm(addr)
}

func cleanAddr(a string) string {
	return strings.ToLower(strings.ReplaceAll(CleanLine(a), " ", ""))
}

// decodeWords decodes RFC 2047 encoded words. An unknown charset does not
// lose the text: its bytes are kept and made UTF-8 as well as possible,
// and the error says which charset it was.
func decodeWords(s string) (string, error) {
	var unknown error
	dec := mime.WordDecoder{CharsetReader: func(cs string, in io.Reader) (io.Reader, error) {
		r, err := charset.Reader(cs, in)
		if err != nil {
			if unknown == nil {
				unknown = fmt.Errorf("unknown charset %q in an encoded word; kept the raw bytes", cs)
			}
			return in, nil
		}
		return r, nil
	}}
	out, err := dec.DecodeHeader(s)
	if err != nil {
		return s, fmt.Errorf("decode encoded words: %w", err)
	}
	return out, unknown
}

// lenientCharsetReader is decodeWords' charset handling for net/mail.
func lenientCharsetReader(cs string, in io.Reader) (io.Reader, error) {
	if r, err := charset.Reader(cs, in); err == nil {
		return r, nil
	}
	return in, nil
}

// CleanLine makes outside text safe for one line of a post or a log line:
// valid UTF-8, CR and LF (header injection through encoded words) and other
// control characters replaced by a space, runs of spaces collapsed,
// trimmed. The worker uses it for model output too, so there is one rule.
func CleanLine(s string) string {
	s = toUTF8([]byte(s))
	var b strings.Builder
	b.Grow(len(s))
	space := false
	for _, r := range s {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == '\u2028' || r == '\u2029' {
			r = ' '
		}
		if r == ' ' {
			if space {
				continue
			}
			space = true
		} else {
			space = false
		}
		b.WriteRune(r)
	}
	return strings.TrimSpace(b.String())
}

// toUTF8 returns b as UTF-8: unchanged when valid, else read as
// windows-1252 (the usual truth behind unlabelled or mislabelled 8-bit
// mail; every byte maps to something readable).
func toUTF8(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	r, err := charset.Reader("windows-1252", bytes.NewReader(b))
	if err == nil {
		if out, err := io.ReadAll(r); err == nil && utf8.Valid(out) {
			return string(out)
		}
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

// trimIncompleteRune drops a UTF-8 sequence cut off at the end of b.
func trimIncompleteRune(b []byte) []byte {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				return b[:i]
			}
			break
		}
	}
	return b
}

var boundaryRE = regexp.MustCompile(`(?i)(?:^|;)\s*boundary\s*=\s*(?:"([^"]*)"|([^;\s]+))`)

// mediaType parses Content-Type leniently: a broken parameter list keeps
// the type (and, for multiparts, a recognisable boundary).
func mediaType(h message.Header) (string, map[string]string, error) {
	v := h.Get("Content-Type")
	if strings.TrimSpace(v) == "" {
		return "text/plain", map[string]string{}, nil
	}
	mt, params, err := mime.ParseMediaType(v)
	if err == nil {
		return mt, params, nil
	}
	if mt == "" {
		mt = strings.ToLower(strings.TrimSpace(strings.SplitN(v, ";", 2)[0]))
	}
	params = map[string]string{}
	if m := boundaryRE.FindStringSubmatch(v); m != nil {
		params["boundary"] = m[1] + m[2]
	}
	if mt == "" || !strings.Contains(mt, "/") {
		mt = "application/octet-stream"
	}
	return mt, params, fmt.Errorf("content-type %q: %w", v, err)
}

// filename is the part's file name: Content-Disposition filename (RFC 2231
// and, as sent by many clients, RFC 2047), else the Content-Type name. Any
// path is cut off, so the name is safe to show or to save under.
func filename(h message.Header, ctParams map[string]string) (disp, name string) {
	v := h.Get("Content-Disposition")
	d, params, err := mime.ParseMediaType(v)
	if err != nil && d == "" && v != "" {
		d = strings.ToLower(strings.TrimSpace(strings.SplitN(v, ";", 2)[0]))
	}
	name = params["filename"]
	if name == "" {
		name = ctParams["name"]
	}
	if strings.Contains(name, "=?") {
		if dec, err := decodeWords(name); err == nil {
			name = dec
		}
	}
	name = CleanLine(name)
	if i := strings.LastIndexAny(name, `/\`); i >= 0 {
		name = name[i+1:]
	}
	if name == "." || name == ".." {
		name = ""
	}
	return d, name
}

// walk reads one entity: recurses into multiparts, collects text and HTML
// bodies and attachments, and records what it could not read.
func (p *parser) walk(e *message.Entity, name string, depth int) {
	mt, params, err := mediaType(e.Header)
	if err != nil {
		p.problem("%s: %v", name, err)
	}
	label := name + " (" + mt + ")"
	disp, fname := filename(e.Header, params)

	if strings.HasPrefix(mt, "multipart/") {
		boundary := params["boundary"]
		switch {
		case boundary == "":
			p.problem("%s: multipart without a boundary; read as plain text", label)
			p.readText(e.Body, &p.text, &p.textFull, label)
			return
		case depth >= maxDepth:
			p.problem("%s: multiparts nested deeper than %d; skipped", label, maxDepth)
			return
		}
		// Until the first part is found, keep what was read: a body whose
		// boundary never appears (mangled by a forwarder) is then read as
		// text instead of being lost.
		rec := &recorder{r: e.Body, max: int(p.lim.MaxTextBytes), on: true}
		mr := textproto.NewMultipartReader(rec, boundary)
		for i := 1; ; i++ {
			part, err := mr.NextPart()
			if err == io.EOF { // the closing boundary
				return
			}
			if err != nil && i == 1 {
				p.problem("%s: no part found (%v); read the body as plain text", label, err)
				p.readText(bytes.NewReader(rec.buf), &p.text, &p.textFull, label)
				return
			}
			if err != nil {
				p.problem("%s: %v", label, err)
				return
			}
			rec.on, rec.buf = false, nil
			if p.parts++; p.parts > maxParts {
				p.problem("%s: more than %d parts; the rest was skipped", label, maxParts)
				return
			}
			childName := "part " + strconv.Itoa(i)
			if name != "body" {
				childName = name + "." + strconv.Itoa(i)
			}
			child, err := message.New(message.Header{Header: part.Header}, part)
			if err != nil {
				p.partProblem(childName, err)
			}
			p.walk(child, childName, depth+1)
		}
	}

	isAudio := strings.HasPrefix(mt, "audio/")
	switch {
	case disp == "attachment" || fname != "" || isAudio || mt == "message/rfc822" || mt == "message/global":
		p.attachment(e.Body, mt, fname, label)
	case mt == "text/plain":
		p.readText(e.Body, &p.text, &p.textFull, label)
	case mt == "text/html":
		p.readText(e.Body, &p.html, &p.htmlFull, label)
	}
	// Anything else (inline images without a name, calendars, delivery
	// reports) is not needed for triage; the multipart reader skips it.
}

// recorder keeps the first max bytes read through it while on.
type recorder struct {
	r   io.Reader
	buf []byte
	max int
	on  bool
}

func (rc *recorder) Read(b []byte) (int, error) {
	n, err := rc.r.Read(b)
	if rc.on {
		rc.buf = append(rc.buf, b[:min(n, rc.max-len(rc.buf))]...)
	}
	return n, err
}

// readText appends one body part to dst, up to lim.MaxTextBytes in all.
func (p *parser) readText(r io.Reader, dst *strings.Builder, full *bool, label string) {
	if *full {
		return
	}
	room := p.lim.MaxTextBytes - int64(dst.Len())
	if dst.Len() > 0 {
		room-- // the separating newline
	}
	if room <= 0 {
		*full = true
		p.problem("%s: text beyond %d bytes in all; dropped", label, p.lim.MaxTextBytes)
		return
	}
	data, err := io.ReadAll(io.LimitReader(r, room+1))
	if err != nil {
		p.problem("%s: reading the text stopped early: %v", label, err)
	}
	truncated := int64(len(data)) > room
	if truncated {
		data = trimIncompleteRune(data[:room])
		*full = true
		p.problem("%s: text longer than %d bytes; the rest was dropped", label, p.lim.MaxTextBytes)
	}
	s := toUTF8(data)
	sep := 0
	if dst.Len() > 0 {
		sep = 1
	}
	if fit := int(p.lim.MaxTextBytes) - dst.Len() - sep; len(s) > fit { // the windows-1252 fallback grew it
		s = string(trimIncompleteRune([]byte(s[:fit])))
		if !*full {
			p.problem("%s: text longer than %d bytes after conversion to UTF-8; the rest was dropped", label, p.lim.MaxTextBytes)
		}
		*full = true
	}
	if s == "" {
		return
	}
	if sep > 0 {
		dst.WriteByte('\n')
	}
	dst.WriteString(s)
}

// attachment reads one attachment, keeping at most lim.MaxAttachmentBytes.
// It reads in chunks so that a too-large part costs at most the limit in
// memory (then released) and its size is still counted to the end.
func (p *parser) attachment(r io.Reader, mt, fname, label string) {
	a := Attachment{Filename: fname, ContentType: mt}
	data, size, truncated, err := readCapped(r, p.lim.MaxAttachmentBytes)
	a.Size = size
	if truncated {
		a.Truncated = true
		p.problem("%s: attachment %q has %d bytes, more than the %d kept; data dropped", label, fname, size, p.lim.MaxAttachmentBytes)
	} else {
		a.Data = data
	}
	if err != nil {
		p.problem("%s: attachment %q is incomplete after %d bytes: %v", label, fname, size, err)
	}
	p.m.Attachments = append(p.m.Attachments, a)
}

// readCapped reads r to the end. It returns the data when there were at
// most max bytes, else nil and truncated; n is the total count either way.
func readCapped(r io.Reader, max int64) (data []byte, n int64, truncated bool, err error) {
	var chunks [][]byte
	size := 8 << 10 // small first: most attachments are small
	for {
		buf := make([]byte, size)
		k, rerr := io.ReadFull(r, buf)
		n += int64(k)
		if n > max {
			rest, derr := io.Copy(io.Discard, r)
			n += rest
			if derr == nil && rerr != io.EOF && rerr != io.ErrUnexpectedEOF {
				derr = rerr
			}
			return nil, n, true, derr
		}
		chunks = append(chunks, buf[:k])
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			err = rerr
			break
		}
		size = min(size*2, 1<<20)
	}
	data = make([]byte, 0, n)
	for _, c := range chunks {
		data = append(data, c...)
	}
	return data, n, false, err
}

// audioExt are the file name endings (lower case) of audio and
// audio-in-video formats: voice memos and the formats a speech-to-text
// service accepts. It is the one table; IsAudio reads it.
var audioExt = map[string]bool{
	".mp3": true, ".m4a": true, ".wav": true, ".ogg": true, ".oga": true, ".opus": true,
	".webm": true, ".mp4": true, ".mpga": true, ".mpeg": true, ".flac": true,
	".aac": true, ".amr": true,
}

// IsAudio reports whether the attachment is audio to transcribe: an
// audio/* part, or a part whose file name has an audio ending (voice
// messages often arrive as application/octet-stream). It does not look at
// whether the data was kept (see Truncated).
func (a Attachment) IsAudio() bool {
	return strings.HasPrefix(a.ContentType, "audio/") || audioExt[strings.ToLower(path.Ext(a.Filename))]
}

// Audio returns the attachments worth transcribing (IsAudio) that were
// kept in full.
func (m *Message) Audio() []Attachment {
	var out []Attachment
	for _, a := range m.Attachments {
		if len(a.Data) == 0 {
			continue
		}
		if a.IsAudio() {
			out = append(out, a)
		}
	}
	return out
}
