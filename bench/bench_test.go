package bench

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"gpuhost/simulator"
)

// BenchmarkStreamThroughput measures how many streamed tokens per second
// the runner's client takes in from an unpaced simulator (1e9 tok/s), the
// simulator included in the same process. Run it on one core:
//
//	go test ./bench -run '^$' -bench StreamThroughput -cpu 1
//
// The tokens/s metric must stay ≥ 50,000: the client must never be what
// limits a measurement.
func BenchmarkStreamThroughput(b *testing.B) {
	url := startSim(b, simulator.Options{Flavor: simulator.FlavorVLLM, Model: "m", PrefillTPS: 1e12, DecodeTPS: 1e9})
	const tokens = 20000
	ep := &endpoint{hc: &http.Client{Transport: &http.Transport{DisableCompression: true}}, api: url + "/v1", root: url, model: "m", flavor: FlavorVLLM}
	var total int
	b.ResetTimer()
	t0 := time.Now()
	for i := 0; i < b.N; i++ {
		s, err := ep.chatStream(context.Background(), chatRequest{Messages: []chatMessage{{Role: "user", Content: "go"}},
			MaxTokens: tokens, MinTokens: tokens, IgnoreEOS: true})
		if err != nil || s.completion != tokens || len(s.tokenAt) != tokens {
			b.Fatalf("%v: %d tokens, %d chunks", err, s.completion, len(s.tokenAt))
		}
		total += s.completion
	}
	b.ReportMetric(float64(total)/time.Since(t0).Seconds(), "tokens/s")
}

// BenchmarkParseSSE is the client's share alone: parsing a canned vLLM
// stream (one token per chunk), without any server.
func BenchmarkParseSSE(b *testing.B) {
	var body bytes.Buffer
	const tokens = 10000
	for i := 0; i < tokens; i++ {
		fmt.Fprintf(&body, "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" word\"},\"logprobs\":null,\"finish_reason\":null,\"stop_reason\":null}]}\n\n")
	}
	body.WriteString("data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"total_tokens\":10003,\"completion_tokens\":10000}}\n\ndata: [DONE]\n\n")
	data := body.Bytes()
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	t0 := time.Now()
	for i := 0; i < b.N; i++ {
		s := &sample{start: time.Now(), prompt: -1, completion: -1, tokenAt: make([]time.Duration, 0, tokens)}
		if err := parseSSE(bytes.NewReader(data), s.onChunk); err != nil || len(s.tokenAt) != tokens {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*tokens)/time.Since(t0).Seconds(), "tokens/s")
}
