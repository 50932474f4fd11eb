package mail

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
	"time"
	"unicode/utf8"
)

// crlf turns a readable test message (LF line ends) into wire format.
func crlf(s string) []byte { return []byte(strings.ReplaceAll(s, "\n", "\r\n")) }

func hasProblem(m *Message, sub string) bool {
	return slices.ContainsFunc(m.Problems, func(p string) bool { return strings.Contains(p, sub) })
}

// parseCases are real-world shapes; each also seeds FuzzParse.
var parseCases = []struct {
	name    string
	raw     []byte
	lim     Limits
	wantErr bool
	check   func(t *testing.T, m *Message)
}{
	{
		name: "quoted-printable utf-8 with soft breaks, addresses, delivered-to",
		raw: crlf(`Return-Path: <Anna@Example.COM>
Delivered-To: Info@Firma.TEST
Delivered-To: <anna.alias@firma.test>
X-Original-To: Sales@Firma.test
From: =?UTF-8?Q?Anna_M=C3=BCller?= <Anna.Mueller@Example.COM>
To: "Info" <INFO@firma.test>, bob@firma.test
Cc: Carol <carol@FIRMA.test>
Subject: =?UTF-8?Q?Gr=C3=BC=C3=9Fe_aus?= =?UTF-8?Q?_M=C3=BCnchen?=
Date: Tue, 3 Mar 2026 09:15:00 +0100
Message-ID: <abc.123@mail.example.com>
MIME-Version: 1.0
Content-Type: text/plain; charset="utf-8"
Content-Transfer-Encoding: quoted-printable

Hallo, viele Gr=C3=BC=C3=9Fe und ein sehr langer Satz, der umbrochen wird =
weil er l=C3=A4nger als 76 Zeichen ist.
`),
		check: func(t *testing.T, m *Message) {
			if m.Subject != "Grüße aus München" {
				t.Errorf("Subject = %q", m.Subject)
			}
			if m.From != (Address{Name: "Anna Müller", Addr: "anna.mueller@example.com", Display: "Anna.Mueller@Example.COM"}) {
				t.Errorf("From = %+v", m.From)
			}
			if len(m.To) != 2 || m.To[0].Addr != "info@firma.test" || m.To[0].Name != "Info" || m.To[1].Addr != "bob@firma.test" {
				t.Errorf("To = %+v", m.To)
			}
			if len(m.Cc) != 1 || m.Cc[0].Addr != "carol@firma.test" {
				t.Errorf("Cc = %+v", m.Cc)
			}
			if !slices.Equal(m.DeliveredTo, []string{"info@firma.test", "anna.alias@firma.test"}) {
				t.Errorf("DeliveredTo = %q", m.DeliveredTo)
			}
			if !slices.Equal(m.XOriginalTo, []string{"sales@firma.test"}) {
				t.Errorf("XOriginalTo = %q", m.XOriginalTo)
			}
			if want := time.Date(2026, 3, 3, 8, 15, 0, 0, time.UTC); !m.Date.Equal(want) {
				t.Errorf("Date = %v, want %v", m.Date, want)
			}
			if m.MessageID != "abc.123@mail.example.com" {
				t.Errorf("MessageID = %q", m.MessageID)
			}
			if want := "Hallo, viele Grüße und ein sehr langer Satz, der umbrochen wird weil er länger als 76 Zeichen ist.\r\n"; m.Text != want {
				t.Errorf("Text = %q, want %q", m.Text, want)
			}
			if len(m.Problems) != 0 {
				t.Errorf("Problems = %q", m.Problems)
			}
		},
	},
	{
		name: "base64 text",
		raw: crlf(`From: a@example.com
Subject: b64
Content-Type: text/plain; charset=UTF-8
Content-Transfer-Encoding: base64

` + base64.StdEncoding.EncodeToString([]byte("Bitte um Rückruf, Termin am Freitag.")) + "\n"),
		check: func(t *testing.T, m *Message) {
			if m.Text != "Bitte um Rückruf, Termin am Freitag." {
				t.Errorf("Text = %q", m.Text)
			}
		},
	},
	{
		name: "ISO-8859-1 subject and quoted-printable body",
		raw: crlf(`From: =?ISO-8859-1?Q?J=F6rg_K=E4fer?= <joerg@example.de>
Subject: =?ISO-8859-1?Q?Angebot_f=FCr_B=FCror=E4ume?=
Content-Type: text/plain; charset=ISO-8859-1
Content-Transfer-Encoding: quoted-printable

Sch=F6ne Gr=FC=DFe
`),
		check: func(t *testing.T, m *Message) {
			if m.Subject != "Angebot für Büroräume" || m.From.Name != "Jörg Käfer" {
				t.Errorf("Subject = %q, From = %+v", m.Subject, m.From)
			}
			if m.Text != "Schöne Grüße\r\n" {
				t.Errorf("Text = %q", m.Text)
			}
		},
	},
	{
		name: "windows-1252 8bit body",
		raw: append(crlf("From: shop@example.com\nSubject: Preis\nContent-Type: text/plain; charset=windows-1252\nContent-Transfer-Encoding: 8bit\n\n"),
			[]byte("Nur 99 \x80 \x93heute\x94 \x96 gr\xfc\xdfe")...),
		check: func(t *testing.T, m *Message) {
			if m.Text != "Nur 99 € “heute” – grüße" {
				t.Errorf("Text = %q", m.Text)
			}
		},
	},
	{
		name: "unknown charset x-foo keeps the bytes and names the charset",
		raw: crlf(`From: odd@example.com
Subject: =?x-foo?Q?Hallo_Welt?=
Content-Type: text/plain; charset="x-foo"

Hello plain ASCII under a strange label
`),
		check: func(t *testing.T, m *Message) {
			if m.Text != "Hello plain ASCII under a strange label\r\n" {
				t.Errorf("Text = %q", m.Text)
			}
			if m.Subject != "Hallo Welt" {
				t.Errorf("Subject = %q (raw bytes of the encoded word expected)", m.Subject)
			}
			if !hasProblem(m, `x-foo`) || !hasProblem(m, "body") || !hasProblem(m, "subject") {
				t.Errorf("Problems = %q, want the body and the subject charset named", m.Problems)
			}
		},
	},
	{
		name: "unknown charset with 8-bit bytes falls back to windows-1252",
		raw:  append(crlf("From: odd@example.com\nContent-Type: text/plain; charset=x-foo\n\n"), []byte("Gr\xfc\xdfe")...),
		check: func(t *testing.T, m *Message) {
			if m.Text != "Grüße" || !utf8.ValidString(m.Text) {
				t.Errorf("Text = %q", m.Text)
			}
		},
	},
	{
		name: "unlabelled 8-bit body and subject become valid UTF-8",
		raw:  []byte("From: a@example.com\r\nSubject: Gr\xfc\xdfe\r\n\r\nK\xe4se"),
		check: func(t *testing.T, m *Message) {
			if m.Subject != "Grüße" || m.Text != "Käse" {
				t.Errorf("Subject = %q, Text = %q", m.Subject, m.Text)
			}
		},
	},
	{
		name: "nested multipart: mixed(alternative(plain, related(html, image)), pdf, forwarded mail)",
		raw: crlf(`From: Partner <partner@example.org>
To: info@firma.test
Subject: Vertrag
MIME-Version: 1.0
Content-Type: multipart/mixed; boundary="outer"

This is a multi-part message in MIME format.
--outer
Content-Type: multipart/alternative; boundary="alt"

--alt
Content-Type: text/plain; charset=utf-8
Content-Transfer-Encoding: 8bit

Anbei der Vertrag.
--alt
Content-Type: multipart/related; boundary="rel"

--rel
Content-Type: text/html; charset=utf-8

<p>Anbei der <b>Vertrag</b>.</p><img src="cid:logo">
--rel
Content-Type: image/png
Content-ID: <logo>
Content-Transfer-Encoding: base64

iVBORw0KGgo=
--rel--
--alt--
--outer
Content-Type: application/pdf; name="vertrag.pdf"
Content-Disposition: attachment; filename="vertrag.pdf"
Content-Transfer-Encoding: base64

JVBERi0xLjQK
--outer
Content-Type: message/rfc822
Content-Disposition: attachment; filename="weitergeleitet.eml"

From: other@example.net
Subject: inner

inner body
--outer--
epilogue
`),
		check: func(t *testing.T, m *Message) {
			if m.Text != "Anbei der Vertrag." {
				t.Errorf("Text = %q", m.Text)
			}
			if m.HTML != `<p>Anbei der <b>Vertrag</b>.</p><img src="cid:logo">` {
				t.Errorf("HTML = %q", m.HTML)
			}
			if len(m.Attachments) != 2 {
				t.Fatalf("Attachments = %+v, want the pdf and the forwarded mail (not the inline logo)", m.Attachments)
			}
			pdf, fwd := m.Attachments[0], m.Attachments[1]
			if pdf.Filename != "vertrag.pdf" || pdf.ContentType != "application/pdf" || string(pdf.Data) != "%PDF-1.4\n" || pdf.Size != 9 {
				t.Errorf("pdf = %+v", pdf)
			}
			if fwd.ContentType != "message/rfc822" || !bytes.Contains(fwd.Data, []byte("Subject: inner")) {
				t.Errorf("forwarded = %+v %q", fwd, fwd.Data)
			}
			if m.Subject != "Vertrag" || len(m.Problems) != 0 {
				t.Errorf("Subject = %q, Problems = %q (the inner mail must not leak out)", m.Subject, m.Problems)
			}
		},
	},
	{
		name: "HTML only: BodyText drops script, style, head and decodes entities",
		raw: crlf(`From: news@shop.example
Subject: Angebote
Content-Type: text/html; charset=utf-8

<!DOCTYPE html><html><head><title>Newsletter</title><style>p{color:red}</style></head>
<body><div style="display:none">Vorschau&nbsp;&zwnj;&nbsp;&zwnj;</div>
<script>alert("x")</script>
<h1>Neue   Angebote</h1><p>Caf&eacute; &amp; Kuchen
heute</p><table><tr><td>A</td><td>B</td></tr></table>
<p><a href="https://shop.example/u">Abmelden</a></p></body></html>
`),
		check: func(t *testing.T, m *Message) {
			if m.Text != "" || m.HTML == "" {
				t.Fatalf("Text = %q, HTML = %q", m.Text, m.HTML)
			}
			want := "Vorschau\n\nNeue Angebote\n\nCafé & Kuchen heute\n\nA B\n\nAbmelden"
			if got := m.BodyText(); got != want {
				t.Errorf("BodyText = %q, want %q", got, want)
			}
		},
	},
	{
		name: "attachment with RFC 2231 filenames (encoded and continued) and RFC 2047 name",
		raw: crlf(`From: a@example.com
Subject: Rechnungen
Content-Type: multipart/mixed; boundary=b1

--b1
Content-Type: text/plain

Siehe Anhang.
--b1
Content-Type: application/pdf
Content-Disposition: attachment; filename*=UTF-8''Rechnung%20M%C3%A4rz%202026.pdf

JVBERi0=
--b1
Content-Type: application/pdf
Content-Disposition: attachment;
 filename*0*=UTF-8''Sehr%20langer%20Dateiname%20;
 filename*1*=f%C3%BCr%20die%20Pr%C3%BCfung.pdf

x
--b1
Content-Type: application/octet-stream; name="=?UTF-8?B?w5xiZXJzaWNodC54bHN4?="

y
--b1
Content-Type: text/plain; name="../../etc/passwd"
Content-Disposition: inline

z
--b1--
`),
		check: func(t *testing.T, m *Message) {
			var names []string
			for _, a := range m.Attachments {
				names = append(names, a.Filename)
			}
			want := []string{"Rechnung März 2026.pdf", "Sehr langer Dateiname für die Prüfung.pdf", "Übersicht.xlsx", "passwd"}
			if !slices.Equal(names, want) {
				t.Errorf("filenames = %q, want %q", names, want)
			}
			if m.Text != "Siehe Anhang." {
				t.Errorf("Text = %q (a named inline text part is an attachment, not body)", m.Text)
			}
		},
	},
	{
		name: "CRLF injection through encoded words in Subject and From name",
		raw: crlf(`From: =?UTF-8?Q?Support=0D=0ABcc:_victim@example.com?= <support@example.com>
Subject: =?UTF-8?Q?Hello=0D=0ABcc:_victim@example.com=0D=0A=0D=0Abody?=
Content-Type: text/plain

x
`),
		check: func(t *testing.T, m *Message) {
			for _, s := range []string{m.Subject, m.From.Name, m.From.Addr} {
				if strings.ContainsAny(s, "\r\n") {
					t.Errorf("CR/LF survived: %q", s)
				}
			}
			if m.Subject != "Hello Bcc: victim@example.com body" || m.From.Name != "Support Bcc: victim@example.com" || m.From.Addr != "support@example.com" {
				t.Errorf("Subject = %q, From = %+v", m.Subject, m.From)
			}
		},
	},
	{
		name: "List-Unsubscribe kept byte for byte, only unfolded",
		raw: crlf(`From: news@list.example
Subject: Weekly
List-Unsubscribe: <mailto:unsub-4711@list.example?subject=unsubscribe>,
	<https://list.example/u/4711?list=weekly&sig=Zm9v%2Bbar=&x==?utf-8?q?y?=>
List-Unsubscribe-Post: List-Unsubscribe=One-Click
Content-Type: text/plain

hi
`),
		check: func(t *testing.T, m *Message) {
			want := "<mailto:unsub-4711@list.example?subject=unsubscribe>,\t<https://list.example/u/4711?list=weekly&sig=Zm9v%2Bbar=&x==?utf-8?q?y?=>"
			if m.ListUnsubscribe != want {
				t.Errorf("ListUnsubscribe = %q\nwant              %q", m.ListUnsubscribe, want)
			}
			if m.ListUnsubscribePost != "List-Unsubscribe=One-Click" {
				t.Errorf("ListUnsubscribePost = %q", m.ListUnsubscribePost)
			}
		},
	},
	{
		name: "header only (no blank line, multipart type, no body) parses cleanly",
		raw: crlf(`From: Big Sender <big@example.com>
To: info@firma.test
Subject: 80 MB video
List-Unsubscribe: <https://example.com/u>
Content-Type: multipart/mixed; boundary="zzz"`),
		check: func(t *testing.T, m *Message) {
			if m.Subject != "80 MB video" || m.From.Addr != "big@example.com" || m.ListUnsubscribe != "<https://example.com/u>" {
				t.Errorf("got %+v", m)
			}
			if len(m.Problems) != 0 || m.Text != "" || len(m.Attachments) != 0 {
				t.Errorf("Problems = %q, Text = %q, Attachments = %d", m.Problems, m.Text, len(m.Attachments))
			}
		},
	},
	{
		name: "header only with the blank line",
		raw:  crlf("From: a@example.com\nSubject: s\nContent-Type: multipart/alternative; boundary=q\n\n"),
		check: func(t *testing.T, m *Message) {
			if m.Subject != "s" || len(m.Problems) != 0 {
				t.Errorf("Subject = %q, Problems = %q", m.Subject, m.Problems)
			}
		},
	},
	{
		name: "mbox From_ line and LF-only line ends",
		raw:  []byte("From someone@example.com Sat Jan  3 01:05:34 2026\nFrom: someone@example.com\nSubject: mbox\n\nbody\n"),
		check: func(t *testing.T, m *Message) {
			if m.Subject != "mbox" || m.From.Addr != "someone@example.com" || m.Text != "body\n" || len(m.Problems) != 0 {
				t.Errorf("got Subject %q From %+v Text %q Problems %q", m.Subject, m.From, m.Text, m.Problems)
			}
		},
	},
	{
		name: "UTF-8 byte order mark before the header",
		raw:  crlf("\ufeffFrom: a@example.com\nSubject: bom\n\nx"),
		check: func(t *testing.T, m *Message) {
			if m.Subject != "bom" || m.From.Addr != "a@example.com" || len(m.Problems) != 0 {
				t.Errorf("Subject %q From %+v Problems %q", m.Subject, m.From, m.Problems)
			}
		},
	},
	{
		name: "no blank line before the body loses nothing",
		raw:  crlf("From: a@example.com\nSubject: s\nThis line starts the body.\nSecond line.\n"),
		check: func(t *testing.T, m *Message) {
			if m.Text != "This line starts the body.\r\nSecond line.\r\n" || !hasProblem(m, "not a header field") {
				t.Errorf("Text = %q, Problems = %q", m.Text, m.Problems)
			}
		},
	},
	{
		name: "audio: audio/* without a name, octet-stream voice memo, image is not audio",
		raw: crlf(`From: a@example.com
Subject: Sprachnachricht
Content-Type: multipart/mixed; boundary=m

--m
Content-Type: audio/ogg; codecs=opus
Content-Transfer-Encoding: base64

T2dnUw==
--m
Content-Type: application/octet-stream
Content-Disposition: attachment; filename="Memo 12.M4A"
Content-Transfer-Encoding: base64

AAAAIGZ0eXA=
--m
Content-Type: image/jpeg
Content-Disposition: attachment; filename="foto.jpg"

jpg
--m
Content-Type: audio/mpeg
Content-Disposition: attachment; filename="empty.mp3"

--m--
`),
		check: func(t *testing.T, m *Message) {
			audio := m.Audio()
			if len(audio) != 2 || audio[0].ContentType != "audio/ogg" || string(audio[0].Data) != "OggS" || audio[1].Filename != "Memo 12.M4A" {
				t.Errorf("Audio() = %+v", audio)
			}
			if len(m.Attachments) != 4 {
				t.Errorf("Attachments = %d, want 4", len(m.Attachments))
			}
		},
	},
	{
		name: "text beyond MaxTextBytes is cut at a rune boundary",
		raw:  crlf("From: a@example.com\nContent-Type: text/plain; charset=utf-8\n\n" + strings.Repeat("ü", 10)),
		lim:  Limits{MaxTextBytes: 7},
		check: func(t *testing.T, m *Message) {
			if m.Text != "üüü" || !hasProblem(m, "longer than 7 bytes") {
				t.Errorf("Text = %q, Problems = %q", m.Text, m.Problems)
			}
		},
	},
	{
		name: "attachment beyond MaxAttachmentBytes: counted, not kept",
		raw:  crlf("From: a@example.com\nContent-Type: multipart/mixed; boundary=x\n\n--x\nContent-Type: audio/mpeg\n\n" + strings.Repeat("A", 100) + "\n--x--\n"),
		lim:  Limits{MaxAttachmentBytes: 10},
		check: func(t *testing.T, m *Message) {
			if len(m.Attachments) != 1 {
				t.Fatalf("Attachments = %+v", m.Attachments)
			}
			a := m.Attachments[0]
			if a.Data != nil || !a.Truncated || a.Size != 100 || !hasProblem(m, "100 bytes") || len(m.Audio()) != 0 {
				t.Errorf("attachment = %+v, Problems = %q", a, m.Problems)
			}
		},
	},
	{
		name: "truncated multipart keeps the text read so far",
		raw:  crlf("From: a@example.com\nContent-Type: multipart/alternative; boundary=x\n\n--x\nContent-Type: text/plain\n\nfirst part\n--x\nContent-Type: text/html\n\n<p>cut"),
		check: func(t *testing.T, m *Message) {
			if m.Text != "first part" || m.HTML != "<p>cut" || !hasProblem(m, "text/html") {
				t.Errorf("Text = %q HTML = %q Problems = %q", m.Text, m.HTML, m.Problems)
			}
		},
	},
	{
		name: "broken base64 and unknown transfer encoding become problems",
		raw: crlf(`From: a@example.com
Content-Type: multipart/mixed; boundary=x

--x
Content-Type: text/plain
Content-Transfer-Encoding: base64

SGVsbG8g!!!!d29ybGQ=
--x
Content-Type: text/plain
Content-Transfer-Encoding: x-uuencode

begin 644 a
--x--
`),
		check: func(t *testing.T, m *Message) {
			if !strings.HasPrefix(m.Text, "Hello ") || !strings.Contains(m.Text, "begin 644 a") {
				t.Errorf("Text = %q", m.Text)
			}
			if !hasProblem(m, "part 1 (text/plain): reading the text stopped early") || !hasProblem(m, `part 2: encoding error: unhandled encoding "x-uuencode"`) {
				t.Errorf("Problems = %q", m.Problems)
			}
		},
	},
	{
		name: "broken Content-Type parameters still find the boundary",
		raw:  crlf("From: a@example.com\nContent-Type: multipart/alternative; boundary=\"b\"; charset=\"utf-8\n\n--b\nContent-Type: text/plain\n\nok\n--b--\n"),
		check: func(t *testing.T, m *Message) {
			if m.Text != "ok" || !hasProblem(m, "content-type") {
				t.Errorf("Text = %q, Problems = %q", m.Text, m.Problems)
			}
		},
	},
	{
		name: "boundary that never appears: the body is read as text",
		raw:  crlf("From: a@example.com\nContent-Type: multipart/alternative; boundary=\"expected\"\n\n--mangled\nContent-Type: text/plain\n\nthe message\n--mangled--\n"),
		check: func(t *testing.T, m *Message) {
			if !strings.Contains(m.Text, "the message") || !hasProblem(m, "no part found") {
				t.Errorf("Text = %q, Problems = %q", m.Text, m.Problems)
			}
		},
	},
	{
		name: "empty multipart with only the closing boundary",
		raw:  crlf("From: a@example.com\nContent-Type: multipart/mixed; boundary=x\n\n--x--\n"),
		check: func(t *testing.T, m *Message) {
			if m.Text != "" || len(m.Attachments) != 0 || len(m.Problems) != 0 {
				t.Errorf("Text = %q, Attachments = %+v, Problems = %q", m.Text, m.Attachments, m.Problems)
			}
		},
	},
	{
		name: "multipart without boundary is read as text",
		raw:  crlf("From: a@example.com\nContent-Type: multipart/mixed\n\nsome text\n"),
		check: func(t *testing.T, m *Message) {
			if m.Text != "some text\r\n" || !hasProblem(m, "without a boundary") {
				t.Errorf("Text = %q, Problems = %q", m.Text, m.Problems)
			}
		},
	},
	{
		name: "invalid address lists and date are read leniently",
		raw: crlf(`From: John Q. Public, Jr. <JQP@Example.COM>
To: Müller, Hans <Hans@Example.com>, "Broken <one@example.com>, two@EXAMPLE.com
Date: yesterday at noon
Subject: s

x
`),
		check: func(t *testing.T, m *Message) {
			if m.From.Addr != "jqp@example.com" {
				t.Errorf("From = %+v", m.From)
			}
			if len(m.To) != 3 || m.To[0] != (Address{Name: "Müller, Hans", Addr: "hans@example.com"}) || m.To[1].Addr != "one@example.com" || m.To[2].Addr != "two@example.com" {
				t.Errorf("To = %+v", m.To)
			}
			if !m.Date.IsZero() || !hasProblem(m, "date") || !hasProblem(m, "from") {
				t.Errorf("Date = %v, Problems = %q", m.Date, m.Problems)
			}
		},
	},
	{
		name:    "garbage without any header: error, non-nil message with the text",
		raw:     []byte("this is not a mail at all\njust words\n"),
		wantErr: true,
		check: func(t *testing.T, m *Message) {
			if m.Text != "this is not a mail at all\njust words\n" || len(m.Problems) == 0 {
				t.Errorf("Text = %q, Problems = %q", m.Text, m.Problems)
			}
		},
	},
	{
		name:    "empty input",
		raw:     nil,
		wantErr: true,
		check:   func(t *testing.T, m *Message) {},
	},
}

