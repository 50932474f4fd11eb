package proxy

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"gpuhost/internal/apishape"
)

// vllmStream is a streamed chat answer as vLLM sends it with
// stream_options.include_usage: usage only on the last chunk before [DONE].
const vllmStream = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n" +
	"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"usage is a word\"}}]}\n\n" +
	"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"!\"},\"finish_reason\":\"length\"}]}\n\n" +
	"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[],\"usage\":{\"prompt_tokens\":1234,\"total_tokens\":1250,\"completion_tokens\":16}}\n\n" +
	"data: [DONE]\n\n"

func TestUsageTap(t *testing.T) {
	tests := []struct {
		name         string
		mode         tapMode
		body         string
		wantUsage    bool
		prompt, comp int
		wantDone     bool
		events       int
	}{
		{name: "vllm stream", mode: tapSSE, body: vllmStream, wantUsage: true, prompt: 1234, comp: 16, wantDone: true, events: 5},
		{name: "crlf and no space after data:", mode: tapSSE, body: strings.ReplaceAll(strings.ReplaceAll(vllmStream, "data: ", "data:"), "\n", "\r\n"),
			wantUsage: true, prompt: 1234, comp: 16, wantDone: true, events: 5},
		{name: "continuous usage: last wins", mode: tapSSE, body: "data: {\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1}}\n\ndata: {\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2}}\n\ndata: {\"usage\":null}\n\ndata: [DONE]\n\n",
			wantUsage: true, prompt: 5, comp: 2, wantDone: true, events: 4},
		{name: "no usage", mode: tapSSE, body: "data: {\"choices\":[]}\n\ndata: [DONE]\n\n", wantDone: true, events: 2},
		{name: "comments and other fields", mode: tapSSE, body: ": ping\nevent: message\nid: 3\ndata: {\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1}}\n\n",
			wantUsage: true, prompt: 1, comp: 1, events: 1},
		{name: "last line without newline", mode: tapSSE, body: "data: {\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3}}",
			wantUsage: true, prompt: 7, comp: 3, events: 1},
		{name: "broken json", mode: tapSSE, body: "data: {\"usage\":{\"prompt_tokens\":7,\n\n", events: 1},
		{name: "whole answer", mode: tapJSON, body: `{"id":"x","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":12,"total_tokens":15,"completion_tokens":3}}`,
			wantUsage: true, prompt: 12, comp: 3},
		{name: "error answer", mode: tapJSON, body: `{"error":{"message":"bad"}}`},
		{name: "not examined", mode: tapNone, body: vllmStream},
	}
	for _, tc := range tests {
		// Every way of cutting the body into two reads, and one byte per read.
		cuts := []int{-1}
		for i := 0; i <= len(tc.body); i++ {
			cuts = append(cuts, i)
		}
		for _, cut := range cuts {
			var r io.Reader
			if cut < 0 {
				r = &byteReader{data: []byte(tc.body)}
			} else {
				r = io.MultiReader(bytes.NewReader([]byte(tc.body[:cut])), bytes.NewReader([]byte(tc.body[cut:])))
			}
			tap := newUsageTap(io.NopCloser(r), tc.mode, apishape.Chat)
			got, err := io.ReadAll(tap)
			if err != nil || string(got) != tc.body {
				t.Fatalf("%s cut %d: body changed or error %v", tc.name, cut, err)
			}
			if tap.haveUsage != tc.wantUsage || tap.prompt != tc.prompt || tap.compl != tc.comp || tap.sawDone != tc.wantDone {
				t.Fatalf("%s cut %d: usage %v %d/%d done %v, want %v %d/%d done %v", tc.name, cut,
					tap.haveUsage, tap.prompt, tap.compl, tap.sawDone, tc.wantUsage, tc.prompt, tc.comp, tc.wantDone)
			}
			if tap.events != tc.events {
				t.Fatalf("%s cut %d: %d events, want %d", tc.name, cut, tap.events, tc.events)
			}
			if tap.first.IsZero() != (len(tc.body) == 0) {
				t.Fatalf("%s: first byte time not noted", tc.name)
			}
		}
	}
}

