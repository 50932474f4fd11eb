package simulator

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// audioForm builds a multipart transcription body; a nil file leaves the
// file part out.
func audioForm(t testing.TB, file []byte, fields map[string]string) (string, []byte) {
	t.Helper()
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	for k, v := range fields {
		if err := mw.WriteField(k, v); err != nil {
			t.Fatal(err)
		}
	}
	if file != nil {
		fw, err := mw.CreateFormFile("file", "memo.mp3")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := fw.Write(file); err != nil {
			t.Fatal(err)
		}
	}
	if err := mw.Close(); err != nil {
		t.Fatal(err)
	}
	return mw.FormDataContentType(), b.Bytes()
}

func postAudio(t *testing.T, url, contentType string, body []byte) (int, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/audio/transcriptions", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", contentType)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST transcriptions: %v", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, data
}

func TestTranscription(t *testing.T) {
	for _, f := range []Flavor{FlavorVLLM, FlavorOllama} {
		t.Run(string(f), func(t *testing.T) {
			sim := startSim(t, Options{Flavor: f, Model: "m"})
			audio := bytes.Repeat([]byte{0xff}, 48000) // 3 s at 128 kbit/s
			tests := []struct {
				name   string
				fields map[string]string
				file   []byte
				status int
				check  func(t *testing.T, body []byte)
			}{
				{"json default", map[string]string{"model": "whisper-1"}, audio, 200, func(t *testing.T, body []byte) {
					v := decode[struct {
						Text  string
						Usage struct {
							Type    string
							Seconds int
						}
					}](t, body)
					if !strings.HasPrefix(v.Text, "[simulated transcript]") || v.Usage.Type != "duration" || v.Usage.Seconds != 3 {
						t.Errorf("json reply %s", body)
					}
				}},
				{"text", map[string]string{"model": "whisper-1", "response_format": "text"}, audio, 200, func(t *testing.T, body []byte) {
					if !strings.HasPrefix(string(body), "[simulated transcript]") || !strings.HasSuffix(string(body), "order.\n") {
						t.Errorf("text reply %q", body)
					}
				}},
				{"verbose_json", map[string]string{"model": "whisper-1", "response_format": "verbose_json", "language": "de", "prompt": "Müller"}, audio, 200, func(t *testing.T, body []byte) {
					v := decode[struct {
						Task     string
						Language string
						Duration float64
						Text     string
						Segments []audioSegment
					}](t, body)
					if v.Task != "transcribe" || v.Language != "german" || v.Duration != 3 || len(v.Segments) != 3 {
						t.Fatalf("verbose reply %s", body)
					}
					var joined string
					for i, s := range v.Segments {
						joined += s.Text
						if s.ID != i || s.End < s.Start || len(s.Tokens) == 0 {
							t.Errorf("segment %+v", s)
						}
					}
					if joined != v.Text || v.Segments[2].End != v.Duration {
						t.Errorf("segments do not add up to the text/duration: %s", body)
					}
				}},
				{"srt", map[string]string{"model": "whisper-1", "response_format": "srt"}, audio, 200, func(t *testing.T, body []byte) {
					if !strings.HasPrefix(string(body), "1\n00:00:00,000 --> ") {
						t.Errorf("srt reply %q", body)
					}
				}},
				{"vtt", map[string]string{"model": "whisper-1", "response_format": "vtt"}, audio, 200, func(t *testing.T, body []byte) {
					if !strings.HasPrefix(string(body), "WEBVTT\n\n00:00:00.000 --> ") {
						t.Errorf("vtt reply %q", body)
					}
				}},
				{"tiny file is one second", map[string]string{"model": "whisper-1", "response_format": "verbose_json"}, []byte("x"), 200, func(t *testing.T, body []byte) {
					if v := decode[struct{ Duration float64 }](t, body); v.Duration != 1 {
						t.Errorf("duration %v, want 1", v.Duration)
					}
				}},
				{"missing file", map[string]string{"model": "whisper-1"}, nil, 400, wantAudioError("field required", "invalid_request_error")},
				{"missing model", nil, audio, 400, wantAudioError("model parameter", "invalid_request_error")},
				{"empty file", map[string]string{"model": "whisper-1"}, []byte{}, 400, wantAudioError("too short", "invalid_request_error")},
				{"bad format", map[string]string{"model": "whisper-1", "response_format": "mp3"}, audio, 400, wantAudioError("Invalid response_format", "invalid_request_error")},
				{"bad language", map[string]string{"model": "whisper-1", "language": "German"}, audio, 400, wantAudioError("ISO-639-1", "invalid_request_error")},
			}
			for _, tt := range tests {
				t.Run(tt.name, func(t *testing.T) {
					ct, body := audioForm(t, tt.file, tt.fields)
					code, data := postAudio(t, sim.base, ct, body)
					if code != tt.status {
						t.Fatalf("status %d, want %d: %s", code, tt.status, truncate(data))
					}
					tt.check(t, data)
				})
			}
			code, data := postAudio(t, sim.base, "application/json", []byte(`{"file":"x"}`))
			if code != 400 {
				t.Errorf("JSON body: status %d: %s", code, data)
			}
		})
	}
}

