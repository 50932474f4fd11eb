package panel

import (
	"context"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gpuhost/config"
	"gpuhost/internal/testkit"
	"gpuhost/simulator"
	"gpuhost/simulator/simtest"
	"gpuhost/triage"
	"gpuhost/triage/customer"
	"gpuhost/triage/demo"
	"gpuhost/triage/llm"
	"gpuhost/triage/sink"
	"gpuhost/triage/source"
)

// hostileMail is a mail whose sender and subject carry markup.
const hostileMail = "From: \"<b>Mallory</b>\" <mallory@attacker.example>\r\n" +
	"To: sales@ourcompany.example\r\n" +
	"Subject: <script>alert('subject')</script> invoice\r\n" +
	"Message-ID: <hostile@attacker.example>\r\n" +
	"Date: Mon, 30 Nov 2026 09:00:00 +0000\r\n" +
	"MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n" +
	"BODY-MUST-NOT-SHOW <script>alert('body')</script>\r\n"

// demoCRM knows the demo's customer inquiry sender, with a CRM link.
type demoCRM struct{}

func (demoCRM) Find(ctx context.Context, email string) (*customer.Customer, error) {
	if email != "anna.berger@mueller-gmbh.example" {
		return nil, nil
	}
	return &customer.Customer{ID: 17, Name: "Anna Berger", Email: email, Company: "Müller GmbH", URL: "https://crm.ourcompany.example/customers/17"}, nil
}

// realMailWorker is a real triage.Worker on the demo's Maildir (the six
// sample mails, then hostileMail as UID 7), classifying and transcribing
// on the in-process inference simulator, posting to a console sink, with
// the demo config's rules and prices; it has polled once.
func realMailWorker(t *testing.T) (*triage.Worker, *testkit.SyncBuffer) {
	t.Helper()
	base := simtest.Start(t, simulator.Options{
		Flavor: simulator.FlavorVLLM, Model: "qwen3-coder",
		LoadTime: time.Nanosecond, PrefillTPS: 2e6, DecodeTPS: 2e6, MaxNumSeqs: 8,
	}) + "/v1"
	cls, err := llm.NewClassifier(llm.ClassifierOptions{BaseURL: base, Model: "qwen3-coder", Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := llm.NewTranscriber(llm.TranscriberOptions{BaseURL: base, Model: "whisper-1", Timeout: 30 * time.Second, MaxBytes: 25 << 20})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	mdir := filepath.Join(dir, "Maildir")
	if _, err := demo.Seed(mdir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mdir, "new", "1796100000.M7P1.test"), []byte(hostileMail), 0o600); err != nil {
		t.Fatal(err)
	}
	md, err := source.NewMaildir(mdir)
	if err != nil {
		t.Fatal(err)
	}
	out := &testkit.SyncBuffer{} // the console sink, read while the worker writes
	w, err := triage.New(triage.Options{
		Source: md, Classifier: cls, Transcriber: tr, Customers: demoCRM{},
		Sinks: []sink.Sink{sink.NewConsole(out)},
		Rules: triage.Rules{PriorityMailboxes: []string{"urgent@ourcompany.example"}, InternalDomains: []string{"ourcompany.example"},
			AuthservID: "mx.ourcompany.example"},
		StateDir: filepath.Join(dir, "state"),
		Prices: config.TriageCostsConfig{Currency: "EUR", EnergyPerKWh: 0.30, TranscriptionPerMinute: 0.006,
			Models: map[string]config.ModelPrice{"qwen3-coder": {PromptPerMillion: 0.5, CompletionPerMillion: 1.5}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if n, err := w.Once(ctx); err != nil || n != 7 {
		t.Fatalf("first poll: %d mails, %v; want 7", n, err)
	}
	return w, out
}

// TestMailPageRealWorker shows a real worker's results on the page and
// runs a mail again through it: dry (nothing posted) and for real (the
// console sink gets the hand-run post), the checkpoint unmoved.
func TestMailPageRealWorker(t *testing.T) {
	w, out := realMailWorker(t)
	ev := newMailEnv(t, w, func(p *Panel) { p.now = time.Now })
	c, body, tok := ev.page(t)
	for _, want := range []string{
		"Offer for 40 additional licences?", "November newsletter: 10 tips for faster builds", "Planned maintenance on rack B4 tonight",
		`href="https://news.toolvendor.example/u/4711?list=weekly&amp;sig=Zm9v%2Bbar"`, // the List-Unsubscribe link, byte for byte
		`href="https://crm.ourcompany.example/customers/17"`, "Anna Berger",
		"priority mailbox", // the rule that set the importance of mail 5
		"&lt;script&gt;alert(&#39;subject&#39;)&lt;/script&gt; invoice", "&lt;b&gt;Mallory&lt;/b&gt;",
		dayOfNow(), `<td>7 <span class="muted">8 calls</span></td>`, // today's cost row: seven mails, seven classifications and one transcription
		`<dd id="cp-last-uid">7</dd>`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	for _, bad := range []string{"BODY-MUST-NOT-SHOW", "<script>alert", "<b>Mallory"} {
		if strings.Contains(body, bad) {
			t.Errorf("page shows %q", bad)
		}
	}
	posts := strings.Count(out.String(), "key: ")
	resp, body := do(t, c, "POST", ev.srv.URL+"/mail/rerun", url.Values{"uid": {"1"}, "csrf": {tok}}, nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `id="rerun-result"`) || !strings.Contains(body, "Offer for 40 additional licences?") ||
		!strings.Contains(body, "Nothing posted (dry run)") {
		t.Fatalf("dry rerun: %d\n%s", resp.StatusCode, body)
	}
	if got := strings.Count(out.String(), "key: "); got != posts {
		t.Errorf("a dry rerun posted: %d posts, was %d", got, posts)
	}
	resp, body = do(t, c, "POST", ev.srv.URL+"/mail/rerun", url.Values{"uid": {"5"}, "dry_run": {"0"}, "csrf": {tok}}, nil)
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "Posted to console") {
		t.Fatalf("real rerun: %d\n%s", resp.StatusCode, body)
	}
	if !strings.Contains(out.String(), "key: manual/") {
		t.Errorf("the real rerun did not reach the console sink:\n%s", out.String())
	}
	if st := w.State(); st.Checkpoint.LastUID != 7 {
		t.Errorf("a rerun moved the checkpoint to %d", st.Checkpoint.LastUID)
	}
	if days := w.State().Checkpoint.Costs; len(days) != 1 || days[0].Mails != 9 {
		t.Errorf("cost tally after 7 mails and 2 reruns = %+v, want one day of 9", days)
	}
}

// dayOfNow is today's row in the cost tally (UTC).
func dayOfNow() string { return time.Now().UTC().Format(time.DateOnly) }
