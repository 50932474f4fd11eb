package triage

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gpuhost/internal/pairing"
	"gpuhost/internal/telegramtest"
	"gpuhost/internal/testkit"
	"gpuhost/simulator"
	"gpuhost/simulator/simtest"
	"gpuhost/triage/demo"
	"gpuhost/triage/llm"
	"gpuhost/triage/sink"
	"gpuhost/triage/sink/slacktest"
	"gpuhost/triage/source"
)

// simModel is the served name of the test simulator.
const simModel = "qwen3-triage"

// startSim runs the real inference simulator (what runs behind
// `gpuhost simulate vllm serve`) in this process with fast rates, and
// returns its OpenAI base URL (".../v1"). The faults are --schema-fault and
// --transcription-fault. In-process rather than the gpuhost binary, so
// these tests do not depend on every other package of the binary building.
func startSim(t testing.TB, schemaFault, transcriptionFault string) string {
	t.Helper()
	return simtest.Start(t, simulator.Options{
		Flavor: simulator.FlavorVLLM, Model: simModel,
		LoadTime: time.Nanosecond, PrefillTPS: 2e6, DecodeTPS: 2e6, MaxNumSeqs: 64,
		SchemaFault: schemaFault, TranscriptionFault: transcriptionFault,
	}) + "/v1"
}

