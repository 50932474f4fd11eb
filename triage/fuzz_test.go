package triage

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gpuhost/triage/demo"
	"gpuhost/triage/sink"
)

// fuzzWorker runs the whole pipeline except the network: fake model and
// transcriber, a recording sink.
func fuzzWorker(t testing.TB) *Worker {
	w, err := New(Options{
		Source: &memSource{uidValidity: 1}, Classifier: &fakeClassifier{}, Transcriber: fakeTranscriber{},
		Sinks:    []sink.Sink{&recSink{name: "rec"}},
		Rules:    Rules{PriorityMailboxes: []string{"ceo@example.com"}, InternalDomains: []string{"example.com"}},
		StateDir: t.TempDir(), KeepResults: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// checkResult holds for every mail, however broken: it is judged (never
// dropped) and nothing from it can break a post's lines.
func checkResult(t testing.TB, res Result, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("ProcessRaw: %v (a broken mail must be judged, not fail)", err)
	}
	if res.Key == "" || res.Class == "" || res.Text == "" {
		t.Fatalf("incomplete result %+v", res)
	}
	for _, s := range []string{res.From, res.Subject, res.Post.CustomerName} {
		if strings.ContainsAny(s, "\r\n\x00") {
			t.Fatalf("control characters survived into %q", s)
		}
	}
}

func FuzzProcessRaw(f *testing.F) {
	_, raws, err := demo.Mails()
	if err != nil {
		f.Fatal(err)
	}
	for _, r := range raws {
		f.Add(r)
	}
	for _, r := range badInputMails(false) {
		f.Add(r)
	}
	f.Add([]byte(""))
	f.Add([]byte("\r\n\r\n"))
	f.Add([]byte("Content-Type: multipart/mixed; boundary=x\r\n\r\n--x\r\nContent-Type: audio/mpeg\r\n\r\nID3\r\n--x--"))
	w := fuzzWorker(f)
	f.Fuzz(func(t *testing.T, raw []byte) {
		res, err := w.ProcessRaw(context.Background(), raw, true)
		checkResult(t, res, err)
	})
}

// TestThousandGarbageMails: the 1,000 random/garbage MIME messages
// never crash the worker; each is judged and posted.
func TestThousandGarbageMails(t *testing.T) {
	_, raws, err := demo.Mails()
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	w := fuzzWorker(t)
	for i := range 1000 {
		var raw []byte
		switch i % 3 {
		case 0: // pure noise
			raw = make([]byte, rng.IntN(4096))
			for j := range raw {
				raw[j] = byte(rng.UintN(256))
			}
		default: // a real mail with bytes flipped, cut or duplicated
			raw = append([]byte(nil), raws[rng.IntN(len(raws))]...)
			for range 1 + rng.IntN(20) {
				if len(raw) == 0 {
					break
				}
				p := rng.IntN(len(raw))
				switch rng.IntN(3) {
				case 0:
					raw[p] = byte(rng.UintN(256))
				case 1:
					raw = raw[:p]
				default:
					raw = append(raw[:p], append([]byte("\r\n--m1\r\nContent-Type: text/html; charset=x-bogus\r\n\r\n<a href=x>"), raw[p:]...)...)
				}
			}
		}
		res, err := w.ProcessRaw(context.Background(), raw, false)
		checkResult(t, res, err)
	}
	if got := len(w.o.Sinks[0].(*recSink).Posts()); got != 1000 {
		t.Errorf("%d of 1000 garbage mails posted", got)
	}
}

// FuzzCheckpoint: whatever is in the checkpoint file (a disk error, a hand
// edit), loading never panics, and what loads saves and loads back the same.
func FuzzCheckpoint(f *testing.F) {
	f.Add([]byte(`{"mailbox":"imap://u@h/INBOX","uidvalidity":7,"last_uid":42}`))
	f.Add([]byte(`{"uidvalidity":7,"last_uid":42,"inflight":{"uid":43,"key":"k/7/43","since":"2026-11-30T08:00:00Z","posted":["slack"]}}`))
	f.Add([]byte(`{"inflight":{"uid":1}}`))
	f.Add([]byte(`{"last_uid":-1}`))
	f.Add([]byte(``))
	f.Add([]byte(`null`))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(dir, "c.json")
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := loadCheckpoint(p)
		if err != nil {
			return
		}
		if err := saveCheckpoint(p, c); err != nil {
			t.Fatal(err)
		}
		back, err := loadCheckpoint(p)
		if err != nil {
			t.Fatalf("saved checkpoint does not load: %v", err)
		}
		if back.LastUID != c.LastUID || back.UIDValidity != c.UIDValidity || (back.Inflight == nil) != (c.Inflight == nil) {
			t.Fatalf("round trip changed %+v into %+v", c, back)
		}
	})
}