func TestParse(t *testing.T) {
	for _, tc := range parseCases {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Parse(tc.raw, tc.lim)
			if m == nil {
				t.Fatal("Parse returned a nil Message")
			}
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v (Problems %q)", err, tc.wantErr, m.Problems)
			}
			tc.check(t, m)
			checkInvariants(t, m, tc.lim)
		})
	}
}

// checkInvariants holds for every input, however broken.
func checkInvariants(t *testing.T, m *Message, lim Limits) {
	t.Helper()
	lim = lim.withDefaults()
	one := []string{m.Subject, m.From.Name, m.From.Addr, m.MessageID, m.ListUnsubscribe, m.ListUnsubscribePost}
	for _, a := range append(slices.Clone(m.To), m.Cc...) {
		one = append(one, a.Name, a.Addr)
	}
	one = append(one, m.DeliveredTo...)
	one = append(one, m.XOriginalTo...)
	one = append(one, m.Problems...)
	for _, a := range m.Attachments {
		one = append(one, a.Filename, a.ContentType)
	}
	for _, s := range one {
		if strings.ContainsAny(s, "\r\n") {
			t.Errorf("CR/LF in a one-line field: %q", s)
		}
	}
	// ListUnsubscribe* (one[4:6]) are byte for byte, so not necessarily UTF-8.
	for _, s := range append(append(one[:4:4], one[6:]...), m.Text, m.HTML, m.BodyText()) {
		if !utf8.ValidString(s) {
			t.Errorf("invalid UTF-8: %q", s)
		}
	}
	if int64(len(m.Text)) > lim.MaxTextBytes || int64(len(m.HTML)) > lim.MaxTextBytes {
		t.Errorf("text %d / html %d bytes exceed the %d limit", len(m.Text), len(m.HTML), lim.MaxTextBytes)
	}
	for _, a := range m.Attachments {
		if int64(len(a.Data)) > lim.MaxAttachmentBytes || (a.Data != nil && int64(len(a.Data)) != a.Size) || (a.Truncated && a.Data != nil) {
			t.Errorf("attachment %q: %d bytes kept, size %d, truncated %v, limit %d", a.Filename, len(a.Data), a.Size, a.Truncated, lim.MaxAttachmentBytes)
		}
	}
	if len(m.Problems) > maxProblems {
		t.Errorf("%d problems, cap is %d", len(m.Problems), maxProblems)
	}
}

