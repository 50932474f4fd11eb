package llm

import (
	"bytes"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"gpuhost/simulator"
)

func TestTranscribe(t *testing.T) {
	ok := startSim(t, simulator.Options{})
	faulty := startSim(t, simulator.Options{TranscriptionFault: simulator.TranscriptionFaultError})
	memo := bytes.Repeat([]byte{0xff, 0xfb}, 24000) // 48000 bytes: 3 s at 128 kbit/s
	tests := []struct {
		name     string
		base     string
		maxBytes int64
		filename string
		data     []byte
		check    func(t *testing.T, tr Transcript, u Usage, err error)
	}{
		{"ok", ok, 0, "memo.mp3", memo, func(t *testing.T, tr Transcript, u Usage, err error) {
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(tr.Text, "[simulated transcript]") || tr.Seconds != 3 || tr.Filename != "memo.mp3" {
				t.Errorf("transcript %+v", tr)
			}
			if u.Kind != "transcription" || u.Model != "whisper-1" || u.AudioSeconds != 3 || u.Duration <= 0 {
				t.Errorf("usage %+v", u)
			}
		}},
		{"hostile filename", ok, 0, "..\\..\\evil\r\n\"x.m4a", []byte("tiny"), func(t *testing.T, tr Transcript, u Usage, err error) {
			if err != nil {
				t.Fatal(err)
			}
			if tr.Filename != "evilx.m4a" || tr.Seconds != 1 {
				t.Errorf("transcript %+v", tr)
			}
		}},
		{"server fault", faulty, 0, "memo.mp3", memo, func(t *testing.T, tr Transcript, u Usage, err error) {
			if err == nil || errors.Is(err, ErrAudioTooLarge) || !strings.Contains(err.Error(), "500") {
				t.Errorf("err %v, want the server's 500", err)
			}
		}},
		{"too large, no request", deadURL(t), 1000, "memo.mp3", make([]byte, 1001), func(t *testing.T, tr Transcript, u Usage, err error) {
			// A request to the dead URL would fail with connection refused.
			if !errors.Is(err, ErrAudioTooLarge) || !strings.Contains(err.Error(), "1001 bytes") {
				t.Errorf("err %v, want ErrAudioTooLarge", err)
			}
		}},
		{"at the limit is sent", ok, 1000, "memo.mp3", make([]byte, 1000), func(t *testing.T, tr Transcript, u Usage, err error) {
			if err != nil {
				t.Errorf("err %v", err)
			}
		}},
		{"empty", ok, 0, "memo.mp3", nil, func(t *testing.T, tr Transcript, u Usage, err error) {
			if err == nil || !strings.Contains(err.Error(), "empty") {
				t.Errorf("err %v", err)
			}
		}},
		{"endpoint down", deadURL(t), 0, "memo.mp3", memo, func(t *testing.T, tr Transcript, u Usage, err error) {
			if err == nil || errors.Is(err, ErrAudioTooLarge) {
				t.Errorf("err %v, want a transport error", err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr, err := NewTranscriber(TranscriberOptions{BaseURL: tt.base, MaxBytes: tt.maxBytes, Timeout: 30 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			got, u, err := tr.Transcribe(ctxT(t), tt.filename, tt.data)
			tt.check(t, got, u, err)
		})
	}
}

// TestTranscribeRequest checks the form the client sends: verbose_json (for
// the duration), the model, and the file.
func TestTranscribeRequest(t *testing.T) {
	rec := &recorder{}
	base := startSim(t, simulator.Options{})
	tr, err := NewTranscriber(TranscriberOptions{BaseURL: base, Model: "large-v3", HTTPClient: &http.Client{Transport: rec}})
	if err != nil {
		t.Fatal(err)
	}
	if _, u, err := tr.Transcribe(ctxT(t), "a.ogg", []byte("OggS....")); err != nil || u.Model != "large-v3" {
		t.Fatalf("usage %+v err %v", u, err)
	}
	paths, bodies := rec.requests()
	if len(paths) != 1 || paths[0] != "/v1/audio/transcriptions" {
		t.Fatalf("requests %v", paths)
	}
	for _, want := range []string{"verbose_json", "large-v3", `filename="a.ogg"`, "OggS...."} {
		if !bytes.Contains(bodies[0], []byte(want)) {
			t.Errorf("form lacks %q", want)
		}
	}
}

func TestSafeFilename(t *testing.T) {
	for in, want := range map[string]string{
		"memo.mp3": "memo.mp3", "": "audio", "..": "audio", "/": "audio", "a/b/c.wav": "c.wav",
		"C:\\x\\y.m4a": "y.m4a", "bad\x00\x07name.ogg": "badname.ogg",
		strings.Repeat("n", 300) + ".mp3": strings.Repeat("n", 196) + ".mp3",
	} {
		if got := safeFilename(in); got != want {
			t.Errorf("safeFilename(%q) = %q, want %q", in, got, want)
		}
	}
}