// realPieces are the classifier and transcriber against the simulator.
func realPieces(t testing.TB, base string) (*llm.Classifier, *llm.Transcriber) {
	t.Helper()
	c, err := llm.NewClassifier(llm.ClassifierOptions{BaseURL: base, Model: simModel, Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := llm.NewTranscriber(llm.TranscriberOptions{BaseURL: base, Model: "whisper-1", Timeout: 30 * time.Second, MaxBytes: 25 << 20})
	if err != nil {
		t.Fatal(err)
	}
	return c, tr
}

// newTelegram is the Telegram sink against the fake Bot API with one paired
// chat (the real pairing store), so posts have somewhere to go.
func newTelegram(t testing.TB, f *telegramtest.Fake, stateDir string, chat int64) *sink.Telegram {
	t.Helper()
	st := pairing.New(stateDir)
	out, err := st.Request(pairing.Sender{UserID: chat, ChatID: chat, Username: "operator"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Approve(out.Code); err != nil {
		t.Fatal(err)
	}
	s, err := sink.NewTelegram(sink.TelegramOptions{
		Token: func() (string, error) { return f.Token(), nil }, APIURL: f.URL(), StateDir: stateDir, Timeout: 10 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newSlack(t testing.TB, f *slacktest.Fake) *sink.Slack {
	t.Helper()
	s, err := sink.NewSlack(sink.SlackOptions{
		Token: func() (string, error) { return f.Token(), nil }, APIURL: f.URL(),
		Channel: "C0TRIAGE", ImportantChannel: "C0IMPORTANT", Timeout: 10 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// writeMaildir puts raw mails into dir's new/ in the given order.
func writeMaildir(t testing.TB, dir string, start int, mails ...[]byte) {
	t.Helper()
	for _, sub := range []string{"tmp", "cur", "new"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	for i, raw := range mails {
		name := fmt.Sprintf("%d.M%dP1.test", 1796100000+start+i, start+i)
		if err := os.WriteFile(filepath.Join(dir, "new", name), raw, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// Bad input of the issue, each processed (posted) with a problem noted.
// The "fifty-mb-memo" carries a 50 MB (huge) or 50 kB audio attachment.
func badInputMails(huge bool) map[string][]byte {
	lines := 50 << 10 / 57 // 57 bytes of data per 76-character base64 line
	if huge {
		lines = 50 << 20 / 57
	}
	line := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{0xff, 0xfb, 0x90}, 19)) + "\r\n"
	wrapped := strings.Repeat(line, lines)
	return map[string][]byte{
		"broken-mime": []byte("From: a@broken.test\r\nTo: sales@ourcompany.example\r\nSubject: broken mime order\r\n" +
			"MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=\"nope\"\r\n\r\n--nope\r\nContent-Type: text/plain\r\n" +
			"Content-Transfer-Encoding: base64\r\n\r\n!!!not base64!!!\r\n--nope\r\nContent-Type: text/plain; charset=x-unknown-9\r\n\r\n\xff\xfe order\r\n"),
		"unknown-charset": []byte("From: b@charset.test\r\nTo: sales@ourcompany.example\r\nSubject: =?x-klingon?q?Qapla=FF?=\r\n" +
			"Content-Type: text/plain; charset=x-klingon\r\n\r\nHab SoSlI' Quch \xe4\xf6\xfc invoice\r\n"),
		"fifty-mb-memo": []byte("From: c@big.test\r\nTo: sales@ourcompany.example\r\nSubject: huge voice memo\r\nMIME-Version: 1.0\r\n" +
			"Content-Type: multipart/mixed; boundary=\"b\"\r\n\r\n--b\r\nContent-Type: text/plain\r\n\r\nSee the memo about my order.\r\n" +
			"--b\r\nContent-Type: audio/mpeg\r\nContent-Disposition: attachment; filename=\"big.mp3\"\r\nContent-Transfer-Encoding: base64\r\n\r\n" +
			wrapped + "--b--\r\n"),
		"html-only": []byte("From: d@html.test\r\nTo: sales@ourcompany.example\r\nSubject: html only\r\nContent-Type: text/html; charset=utf-8\r\n\r\n" +
			"<html><head><style>p{}</style></head><body><p>Our <b>order</b> 4711 is late.</p></body></html>\r\n"),
		"crlf-injection": []byte("From: e@inject.test\r\nTo: sales@ourcompany.example\r\nSubject: =?utf-8?q?hi=0D=0ABcc:_victim@x.test=0D=0A=0D=0A<!channel>?=\r\n" +
			"Content-Type: text/plain\r\n\r\nurgent\r\n"),
		"bare-lf": []byte("From: f@lf.test\nTo: sales@ourcompany.example\nSubject: bare LF headers\n\nA customer question.\n"),
		"garbage": []byte("\x00\x01\x02 this is not a mail at all \xff\xfe\r\n\r\n\r\n"),
	}
}

func TestPipelineAgainstSimulator(t *testing.T) {
	if testing.Short() {
		t.Skip("builds gpuhost and runs the simulator")
	}
	base := startSim(t, "", "")
	cls, tr := realPieces(t, base)
	fake := slacktest.New(t)
	dir := t.TempDir()
	mdir := filepath.Join(dir, "Maildir")
	if _, err := demo.Seed(mdir); err != nil {
		t.Fatal(err)
	}
	bad := badInputMails(true)
	names := []string{"broken-mime", "unknown-charset", "fifty-mb-memo", "html-only", "crlf-injection", "bare-lf", "garbage"}
	var raws [][]byte
	for _, n := range names {
		raws = append(raws, bad[n])
	}
	writeMaildir(t, mdir, 1000, raws...)
	md, err := source.NewMaildir(mdir)
	if err != nil {
		t.Fatal(err)
	}
	tg := telegramtest.New(t)
	const chat = 4242
	w, err := New(Options{
		Source: md, Classifier: cls, Transcriber: tr,
		Sinks:    []sink.Sink{newSlack(t, fake), newTelegram(t, tg, filepath.Join(dir, "state"), chat)},
		Rules:    Rules{PriorityMailboxes: []string{"urgent@ourcompany.example"}, InternalDomains: []string{"ourcompany.example"}, AuthservID: "mx.ourcompany.example"},
		StateDir: filepath.Join(dir, "state"), Log: testLogger(t),
		// The default 30 MiB limit: the 50 MB memo is judged from its headers.
		MaxMessageBytes: 30 << 20,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	n, err := w.Once(ctx)
	if err != nil {
		t.Fatal(err)
	}
	total := 6 + len(names)
	if n != total {
		t.Fatalf("processed %d mails, want %d", n, total)
	}
	rs := w.Recent()
	byUID := map[uint32]Result{}
	for _, r := range rs {
		byUID[r.UID] = r
		if c := fake.CountKeyIn("C0TRIAGE", r.Key); c != 1 {
			t.Errorf("%s (%q) reached the Slack channel %d times, want once", r.Key, r.Subject, c)
		}
		if c := fake.CountKeyIn("C0IMPORTANT", r.Key); c != map[bool]int{true: 1}[r.Important] {
			t.Errorf("%s (%q, importance %d) reached the important channel %d times", r.Key, r.Subject, r.Importance, c)
		}
	}
	// The demo mails, UIDs 1..6 in delivery order.
	check := func(uid uint32, what string, ok bool) {
		t.Helper()
		if !ok {
			t.Errorf("UID %d (%q): %s; result %+v", uid, byUID[uid].Subject, what, byUID[uid])
		}
	}
	r := byUID[2]
	check(2, "newsletter: the header link byte for byte, one-click",
		r.Unsubscribe.URL == "https://news.toolvendor.example/u/4711?list=weekly&sig=Zm9v%2Bbar" && r.Unsubscribe.OneClick && r.Unsubscribe.Source == "header")
	r = byUID[3]
	check(3, "html-only newsletter: promotional with the HTML abmelden link",
		r.Class == "promotional" && r.Unsubscribe.Source == "html" && strings.Contains(r.Unsubscribe.URL, "newsletter/abmelden"))
	r = byUID[4]
	check(4, "internal sender → 1 with the rule", r.Importance == 1 && strings.Contains(r.Rule, "internal"))
	r = byUID[5]
	check(5, "priority mailbox → 10 with the rule, important",
		r.Importance == 10 && strings.Contains(r.Rule, "urgent@ourcompany.example") && r.Important)
	r = byUID[6]
	check(6, "voice memo transcribed", len(r.Transcribed) == 1 && r.TranscriptNote == "" && r.Cost.AudioSeconds > 0)
	if !strings.Contains(r.Post.Transcript, " ") {
		t.Errorf("voice memo post has no transcript excerpt: %q", r.Post.Transcript)
	}
	for uid := uint32(1); uid <= 6; uid++ {
		r := byUID[uid]
		check(uid, "classified with cost", r.Class != "" && r.Class != ClassUnclassified && r.Cost.PromptTokens > 0)
	}
	// Bad input: every one posted, the problems noted where there were any.
	for i, name := range names {
		uid := uint32(7 + i)
		r, ok := byUID[uid]
		if !ok {
			t.Errorf("%s: no result", name)
			continue
		}
		if strings.ContainsAny(r.Subject+r.From, "\r\n") {
			t.Errorf("%s: CR/LF survived into the post: %q", name, r.Subject)
		}
		switch name {
		case "fifty-mb-memo":
			check(uid, "50 MB mail: judged from its headers, the post says why",
				len(r.Problems) > 0 && strings.Contains(r.Problems[0], "headers only") && r.Subject == "huge voice memo")
		case "broken-mime", "unknown-charset":
			check(uid, "problems noted", len(r.Problems) > 0)
		case "html-only":
			check(uid, "html-only judged from its HTML text", r.Class == "customer")
		}
	}
	// The checkpoint is the last UID.
	if c := readCheckpoint(t, w); c.LastUID != uint32(total) || c.Inflight != nil {
		t.Errorf("checkpoint = %+v, want last_uid %d", c, total)
	}
	// Telegram got every post, as plain text carrying the key.
	sent := tg.SentTo(chat)
	if len(sent) != total {
		t.Errorf("Telegram got %d messages, want %d", len(sent), total)
	}
	for _, txt := range sent {
		if strings.Contains(txt, "Bcc: victim") && strings.Contains(txt, "\nBcc:") {
			t.Errorf("CRLF injection reached Telegram as a line of its own:\n%s", txt)
		}
	}
	// Important posts went to the important channel as well.
	if got := fake.CountKeyIn("C0IMPORTANT", byUID[5].Key); got != 1 {
		t.Errorf("priority mail in the important channel %d times, want 1", got)
	}
}

func TestModelFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("builds gpuhost and runs the simulator")
	}
	tests := []struct {
		name   string
		schema string // --schema-fault
		trans  string // --transcription-fault
		class  string // "" = any real class
		reason string // substring of the unclassified reason
		note   string // substring of the transcript note
	}{
		{"schema-violating reply is posted unclassified", "invalid", "", ClassUnclassified, "", ""},
		{"prose instead of JSON is posted unclassified", "prose", "", ClassUnclassified, "", ""},
		{"prose once is healed by the retry", "prose-once", "", "", "", ""},
		{"transcription failure is noted", "", "error", "", "", "transcription failed"},
	}
	_, raws, err := demo.Mails()
	if err != nil {
		t.Fatal(err)
	}
	memo := raws[5]
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := startSim(t, tt.schema, tt.trans)
			cls, tr := realPieces(t, base)
			fake := slacktest.New(t)
			dir := t.TempDir()
			writeMaildir(t, filepath.Join(dir, "md"), 0, memo)
			md, err := source.NewMaildir(filepath.Join(dir, "md"))
			if err != nil {
				t.Fatal(err)
			}
			w, err := New(Options{Source: md, Classifier: cls, Transcriber: tr, Sinks: []sink.Sink{newSlack(t, fake)},
				StateDir: filepath.Join(dir, "state"), Log: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if n, err := w.Once(ctx); n != 1 || err != nil {
				t.Fatalf("Once = %d, %v; want the mail posted, never dropped", n, err)
			}
			r := w.Recent()[0]
			if n := fake.CountKeyIn("C0TRIAGE", r.Key); n != 1 {
				t.Errorf("posted %d times, want once", n)
			}
			switch {
			case tt.class == ClassUnclassified && (r.Class != ClassUnclassified || r.Unclassified == ""):
				t.Errorf("class %q reason %q, want unclassified with a reason", r.Class, r.Unclassified)
			case tt.class == "" && (r.Class == ClassUnclassified || r.Class == ""):
				t.Errorf("class %q (%s), want a real class", r.Class, r.Unclassified)
			}
			if tt.note != "" && !strings.Contains(r.TranscriptNote, tt.note) {
				t.Errorf("transcript note %q lacks %q", r.TranscriptNote, tt.note)
			}
			if tt.note != "" && !strings.Contains(sink.Text(r.Post), tt.note) {
				t.Errorf("the post does not say the transcription failed:\n%s", sink.Text(r.Post))
			}
		})
	}
}

// TestModelEndpointDown: nothing listens; the mail stays for the next poll.
func TestModelEndpointDown(t *testing.T) {
	addr := testkit.FreeAddr(t)
	cls, err := llm.NewClassifier(llm.ClassifierOptions{BaseURL: "http://" + addr + "/v1", Model: simModel, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	fake := slacktest.New(t)
	dir := t.TempDir()
	_, raws, _ := demo.Mails()
	writeMaildir(t, filepath.Join(dir, "md"), 0, raws[0])
	md, err := source.NewMaildir(filepath.Join(dir, "md"))
	if err != nil {
		t.Fatal(err)
	}
	w, err := New(Options{Source: md, Classifier: cls, Sinks: []sink.Sink{newSlack(t, fake)}, StateDir: filepath.Join(dir, "state"), Log: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	n, err := w.Once(context.Background())
	if err == nil || n != 0 {
		t.Fatalf("Once = %d, %v; want an error and nothing processed", n, err)
	}
	if fake.PostCalls() != 0 || readCheckpoint(t, w).LastUID != 0 {
		t.Error("posted or advanced while the model was down")
	}
}
