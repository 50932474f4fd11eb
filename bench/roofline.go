package bench

import (
	"context"
	"fmt"

	"gpuhost/units"
)

// Roofline puts measured decode speed next to the ceiling memory bandwidth
// allows. Decode on one GPU is bandwidth-bound: every generated token reads
// all active weights once plus the KV cache of the context so far, so
//
//	ceiling tok/s = bandwidth / (active params × bits/8 + KV bytes/token × context).
//
// A dense 27B model at ~4.75 bits (a typical INT4 checkpoint with scales,
// ~16 GB) on an RTX 4090 (1008 GB/s) gives ≈ 63 tok/s; 51–54 measured is
// 80–85 % of it, which is what a healthy setup reaches.
type Roofline struct {
	BandwidthGBs float64 `json:"bandwidth_gbs"`
	// ParamsB is the parameters read per token (billions): the active ones
	// of a mixture-of-experts model, all of a dense one.
	ParamsB         float64         `json:"params_b"`
	WeightBits      float64         `json:"weight_bits"`
	KVBytesPerToken float64         `json:"kv_bytes_per_token"`
	Decode          []RooflinePoint `json:"decode"`
}

// RooflinePoint is one decode length against its ceiling.
type RooflinePoint struct {
	Tokens int `json:"tokens"`
	// ContextTokens is the mean context during the decode (prompt plus half
	// the output), which sets the KV bytes read per token.
	ContextTokens int     `json:"context_tokens"`
	BytesPerToken float64 `json:"bytes_per_token"`
	CeilingTokS   float64 `json:"ceiling_tok_s"`
	TokS          float64 `json:"tok_s"`
	PctOfCeiling  float64 `json:"pct_of_ceiling"`
}

// DecodeCeiling returns the bytes read per generated token and the
// bandwidth ceiling in tokens/s for a model at a context length.
// bandwidthGBs is 10^9 bytes/s (nvml.Device.BandwidthGBs); WeightBits 0
// means 16 (bf16), as units.EstimateVRAM assumes. ok is false when the
// bandwidth or the model size is unknown.
func DecodeCeiling(bandwidthGBs float64, m units.ModelParams, kvPerToken float64, context int) (bytesPerToken, tokS float64, ok bool) {
	params := m.TotalParamsB
	if m.IsMoE() {
		params = m.ActiveParamsB
	}
	bits := m.WeightBits
	if bits == 0 {
		bits = 16
	}
	if bandwidthGBs <= 0 || params <= 0 {
		return 0, 0, false
	}
	bytesPerToken = params*1e9*bits/8 + kvPerToken*float64(max(context, 0))
	return bytesPerToken, bandwidthGBs * 1e9 / bytesPerToken, true
}

// ComputeRoofline relates each decode result to its ceiling; nil when the
// bandwidth or the model size is unknown. promptTokens is the decode
// prompt's length.
func ComputeRoofline(bandwidthGBs float64, p units.Profile, promptTokens int, decode []Decode) *Roofline {
	_, kvPerToken, _ := units.EstimateVRAM(p)
	if _, _, ok := DecodeCeiling(bandwidthGBs, p.Params, kvPerToken, 0); !ok {
		return nil
	}
	rl := &Roofline{BandwidthGBs: bandwidthGBs, ParamsB: p.Params.TotalParamsB, WeightBits: p.Params.WeightBits,
		KVBytesPerToken: kvPerToken, Decode: []RooflinePoint{}}
	if p.Params.IsMoE() {
		rl.ParamsB = p.Params.ActiveParamsB
	}
	if rl.WeightBits == 0 {
		rl.WeightBits = 16
	}
	for _, d := range decode {
		ctxTokens := promptTokens + d.Tokens/2
		bpt, ceil, _ := DecodeCeiling(bandwidthGBs, p.Params, kvPerToken, ctxTokens)
		pt := RooflinePoint{Tokens: d.Tokens, ContextTokens: ctxTokens, BytesPerToken: bpt, CeilingTokS: ceil}
		if d.TokS.N > 0 {
			pt.TokS = d.TokS.Mean
			pt.PctOfCeiling = d.TokS.Mean / ceil * 100
		}
		rl.Decode = append(rl.Decode, pt)
	}
	return rl
}

// roofline adds the roofline to the result when the GPU bandwidth and the
// model size are known, and says why not otherwise.
func (ru *runner) roofline(_ context.Context) {
	r := ru.r
	if len(r.Decode) == 0 {
		return
	}
	var p units.Profile
	if ru.o.Profile != nil {
		p = *ru.o.Profile
	}
	if ru.o.Params != (units.ModelParams{}) {
		p.Params = ru.o.Params
	}
	if p.Backend == "" {
		p.Backend = units.Backend(ru.ep.flavor)
	}
	switch {
	case ru.bandwidth <= 0:
		r.Notes = append(r.Notes, "no roofline: the GPU memory bandwidth is unknown (no NVML facts)")
		return
	case p.Params.TotalParamsB <= 0:
		r.Notes = append(r.Notes, "no roofline: the model size is unknown (set model_params in the profile or --params-b/--weight-bits)")
		return
	}
	prompt := ru.decodePromptTokens
	if prompt == 0 {
		prompt = 32
	}
	r.Roofline = ComputeRoofline(ru.bandwidth, p, prompt, r.Decode)
	if r.Roofline != nil {
		for _, pt := range r.Roofline.Decode {
			if pt.TokS > 0 && pt.PctOfCeiling > 100 {
				r.Notes = append(r.Notes, fmt.Sprintf("decode %d runs at %.0f %% of the bandwidth ceiling: the model_params (size or bits) are probably too large", pt.Tokens, pt.PctOfCeiling))
			}
		}
	}
}
