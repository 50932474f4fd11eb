package simulator

import (
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"mime/multipart"
	"net/http"
	"strings"
	"time"
)

// POST /v1/audio/transcriptions, shaped like OpenAI's Whisper API (which
// vLLM also serves for speech models): a multipart form with file, model,
// response_format (json, text, verbose_json, srt, vtt), language and
// prompt. The transcript is a fixed sentence labelled as simulated; the
// audio duration is estimated from the file size as if it were a 128 kbit/s
// MP3. The file is counted, never stored.

const (
	// maxTranscriptionBytes is OpenAI's request limit for audio uploads
	// (25 MiB); larger requests get its 413.
	maxTranscriptionBytes = 26214400
	// audioBytesPerSecond: 128 kbit/s, a common voice-memo MP3 rate.
	audioBytesPerSecond = 16000
	// transcriptionSpeed is how many times faster than real time the
	// simulated model transcribes (Whisper large on a 4090 is in this range).
	transcriptionSpeed = 50
	// maxTranscriptionDelay caps the simulated processing time.
	maxTranscriptionDelay = 3 * time.Second
	// maxFormField bounds a text field of the form (prompt, language, …).
	maxFormField = 64 << 10
)

// simulatedTranscript is what every audio file "says"; the label keeps it
// from being mistaken for a real transcription.
var simulatedTranscript = []string{
	"[simulated transcript] Hi, this is Anna from Müller GmbH,",
	" please call me back about the offer",
	" for the new order.",
}

// whisperLanguages maps ISO-639-1 codes to the names verbose_json reports.
var whisperLanguages = map[string]string{
	"en": "english", "de": "german", "fr": "french", "es": "spanish", "it": "italian",
	"nl": "dutch", "pt": "portuguese", "pl": "polish", "sv": "swedish", "da": "danish",
	"no": "norwegian", "fi": "finnish", "cs": "czech", "tr": "turkish", "ru": "russian",
	"uk": "ukrainian", "ja": "japanese", "zh": "chinese", "ko": "korean", "ar": "arabic",
}

// transcriptionForm is what the handler learnt from the multipart body.
type transcriptionForm struct {
	hasFile   bool
	fileBytes int64
	model     string
	format    string
	language  string
}

// errAudioTooLarge marks a body beyond maxTranscriptionBytes.
var errAudioTooLarge = errors.New("audio request too large")

// countingReader fails once more than limit bytes were read.
type countingReader struct {
	r     io.Reader
	n     int64
	limit int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if c.n > c.limit {
		return n, errAudioTooLarge
	}
	return n, err
}

// writeAudioError writes OpenAI's error shape with OpenAI's error types.
func writeAudioError(w http.ResponseWriter, status int, format string, args ...any) {
	typ := "invalid_request_error"
	if status >= 413 {
		typ = "server_error"
	}
	writeJSON(w, status, map[string]any{"error": map[string]any{
		"message": fmt.Sprintf(format, args...),
		"type":    typ,
		"param":   nil,
		"code":    nil,
	}})
}

func (s *server) handleTranscription(w http.ResponseWriter, r *http.Request) {
	if s.sleepGate(w) {
		return
	}
	mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/form-data" || params["boundary"] == "" {
		writeAudioError(w, http.StatusBadRequest, "Invalid Content-Type header: expected multipart/form-data with a boundary.")
		return
	}
	body := &countingReader{r: r.Body, limit: maxTranscriptionBytes}
	form, err := readTranscriptionForm(multipart.NewReader(body, params["boundary"]))
	if body.n > body.limit && err == nil {
		// The read that crossed the limit may also have held the closing
		// boundary, so the parser saw no error: the count decides.
		err = errAudioTooLarge
	}
	if err != nil {
		if errors.Is(err, errAudioTooLarge) {
			read := body.n
			if r.ContentLength > read {
				read = r.ContentLength
			}
			w.Header().Set("Connection", "close") // the rest of the body stays unread
			writeAudioError(w, http.StatusRequestEntityTooLarge,
				"Maximum content size limit (%d) exceeded (%d bytes read)", maxTranscriptionBytes, read)
			return
		}
		writeAudioError(w, http.StatusBadRequest, "Could not parse multipart form: %v", err)
		return
	}
	form, msg := validateTranscriptionForm(form)
	if msg != "" {
		writeAudioError(w, http.StatusBadRequest, "%s", msg)
		return
	}
	if s.opts.TranscriptionFault == TranscriptionFaultError {
		s.log.Warn("transcription fault injected", "model", form.model, "bytes", form.fileBytes)
		writeAudioError(w, http.StatusInternalServerError, "The server had an error while processing your request. Sorry about that!")
		return
	}
	s.transcribe(w, r, form)
}

// readTranscriptionForm reads the parts, counting the file's bytes without
// keeping them.
func readTranscriptionForm(mr *multipart.Reader) (transcriptionForm, error) {
	var f transcriptionForm
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			return f, nil
		}
		if err != nil {
			return f, err
		}
		name := part.FormName()
		if name == "file" {
			n, err := io.Copy(io.Discard, part)
			if err != nil {
				return f, fmt.Errorf("reading file part: %w", err)
			}
			f.hasFile, f.fileBytes = true, n
			continue
		}
		val, err := io.ReadAll(io.LimitReader(part, maxFormField+1))
		if err != nil {
			return f, fmt.Errorf("reading form field %q: %w", name, err)
		}
		if len(val) > maxFormField {
			return f, fmt.Errorf("form field %q is longer than %d bytes", name, maxFormField)
		}
		switch name {
		case "model":
			f.model = strings.TrimSpace(string(val))
		case "response_format":
			f.format = strings.TrimSpace(string(val))
		case "language":
			f.language = strings.TrimSpace(string(val))
		}
		// prompt, temperature, timestamp_granularities[], chunking_strategy:
		// accepted; they do not change a fixed transcript.
	}
}

