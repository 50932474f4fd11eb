package proxy

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"gpuhost/internal/apishape"
)

// messagesStream is a streamed Anthropic Messages answer in the event
// sequence Anthropic documents (message_start, content blocks, ping,
// message_delta with the cumulative output usage, message_stop).
const messagesStream = "event: message_start\n" +
	"data: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"m\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":25,\"cache_creation_input_tokens\":3,\"cache_read_input_tokens\":2,\"output_tokens\":1}}}\n\n" +
	"event: content_block_start\n" +
	"data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n" +
	"event: ping\ndata: {\"type\": \"ping\"}\n\n" +
	"event: content_block_delta\n" +
	"data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"the \\\"usage\\\" of message_stop\"}}\n\n" +
	"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n" +
	"event: message_delta\n" +
	"data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":15}}\n\n" +
	"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"

// responsesStream is a streamed OpenAI Responses answer: usage only in the
// response that response.completed carries.
const responsesStream = "event: response.created\n" +
	"data: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[],\"usage\":null}}\n\n" +
	"event: response.output_item.added\n" +
	"data: {\"type\":\"response.output_item.added\",\"sequence_number\":1,\"output_index\":0,\"item\":{\"id\":\"msg_1\",\"type\":\"message\",\"status\":\"in_progress\",\"role\":\"assistant\",\"content\":[]}}\n\n" +
	"event: response.output_text.delta\n" +
	"data: {\"type\":\"response.output_text.delta\",\"sequence_number\":2,\"item_id\":\"msg_1\",\"output_index\":0,\"content_index\":0,\"delta\":\"\\\"usage\\\" response.completed\"}\n\n" +
	"event: response.completed\n" +
	"data: {\"type\":\"response.completed\",\"sequence_number\":3,\"response\":{\"id\":\"resp_1\",\"object\":\"response\",\"status\":\"completed\",\"output\":[],\"usage\":{\"input_tokens\":40,\"input_tokens_details\":{\"cached_tokens\":0},\"output_tokens\":7,\"output_tokens_details\":{\"reasoning_tokens\":0},\"total_tokens\":47}}}\n\n"

// withoutEventLines drops the "event:" lines: the type is then read from
// the payload (a backend may send data lines only).
func withoutEventLines(s string) string {
	var out []string
	for _, l := range strings.SplitAfter(s, "\n") {
		if !strings.HasPrefix(l, "event:") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "")
}