func TestReadErrorInHeaderKeepsWhatWasRead(t *testing.T) {
	r := io.MultiReader(strings.NewReader("From: Ann <ann@example.com>\r\nSubject: partial\r\n"), iotest.ErrReader(errors.New("connection reset")))
	m, err := ParseReader(r, Limits{})
	if err == nil || !strings.Contains(err.Error(), "connection reset") {
		t.Fatalf("err = %v, want the read error", err)
	}
	if m == nil || m.Subject != "partial" || m.From.Addr != "ann@example.com" {
		t.Fatalf("Message = %+v, want the fields read before the error", m)
	}
}

func TestReadErrorInBodyIsAProblem(t *testing.T) {
	r := io.MultiReader(strings.NewReader("From: ann@example.com\r\n\r\nfirst words"), iotest.ErrReader(errors.New("connection reset")))
	m, err := ParseReader(r, Limits{})
	if err != nil || m.Text != "first words" || !hasProblem(m, "connection reset") {
		t.Fatalf("err = %v, Text = %q, Problems = %q", err, m.Text, m.Problems)
	}
}

func TestListUnsubscribeFirstOfSeveral(t *testing.T) {
	m, err := Parse(crlf("From: a@example.com\nList-Unsubscribe: <https://first.example/u>\nList-Unsubscribe: <https://second.example/u>\n\nx"), Limits{})
	if err != nil || m.ListUnsubscribe != "<https://first.example/u>" {
		t.Fatalf("err = %v, ListUnsubscribe = %q, want the topmost field", err, m.ListUnsubscribe)
	}
}

