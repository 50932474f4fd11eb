package demo

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gpuhost/triage/mail"
)

func TestSeedWritesTheSixSampleMailsOnce(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "maildir")
	created, err := Seed(dir)
	if err != nil || !created {
		t.Fatalf("Seed: created=%v err=%v", created, err)
	}
	ents, err := os.ReadDir(filepath.Join(dir, "new"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 6 {
		t.Fatalf("new/ holds %d mails, want 6", len(ents))
	}
	for _, sub := range []string{"cur", "tmp"} {
		if fi, err := os.Stat(filepath.Join(dir, sub)); err != nil || !fi.IsDir() {
			t.Fatalf("%s/ missing: %v", sub, err)
		}
	}
	// A second Seed leaves an existing maildir alone (the demo's checkpoint
	// refers to it).
	if err := os.Remove(filepath.Join(dir, "new", ents[0].Name())); err != nil {
		t.Fatal(err)
	}
	created, err = Seed(dir)
	if err != nil || created {
		t.Fatalf("second Seed: created=%v err=%v", created, err)
	}
	if ents2, _ := os.ReadDir(filepath.Join(dir, "new")); len(ents2) != 5 {
		t.Fatalf("second Seed rewrote the maildir: %d mails", len(ents2))
	}
}

// The samples must exercise what the demo promises: each one parses, and
// the features they stand for are present in the parsed form.
func TestSamplesCoverThePipeline(t *testing.T) {
	names, raw, err := Mails()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*mail.Message{}
	for i, n := range names {
		m, err := mail.Parse(raw[i], mail.Limits{})
		if err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		byName[n] = m
	}
	if m := byName["02-newsletter-list-unsubscribe.eml"]; !strings.Contains(m.ListUnsubscribe, "https://news.toolvendor.example/u/4711?list=weekly&sig=Zm9v%2Bbar") {
		t.Errorf("newsletter List-Unsubscribe = %q", m.ListUnsubscribe)
	}
	if m := byName["03-newsletter-html-only.eml"]; m.ListUnsubscribe != "" || !strings.Contains(m.HTML, "abmelden") {
		t.Errorf("HTML-only newsletter: List-Unsubscribe %q, html has abmelden: %v", m.ListUnsubscribe, strings.Contains(m.HTML, "abmelden"))
	}
	if m := byName["05-priority-mailbox.eml"]; len(m.DeliveredTo) == 0 || m.DeliveredTo[0] != "urgent@ourcompany.example" {
		t.Errorf("priority mail Delivered-To = %v", m.DeliveredTo)
	}
	if m := byName["06-voice-memo.eml"]; len(m.Audio()) != 1 || len(m.Audio()[0].Data) < 16000 {
		t.Errorf("voice memo audio = %+v", m.Audio())
	}
}