// validateTranscriptionForm applies OpenAI's checks, returning its message
// for the first failure.
func validateTranscriptionForm(f transcriptionForm) (transcriptionForm, string) {
	switch {
	case !f.hasFile:
		return f, "1 validation error for Request\nbody -> file\n  field required (type=value_error.missing)"
	case f.model == "":
		return f, "you must provide a model parameter"
	case f.fileBytes == 0:
		return f, "Audio file is too short. Minimum audio length is 0.1 seconds."
	}
	if f.format == "" {
		f.format = "json"
	}
	switch f.format {
	case "json", "text", "verbose_json", "srt", "vtt":
	default:
		return f, fmt.Sprintf("Invalid response_format '%s'. Must be one of ['json', 'text', 'srt', 'verbose_json', 'vtt']", f.format)
	}
	if f.language != "" {
		if len(f.language) != 2 || strings.ToLower(f.language) != f.language {
			return f, fmt.Sprintf("Invalid language '%s'. Language parameter must be specified in ISO-639-1 format.", f.language)
		}
	}
	return f, ""
}

type audioSegment struct {
	ID               int     `json:"id"`
	Seek             int     `json:"seek"`
	Start            float64 `json:"start"`
	End              float64 `json:"end"`
	Text             string  `json:"text"`
	Tokens           []int   `json:"tokens"`
	Temperature      float64 `json:"temperature"`
	AvgLogprob       float64 `json:"avg_logprob"`
	CompressionRatio float64 `json:"compression_ratio"`
	NoSpeechProb     float64 `json:"no_speech_prob"`
}

// audioSeconds estimates a recording's length from its size (at least 1 s).
func audioSeconds(bytes int64) float64 {
	sec := float64(bytes) / audioBytesPerSecond
	return math.Max(1, math.Round(sec*100)/100)
}

// transcriptSegments spreads the fixed transcript over the duration in
// proportion to each segment's length.
func transcriptSegments(duration float64) []audioSegment {
	total := 0
	for _, t := range simulatedTranscript {
		total += len(t)
	}
	var segs []audioSegment
	at := 0.0
	for i, t := range simulatedTranscript {
		end := at + duration*float64(len(t))/float64(total)
		if i == len(simulatedTranscript)-1 {
			end = duration
		}
		segs = append(segs, audioSegment{
			ID: i, Start: math.Round(at*100) / 100, End: math.Round(end*100) / 100, Text: t,
			Tokens: tokenIDs(tokenize(t)), AvgLogprob: -0.21, CompressionRatio: 1.1, NoSpeechProb: 0.01,
		})
		at = end
	}
	return segs
}

// transcribe waits the simulated processing time and writes the reply in
// the requested format. A request whose client left or whose server is
// stopping gets a 503 instead (harmless if nobody reads it).
func (s *server) transcribe(w http.ResponseWriter, r *http.Request, f transcriptionForm) {
	duration := audioSeconds(f.fileBytes)
	delay := min(time.Duration(duration/transcriptionSpeed*float64(time.Second)), maxTranscriptionDelay)
	if err := sleepCtx(r.Context(), delay); err != nil {
		s.log.Debug("transcription cancelled", "err", err)
		writeAudioError(w, http.StatusServiceUnavailable, "The server is shutting down or the request was cancelled.")
		return
	}
	text := strings.Join(simulatedTranscript, "")
	usage := map[string]any{"type": "duration", "seconds": int(math.Ceil(duration))}
	language := "english"
	if f.language != "" {
		language = f.language
		if name, ok := whisperLanguages[f.language]; ok {
			language = name
		}
	}
	switch f.format {
	case "text":
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, text+"\n")
	case "srt", "vtt":
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, subtitles(f.format, transcriptSegments(duration)))
	case "verbose_json":
		writeJSON(w, http.StatusOK, map[string]any{
			"task": "transcribe", "language": language, "duration": duration,
			"text": text, "segments": transcriptSegments(duration), "usage": usage,
		})
	default:
		writeJSON(w, http.StatusOK, map[string]any{"text": text, "usage": usage})
	}
}

// subtitles renders segments as SubRip or WebVTT.
func subtitles(format string, segs []audioSegment) string {
	stamp := func(sec float64) string {
		ms := int64(math.Round(sec * 1000))
		sep := ","
		if format == "vtt" {
			sep = "."
		}
		return fmt.Sprintf("%02d:%02d:%02d%s%03d", ms/3600000, ms/60000%60, ms/1000%60, sep, ms%1000)
	}
	var b strings.Builder
	if format == "vtt" {
		b.WriteString("WEBVTT\n\n")
	}
	for i, s := range segs {
		if format == "srt" {
			fmt.Fprintf(&b, "%d\n", i+1)
		}
		fmt.Fprintf(&b, "%s --> %s\n%s\n\n", stamp(s.Start), stamp(s.End), strings.TrimSpace(s.Text))
	}
	return b.String()
}