func TestOversizedHeaderIsSkippedBodyKept(t *testing.T) {
	raw := crlf("From: a@example.com\nX-Junk: " + strings.Repeat("j", MaxHeaderBytes) + "\nSubject: after\n\nthe body\n")
	m, err := Parse(raw, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if m.From.Addr != "a@example.com" || m.Subject != "" || m.Text != "the body\r\n" || !hasProblem(m, "larger than") {
		t.Fatalf("From %+v Subject %q Text %q Problems %q", m.From, m.Subject, m.Text, m.Problems)
	}
}

func TestTooManyProblemsAreCapped(t *testing.T) {
	var b strings.Builder
	b.WriteString("From: a@example.com\nContent-Type: multipart/mixed; boundary=x\n\n")
	for range 200 {
		b.WriteString("--x\nContent-Type: text/plain; charset=x-foo\n\nhi\n")
	}
	b.WriteString("--x--\n")
	m, _ := Parse(crlf(b.String()), Limits{})
	if len(m.Problems) != maxProblems || !strings.Contains(m.Problems[maxProblems-1], "151 more problems") {
		t.Fatalf("%d problems, last %q", len(m.Problems), m.Problems[len(m.Problems)-1])
	}
}

func TestDeepNestingIsBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString("From: a@example.com\nContent-Type: multipart/mixed; boundary=b0\n\n")
	for i := 1; i <= 40; i++ {
		fmt.Fprintf(&b, "--b%d\nContent-Type: multipart/mixed; boundary=b%d\n\n", i-1, i)
	}
	b.WriteString("--b40\nContent-Type: text/plain\n\ndeep\n")
	m, err := Parse(crlf(b.String()), Limits{})
	if err != nil || m.Text != "" || !hasProblem(m, "nested deeper than") {
		t.Fatalf("err %v Text %q Problems %q", err, m.Text, m.Problems)
	}
}