func TestUsageTapAPIs(t *testing.T) {
	tests := []struct {
		name         string
		kind         apishape.Kind
		mode         tapMode
		body         string
		wantUsage    bool
		prompt, comp int
		wantDone     bool
		events       int
	}{
		{name: "messages stream", kind: apishape.Messages, mode: tapSSE, body: messagesStream, wantUsage: true, prompt: 30, comp: 15, wantDone: true, events: 7},
		{name: "messages stream, data lines only", kind: apishape.Messages, mode: tapSSE, body: withoutEventLines(messagesStream), wantUsage: true, prompt: 30, comp: 15, wantDone: true, events: 7},
		{name: "messages stream cut before message_delta", kind: apishape.Messages, mode: tapSSE, body: messagesStream[:strings.Index(messagesStream, "event: message_delta")],
			wantUsage: true, prompt: 30, comp: 1, events: 5},
		{name: "messages delta with input", kind: apishape.Messages, mode: tapSSE,
			body:      "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"input_tokens\":9,\"output_tokens\":4}}\n\n",
			wantUsage: true, prompt: 9, comp: 4, events: 1},
		{name: "messages answer", kind: apishape.Messages, mode: tapJSON,
			body:      `{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","usage":{"input_tokens":12,"cache_read_input_tokens":4,"output_tokens":3}}`,
			wantUsage: true, prompt: 16, comp: 3},
		{name: "messages error answer", kind: apishape.Messages, mode: tapJSON, body: `{"type":"error","error":{"type":"not_found_error","message":"x"}}`},
		{name: "count_tokens is not usage", kind: apishape.CountTokens, mode: tapJSON, body: `{"input_tokens":2095}`},
		{name: "responses stream", kind: apishape.Responses, mode: tapSSE, body: responsesStream, wantUsage: true, prompt: 40, comp: 7, wantDone: true, events: 4},
		{name: "responses stream, data lines only", kind: apishape.Responses, mode: tapSSE, body: withoutEventLines(responsesStream), wantUsage: true, prompt: 40, comp: 7, wantDone: true, events: 4},
		{name: "responses incomplete", kind: apishape.Responses, mode: tapSSE,
			body:      "event: response.incomplete\ndata: {\"type\":\"response.incomplete\",\"response\":{\"status\":\"incomplete\",\"usage\":{\"input_tokens\":5,\"output_tokens\":16}}}\n\n",
			wantUsage: true, prompt: 5, comp: 16, wantDone: true, events: 1},
		{name: "responses stream without the end", kind: apishape.Responses, mode: tapSSE, body: responsesStream[:strings.Index(responsesStream, "event: response.completed")], events: 3},
		{name: "responses answer", kind: apishape.Responses, mode: tapJSON,
			body:      `{"id":"resp_1","object":"response","status":"completed","output":[{"type":"function_call","name":"f","arguments":"{}"}],"usage":{"input_tokens":21,"output_tokens":9,"total_tokens":30}}`,
			wantUsage: true, prompt: 21, comp: 9},
		{name: "embeddings answer", kind: apishape.Embeddings, mode: tapJSON,
			body:      `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1]}],"usage":{"prompt_tokens":8,"total_tokens":8}}`,
			wantUsage: true, prompt: 8},
		{name: "[DONE] does not end a messages stream", kind: apishape.Messages, mode: tapSSE, body: "data: [DONE]\n\n", events: 1},
	}
	for _, tc := range tests {
		for cut := -1; cut <= len(tc.body); cut++ {
			var r io.Reader = &byteReader{data: []byte(tc.body)}
			if cut >= 0 {
				r = io.MultiReader(strings.NewReader(tc.body[:cut]), strings.NewReader(tc.body[cut:]))
			}
			tap := newUsageTap(io.NopCloser(r), tc.mode, tc.kind)
			got, err := io.ReadAll(tap)
			if err != nil || string(got) != tc.body {
				t.Fatalf("%s cut %d: body changed or error %v", tc.name, cut, err)
			}
			if tap.haveUsage != tc.wantUsage || tap.prompt != tc.prompt || tap.compl != tc.comp || tap.sawDone != tc.wantDone || tap.events != tc.events {
				t.Fatalf("%s cut %d: usage %v %d/%d done %v events %d, want %v %d/%d done %v events %d", tc.name, cut,
					tap.haveUsage, tap.prompt, tap.compl, tap.sawDone, tap.events, tc.wantUsage, tc.prompt, tc.comp, tc.wantDone, tc.events)
			}
		}
	}
}

// FuzzUsageTapAPIs: for every API, any bytes and any cut: the bytes pass
// unchanged, nothing panics, and the cut does not change what is found.
func FuzzUsageTapAPIs(f *testing.F) {
	f.Add([]byte(messagesStream), uint16(40), uint8(apishape.Messages), true)
	f.Add([]byte(withoutEventLines(responsesStream)), uint16(9), uint8(apishape.Responses), true)
	f.Add([]byte(`{"usage":{"input_tokens":1,"output_tokens":2}}`), uint16(3), uint8(apishape.Responses), false)
	f.Add([]byte(`{"usage":{"input_tokens":null,"output_tokens":-2,"cache_read_input_tokens":1e3}}`), uint16(3), uint8(apishape.Messages), false)
	f.Fuzz(func(t *testing.T, body []byte, cut uint16, kind uint8, sse bool) {
		k := apishape.Kind(kind % uint8(apishape.Responses+1))
		mode := tapJSON
		if sse {
			mode = tapSSE
		}
		whole := newUsageTap(io.NopCloser(bytes.NewReader(body)), mode, k)
		got, err := io.ReadAll(whole)
		if err != nil || !bytes.Equal(got, body) {
			t.Fatalf("body changed or error %v", err)
		}
		c := int(cut) % (len(body) + 1)
		split := newUsageTap(io.NopCloser(io.MultiReader(bytes.NewReader(body[:c]), bytes.NewReader(body[c:]))), mode, k)
		if _, err := io.ReadAll(split); err != nil {
			t.Fatal(err)
		}
		if whole.haveUsage != split.haveUsage || whole.prompt != split.prompt || whole.compl != split.compl ||
			whole.sawDone != split.sawDone || whole.events != split.events {
			t.Fatalf("cut at %d changed the result: %+v vs %+v", c, whole, split)
		}
	})
}