func wantAudioError(msg, typ string) func(t *testing.T, body []byte) {
	return func(t *testing.T, body []byte) {
		t.Helper()
		v := decode[openAIError](t, body)
		if !strings.Contains(v.Error.Message, msg) || v.Error.Type != typ || v.Error.Code != nil {
			t.Errorf("error %s, want %q of type %s", body, msg, typ)
		}
	}
}

func TestTranscriptionTooLarge(t *testing.T) {
	sim := startSim(t, Options{Flavor: FlavorVLLM, Model: "m"})
	ct, body := audioForm(t, make([]byte, maxTranscriptionBytes+1), map[string]string{"model": "whisper-1"})
	code, data := postAudio(t, sim.base, ct, body)
	if code != http.StatusRequestEntityTooLarge {
		t.Fatalf("status %d: %s", code, truncate(data))
	}
	wantAudioError("Maximum content size limit (26214400) exceeded", "server_error")(t, data)
	// Just below the limit (the form's own bytes included) is accepted.
	ct, body = audioForm(t, make([]byte, maxTranscriptionBytes-1024), map[string]string{"model": "whisper-1"})
	if code, data := postAudio(t, sim.base, ct, body); code != http.StatusOK {
		t.Fatalf("25 MiB - 1 KiB: status %d: %s", code, truncate(data))
	}
}

func TestTranscriptionFault(t *testing.T) {
	sim := startSim(t, Options{Flavor: FlavorVLLM, Model: "m", TranscriptionFault: TranscriptionFaultError})
	ct, body := audioForm(t, []byte("abc"), map[string]string{"model": "whisper-1"})
	code, data := postAudio(t, sim.base, ct, body)
	if code != http.StatusInternalServerError {
		t.Fatalf("status %d: %s", code, data)
	}
	wantAudioError("server had an error", "server_error")(t, data)
	// Form errors still come first.
	ct, body = audioForm(t, nil, map[string]string{"model": "whisper-1"})
	if code, _ := postAudio(t, sim.base, ct, body); code != http.StatusBadRequest {
		t.Errorf("missing file with fault: status %d, want 400", code)
	}
}

// TestTranscriptionCancelled: a request whose context ends during the
// simulated processing gets 503, not a transcript.
func TestTranscriptionCancelled(t *testing.T) {
	s := fuzzServer(t, FlavorVLLM)
	ct, body := audioForm(t, make([]byte, 16000*60), map[string]string{"model": "whisper-1"})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/audio/transcriptions", bytes.NewReader(body))
	req.Header.Set("Content-Type", ct)
	rec := httptest.NewRecorder()
	s.handleTranscription(rec, req)
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
}

// FuzzTranscriptionForm drives arbitrary multipart bodies through the
// handler: no panic, a JSON error or a transcript.
func FuzzTranscriptionForm(f *testing.F) {
	ct, body := audioForm(f, []byte("abc"), map[string]string{"model": "whisper-1", "response_format": "verbose_json"})
	boundary := strings.TrimPrefix(ct, "multipart/form-data; boundary=")
	f.Add(boundary, body)
	f.Add(boundary, []byte("--"+boundary+"\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nx\r\n--"+boundary+"--\r\n"))
	f.Add("b", []byte("--b\r\n\r\n--b--"))
	f.Add("", []byte{})
	s := fuzzServer(f, FlavorVLLM)
	f.Fuzz(func(t *testing.T, boundary string, body []byte) {
		req := httptest.NewRequest(http.MethodPost, "/v1/audio/transcriptions", bytes.NewReader(body))
		req.Header.Set("Content-Type", "multipart/form-data; boundary="+boundary)
		rec := httptest.NewRecorder()
		s.handleTranscription(rec, req)
		if rec.Code != http.StatusOK {
			var e openAIError
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Error.Message == "" {
				t.Fatalf("status %d with body %q", rec.Code, rec.Body)
			}
		}
	})
}