// repeatReader yields line n times, copying many lines per Read.
type repeatReader struct {
	block []byte // 1024 copies of the line
	off   int    // position in block
	left  int64  // bytes still to yield
}

func newRepeatReader(line string, n int) *repeatReader {
	return &repeatReader{block: []byte(strings.Repeat(line, 1024)), left: int64(len(line)) * int64(n)}
}

func (r *repeatReader) Read(p []byte) (int, error) {
	if r.left == 0 {
		return 0, io.EOF
	}
	k := copy(p[:min(int64(len(p)), r.left)], r.block[r.off:])
	r.off = (r.off + k) % len(r.block)
	r.left -= int64(k)
	return k, nil
}

// bigMail builds, on the fly, a mail with a text part and a base64 audio
// attachment of size decoded bytes, without ever holding it.
func bigMail(size int) io.Reader {
	chunk := make([]byte, 57) // one 76-character base64 line
	for i := range chunk {
		chunk[i] = byte(i * 7)
	}
	line := base64.StdEncoding.EncodeToString(chunk) + "\r\n"
	tail := base64.StdEncoding.EncodeToString(chunk[:size%57]) + "\r\n"
	head := string(crlf("From: Voice <voice@example.com>\nSubject: long recording\nContent-Type: multipart/mixed; boundary=big\n\n--big\nContent-Type: text/plain\n\nsee attachment\n--big\nContent-Type: audio/mpeg\nContent-Disposition: attachment; filename=\"long.mp3\"\nContent-Transfer-Encoding: base64\n\n"))
	return io.MultiReader(strings.NewReader(head), newRepeatReader(line, size/57),
		strings.NewReader(tail+"--big\r\nContent-Type: text/plain\r\n\r\nafter\r\n--big--\r\n"))
}

