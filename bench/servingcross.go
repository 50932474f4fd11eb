package bench

import "fmt"

// servingPair is one native serving request as the client timed it and as
// Ollama did (ms): the time to the first token, the time per output token
// after the first, and the whole request.
type servingPair struct{ ttft, tpot, e2e crossPair }

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
		ttft: crossPair{client: ms(ttft), server: ms(s.server.total - s.evalDuration)},
		tpot: crossPair{client: ms(s.end-ttft) / float64(s.completion-1), server: ms(s.evalDuration) / float64(s.evalCount-1)},
		e2e:  crossPair{client: ms(s.end), server: ms(s.server.total)},
	}, true
}

// servingCross compares one serving level's client figures with Ollama's
// own, like with like: each figure is that of the request with the median
// disagreement (byDisagreement, as decodeCross shows it), so one request
// the client was descheduled in does not move the verdict. The note gives
// the range over all requests.
func servingCross(l servingLevel, pairs []servingPair) []Cross {
	metrics := []struct {
		name, serverName string
		of               func(servingPair) crossPair
	}{
		{"TTFT", "total_duration − eval_duration", func(p servingPair) crossPair { return p.ttft }},
		{"TPOT", "eval_duration / (eval_count − 1)", func(p servingPair) crossPair { return p.tpot }},
		{"E2E", "total_duration", func(p servingPair) crossPair { return p.e2e }},
	}
	var out []Cross
	for _, m := range metrics {
		ps := make([]crossPair, len(pairs))
		for i, p := range pairs {
			ps[i] = m.of(p)
		}
		all := byDisagreement(ps)
		if len(all) == 0 {
			continue
		}
		mid := all[(len(all)-1)/2]
		note := fmt.Sprintf("per request (client vs the same request's %s): %+.1f %% to %+.1f %% over %d requests; the request with the median disagreement is shown",
			m.serverName, all[0].pct, all[len(all)-1].pct, len(all))
		out = append(out, newCross(fmt.Sprintf("serving %s %s client vs Ollama %s, same request, median of %d", l, m.name, m.serverName, len(all)),
			"ms", mid.client, mid.server, note))
	}
	return out
}