func TestUsageTapBounds(t *testing.T) {
	long := "data: {\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":1},\"pad\":\"" + strings.Repeat("x", maxSSELine) + "\"}\n\n" +
		"data: {\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":9}}\n\n"
	tap := newUsageTap(io.NopCloser(&chunkReader{data: []byte(long), n: 4096}), tapSSE, apishape.Chat)
	if _, err := io.Copy(io.Discard, tap); err != nil {
		t.Fatal(err)
	}
	// (That the line kept aside stays within the limit is internal/sse's
	// TestParserSkipsLongLines.)
	if !tap.haveUsage || tap.prompt != 9 {
		t.Fatalf("an over-long line must be skipped and the next one read: usage %v %d", tap.haveUsage, tap.prompt)
	}
	big := `{"pad":"` + strings.Repeat("x", maxJSONBody) + `","usage":{"prompt_tokens":1,"completion_tokens":1}}`
	tap = newUsageTap(io.NopCloser(strings.NewReader(big)), tapJSON, apishape.Chat)
	if _, err := io.Copy(io.Discard, tap); err != nil {
		t.Fatal(err)
	}
	if tap.haveUsage || tap.body != nil {
		t.Fatalf("an answer over %d bytes is not kept: usage %v, kept %d bytes", maxJSONBody, tap.haveUsage, len(tap.body))
	}
}

func TestTapModeFor(t *testing.T) {
	tests := []struct {
		ct, ce string
		want   tapMode
	}{
		{"text/event-stream; charset=utf-8", "", tapSSE},
		{"application/json", "", tapJSON},
		{"application/json", "identity", tapJSON},
		{"application/json", "gzip", tapNone},
		{"text/plain", "", tapNone},
		{"", "", tapNone},
		{";;;", "", tapNone},
	}
	for _, tc := range tests {
		if got := tapModeFor(tc.ct, tc.ce); got != tc.want {
			t.Errorf("tapModeFor(%q, %q) = %d, want %d", tc.ct, tc.ce, got, tc.want)
		}
	}
}

// FuzzUsageTap: any bytes, any cut: the bytes pass unchanged, nothing
// panics, and where the body is cut does not change what is found.
func FuzzUsageTap(f *testing.F) {
	f.Add([]byte(vllmStream), uint16(7), true)
	f.Add([]byte(`{"usage":{"prompt_tokens":1,"completion_tokens":2}}`), uint16(3), false)
	f.Add([]byte("data: [DONE]\r\n"), uint16(0), true)
	f.Fuzz(func(t *testing.T, body []byte, cut uint16, sse bool) {
		mode := tapJSON
		if sse {
			mode = tapSSE
		}
		whole := newUsageTap(io.NopCloser(bytes.NewReader(body)), mode, apishape.Chat)
		got, err := io.ReadAll(whole)
		if err != nil || !bytes.Equal(got, body) {
			t.Fatalf("body changed or error %v", err)
		}
		c := int(cut) % (len(body) + 1)
		split := newUsageTap(io.NopCloser(io.MultiReader(bytes.NewReader(body[:c]), bytes.NewReader(body[c:]))), mode, apishape.Chat)
		if _, err := io.ReadAll(split); err != nil {
			t.Fatal(err)
		}
		if whole.haveUsage != split.haveUsage || whole.prompt != split.prompt || whole.compl != split.compl ||
			whole.sawDone != split.sawDone || whole.events != split.events {
			t.Fatalf("cut at %d changed the result: %+v vs %+v", c, whole, split)
		}
	})
}

// byteReader returns one byte per Read, the worst chunking a stream can have.
type byteReader struct {
	data []byte
	off  int
}

func (r *byteReader) Read(p []byte) (int, error) {
	if r.off >= len(r.data) {
		return 0, io.EOF
	}
	if len(p) == 0 {
		return 0, nil
	}
	p[0] = r.data[r.off]
	r.off++
	return 1, nil
}

// chunkReader returns at most n bytes per Read.
type chunkReader struct {
	data []byte
	n    int
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	k := min(len(p), r.n, len(r.data))
	copy(p, r.data[:k])
	r.data = r.data[k:]
	return k, nil
}

// BenchmarkUsageTap is the tap's share of a streamed answer: 1000 vLLM
// token chunks read through it as httputil.ReverseProxy copies (32 KiB
// reads), and in reads of 100 bytes that cut most lines in two.
func BenchmarkUsageTap(b *testing.B) {
	var body bytes.Buffer
	for i := 0; i < 1000; i++ {
		body.WriteString("data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" word\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n")
	}
	body.WriteString(vllmStream)
	data := body.Bytes()
	for _, rc := range []struct {
		name string
		n    int
	}{{"32KiB reads", 32 << 10}, {"100B reads", 100}} {
		b.Run(rc.name, func(b *testing.B) {
			buf := make([]byte, 32<<10)
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				tap := newUsageTap(io.NopCloser(&chunkReader{data: data, n: rc.n}), tapSSE, apishape.Chat)
				for {
					if _, err := tap.Read(buf); err != nil {
						break
					}
				}
				if !tap.sawDone || tap.compl != 16 || tap.events != 1005 {
					b.Fatalf("done %v, %d completion tokens, %d events", tap.sawDone, tap.compl, tap.events)
				}
			}
		})
	}
}