// TestFiftyMegabyteAttachmentStreams checks that a too-large attachment is
// counted, not held: the bytes allocated while parsing stay well below the
// attachment's size (reading it whole would allocate more than its size).
func TestFiftyMegabyteAttachmentStreams(t *testing.T) {
	tests := []struct {
		name     string
		size     int
		lim      Limits
		maxAlloc uint64
	}{
		{"50 MB, default 25 MiB limit", 50_000_000, Limits{}, 40 << 20},
		{"10 MB, 1 MiB limit", 10_000_000, Limits{MaxAttachmentBytes: 1 << 20}, 6 << 20},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			m, err := ParseReader(bigMail(tc.size), tc.lim)
			runtime.ReadMemStats(&after)
			if err != nil {
				t.Fatal(err)
			}
			if len(m.Attachments) != 1 {
				t.Fatalf("Attachments = %+v", m.Attachments)
			}
			a := m.Attachments[0]
			if a.Size != int64(tc.size) || a.Data != nil || !a.Truncated || a.Filename != "long.mp3" {
				t.Errorf("attachment = %+v", a)
			}
			if m.Text != "see attachment\nafter" || !hasProblem(m, fmt.Sprintf("%d bytes", tc.size)) {
				t.Errorf("Text = %q, Problems = %q", m.Text, m.Problems)
			}
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > tc.maxAlloc {
				t.Errorf("parsing allocated %d MiB, want at most %d MiB: the attachment is being held", alloc>>20, tc.maxAlloc>>20)
			}
		})
	}
}

