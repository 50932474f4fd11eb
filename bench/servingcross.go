package bench

import (
	"cmp"
	"fmt"
	"slices"
)

// servingPair is one native serving request as the client timed it and as
// Ollama did (ms): the time to the first token, the time per output token
// after the first, and the whole request.
type servingPair struct {
	clientTTFT, serverTTFT float64
	clientTPOT, serverTPOT float64
	clientE2E, serverE2E   float64
}

// newServingPair pairs a native sample's client times with the server's;
// ok is false when the server reported no timing (not a native request) or
// too few tokens for a time per token.
//
// Ollama's total_duration runs from its handler's start to the last token
// and eval_duration over the generated tokens, so total − eval is its view
// of the time to the first token (load, the wait for a free slot and the
// prompt), and eval_duration / (eval_count − 1) its time per token after
// the first, the definition the client's TPOT uses.
func newServingPair(s *sample) (servingPair, bool) {
	if s.server.total <= 0 || s.evalDuration <= 0 || s.evalCount < 2 || s.completion < 2 || len(s.tokenAt) == 0 {
		return servingPair{}, false
	}
	ttft := s.ttft()
	return servingPair{
		clientTTFT: ms(ttft), serverTTFT: ms(s.server.total - s.evalDuration),
		clientTPOT: ms(s.end-ttft) / float64(s.completion-1), serverTPOT: ms(s.evalDuration) / float64(s.evalCount-1),
		clientE2E: ms(s.end), serverE2E: ms(s.server.total),
	}, true
}

// servingCross compares one serving level's client figures with Ollama's
// own, like with like: each figure is that of the request with the median
// disagreement (the lower one of an even count: a real request, as in
// decodeCross), so one request the client was descheduled in does not move
// the verdict. The note gives the range over all requests.
func servingCross(l servingLevel, pairs []servingPair) []Cross {
	if len(pairs) == 0 {
		return nil
	}
	type metric struct {
		name       string
		client     func(servingPair) float64
		server     func(servingPair) float64
		serverName string
	}
	metrics := []metric{
		{"TTFT", func(p servingPair) float64 { return p.clientTTFT }, func(p servingPair) float64 { return p.serverTTFT }, "total_duration − eval_duration"},
		{"TPOT", func(p servingPair) float64 { return p.clientTPOT }, func(p servingPair) float64 { return p.serverTPOT }, "eval_duration / (eval_count − 1)"},
		{"E2E", func(p servingPair) float64 { return p.clientE2E }, func(p servingPair) float64 { return p.serverE2E }, "total_duration"},
	}
	var out []Cross
	for _, m := range metrics {
		type scored struct{ client, server, pct float64 }
		var all []scored
		for _, p := range pairs {
			c, sv := m.client(p), m.server(p)
			if sv <= 0 {
				continue
			}
			all = append(all, scored{c, sv, (c - sv) / sv * 100})
		}
		if len(all) == 0 {
			continue
		}
		slices.SortStableFunc(all, func(a, b scored) int { return cmp.Compare(a.pct, b.pct) })
		mid := all[(len(all)-1)/2]
		note := fmt.Sprintf("per request (client vs the same request's %s): %+.1f %% to %+.1f %% over %d requests; the request with the median disagreement is shown",
			m.serverName, all[0].pct, all[len(all)-1].pct, len(all))
		out = append(out, newCross(fmt.Sprintf("serving %s %s client vs Ollama %s, same request, median of %d", l, m.name, m.serverName, len(all)),
			"ms", mid.client, mid.server, note))
	}
	return out
}