func TestAttachmentWithinLimitKept(t *testing.T) {
	const size = 3_000_000
	m, err := ParseReader(bigMail(size), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Audio()) != 1 || len(m.Audio()[0].Data) != size || m.Audio()[0].Size != size || m.Audio()[0].Data[57] != 0 || m.Audio()[0].Data[58] != 7 {
		t.Fatalf("Audio = %+v", m.Attachments)
	}
}

// mutate returns a damaged copy of a valid mail, the way real transfers,
// spammers and broken clients damage them.
func mutate(r *rand.Rand, src []byte) []byte {
	b := slices.Clone(src)
	for range 1 + r.IntN(4) {
		if len(b) == 0 {
			b = append(b, byte(r.IntN(256)))
			continue
		}
		i := r.IntN(len(b))
		switch r.IntN(9) {
		case 0: // flip bytes
			for j := 0; j < 1+r.IntN(8) && i+j < len(b); j++ {
				b[i+j] = byte(r.IntN(256))
			}
		case 1: // cut off the end
			b = b[:i]
		case 2: // delete a range
			b = append(b[:i], b[min(len(b), i+r.IntN(64)):]...)
		case 3: // duplicate a range
			j := min(len(b), i+r.IntN(200))
			b = slices.Insert(b, j, b[i:j]...)
		case 4: // insert MIME syntax
			tokens := []string{"\r\n--", "\r\n\r\n", "boundary=", "=?utf-8?b?", "?=", "charset=x-foo", ";", "\"", "=\r\n", "Content-Type: multipart/mixed; boundary=a\r\n", "\n--a\n", "--a--", "<", ">", "\x00", "\xff\xfe"}
			b = slices.Insert(b, i, []byte(tokens[r.IntN(len(tokens))])...)
		case 5: // random garbage
			g := make([]byte, r.IntN(40))
			for k := range g {
				g[k] = byte(r.IntN(256))
			}
			b = slices.Insert(b, i, g...)
		case 6: // line ends
			b = bytes.ReplaceAll(b, []byte("\r\n"), []byte("\n"))
		case 7: // drop the blank line between header and body
			b = bytes.Replace(b, []byte("\r\n\r\n"), []byte("\r\n"), 1)
		case 8: // swap two halves
			b = append(slices.Clone(b[i:]), b[:i]...)
		}
	}
	return b
}

// TestGarbageNeverPanics feeds 1,000 damaged mails (fixed seed, so a
// failure reproduces) and checks the promises that hold for any input.
func TestGarbageNeverPanics(t *testing.T) {
	r := rand.New(rand.NewPCG(2026, 6))
	var seeds [][]byte
	for _, tc := range parseCases {
		if len(tc.raw) > 0 {
			seeds = append(seeds, tc.raw)
		}
	}
	for i := range 1000 {
		raw := mutate(r, seeds[r.IntN(len(seeds))])
		lim := Limits{}
		if i%3 == 0 {
			lim = Limits{MaxAttachmentBytes: int64(r.IntN(64)) + 1, MaxTextBytes: int64(r.IntN(64)) + 1}
		}
		m, err := Parse(raw, lim)
		if m == nil {
			t.Fatalf("mail %d: nil Message (err %v) for %q", i, err, raw)
		}
		checkInvariants(t, m, lim)
		if t.Failed() {
			t.Fatalf("mail %d: %q", i, raw)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, tc := range parseCases {
		f.Add(tc.raw, int64(0), int64(0))
	}
	f.Add([]byte("From: a@b\r\n\r\n"), int64(3), int64(5))
	f.Fuzz(func(t *testing.T, raw []byte, maxAtt, maxText int64) {
		lim := Limits{MaxAttachmentBytes: maxAtt % (1 << 16), MaxTextBytes: maxText % (1 << 16)}
		m, err := Parse(raw, lim)
		if m == nil {
			t.Fatalf("nil Message (err %v)", err)
		}
		checkInvariants(t, m, lim)
	})
}

func TestHTMLText(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"empty", "", ""},
		{"plain text", "just text", "just text"},
		{"unclosed head still shows the text", "<html><head><title>T</title><p>Hello there", "Hello there"},
		{"br and entities", "a&lt;b<br>c&#x27;d", "a<b\nc'd"},
		{"script never closed hides only script", "<p>x</p><script>var a = '<p>y</p>';", "x"},
		{"self-closing script hides what follows, as in a browser", "<p>shown</p><script/><p>hidden</p>", "shown"},
		{"style inside body", "<body><style>.a{}</style><div>a</div><div>b</div></body>", "a\n\nb"},
		{"zero-width padding", "Hi\u200c\u00a0\u034f there", "Hi there"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := HTMLText(tc.in); got != tc.want {
				t.Errorf("HTMLText(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

func TestBodyTextPrefersText(t *testing.T) {
	m := &Message{Text: "plain", HTML: "<p>html</p>"}
	if m.BodyText() != "plain" {
		t.Errorf("BodyText = %q", m.BodyText())
	}
	m.Text = " \r\n"
	if m.BodyText() != "html" {
		t.Errorf("BodyText with blank Text = %q", m.BodyText())
	}
}

func BenchmarkParseNested(b *testing.B) {
	i := slices.IndexFunc(parseCases, func(c struct {
		name    string
		raw     []byte
		lim     Limits
		wantErr bool
		check   func(t *testing.T, m *Message)
	}) bool {
		return strings.HasPrefix(c.name, "nested multipart")
	})
	raw := parseCases[i].raw
	b.SetBytes(int64(len(raw)))
	for b.Loop() {
		if _, err := Parse(raw, Limits{}); err != nil {
			b.Fatal(err)
		}
	}
}

// TestFromDisplayAsReceived: the From address is shown as the header wrote
// it (quoted local part, case, escapes), while Addr stays normalised for
// matching.
func TestFromDisplayAsReceived(t *testing.T) {
	tests := []struct {
		name, from, addr, display string
	}{
		{"quoted local part with spaces", `"x' OR 1=1 --"@evil.com`, "x'or1=1--@evil.com", `"x' OR 1=1 --"@evil.com`},
		{"quoted local part in brackets", `Mallory <"x' OR 1=1 --"@Evil.com>`, "x'or1=1--@evil.com", `"x' OR 1=1 --"@Evil.com`},
		{"case kept", `Ann <Ann.Lee@Example.COM>`, "ann.lee@example.com", "Ann.Lee@Example.COM"},
		{"bare", `ann@example.com`, "ann@example.com", "ann@example.com"},
		{"quoted-pair", `"a\"b"@example.com`, `a"b@example.com`, `"a\"b"@example.com`},
		{"angle bracket inside the quoted name", `"Eve <ceo@example.com>" <eve@evil.test>`, "eve@evil.test", "eve@evil.test"},
		{"first of several", `ceo@example.com, Eve <eve@evil.test>`, "ceo@example.com", "ceo@example.com"},
		{"group", `Team: ann@example.com, bob@example.com;`, "ann@example.com", "ann@example.com"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := Parse(crlf("From: "+tt.from+"\nSubject: s\n\nx"), Limits{})
			if err != nil {
				t.Fatal(err)
			}
			if m.From.Addr != tt.addr || m.From.Display != tt.display {
				t.Errorf("From = %+v, want addr %q display %q", m.From, tt.addr, tt.display)
			}
		})
	}
}

// TestAttachmentIsAudio: the one audio table (the parser's Audio and the
// worker's "over the limit" notes both read it).
func TestAttachmentIsAudio(t *testing.T) {
	for _, tt := range []struct {
		filename, contentType string
		want                  bool
	}{
		{"memo", "audio/ogg", true},
		{"", "audio/x-whatever", true},
		{"Memo 12.M4A", "application/octet-stream", true},
		{"a.mp3", "application/octet-stream", true},
		{"a.wav", "", true},
		{"a.ogg", "", true},
		{"a.oga", "", true},
		{"a.opus", "", true},
		{"a.webm", "", true},
		{"a.mp4", "", true},
		{"a.mpga", "", true},
		{"a.mpeg", "", true},
		{"a.flac", "", true},
		{"a.aac", "", true},
		{"a.amr", "", true},
		{"report.pdf", "application/pdf", false},
		{"mp3", "application/octet-stream", false},
		{"a.mp3.txt", "text/plain", false},
		{"", "video/mp4", false},
	} {
		a := Attachment{Filename: tt.filename, ContentType: tt.contentType}
		if got := a.IsAudio(); got != tt.want {
			t.Errorf("Attachment{%q, %q}.IsAudio() = %v, want %v", tt.filename, tt.contentType, got, tt.want)
		}
	}
}
