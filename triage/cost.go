package triage

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"gpuhost/triage/llm"
)

// Cost is what one mail's AI work cost (issue item 10): token usage priced
// per model, audio minutes priced per minute, and for calls on this box's
// GPU the energy (NVML power × call duration) priced per kWh.
type Cost struct {
	Currency         string  `json:"currency"`
	Classification   float64 `json:"classification"`
	Transcription    float64 `json:"transcription"`
	Energy           float64 `json:"energy"`
	Total            float64 `json:"total"`
	PromptTokens     int     `json:"prompt_tokens"`
	CompletionTokens int     `json:"completion_tokens"`
	AudioSeconds     float64 `json:"audio_seconds,omitempty"`
	EnergyWh         float64 `json:"energy_wh,omitempty"`
	// Unpriced names models used without a price in costs.models, so a
	// zero cost is never mistaken for a free call.
	Unpriced []string `json:"unpriced,omitempty"`
	// NoPower is set when a local call could not be measured (no NVML).
	NoPower bool `json:"no_power,omitempty"`
	// Calls is how many model and transcription calls the mail took;
	// Repeats how many more were made because a crash lost a call's
	// reply (their tokens are unknown: not in the amounts above).
	Calls   int `json:"calls"`
	Repeats int `json:"repeats,omitempty"`
}

// Footer is the one-line cost shown in the post, e.g.
// "0.0021 USD · 412+38 tok · 42 s audio · 1.90 Wh".
func (c Cost) Footer() string {
	parts := []string{FormatMoney(c.Total, c.Currency)}
	if c.PromptTokens+c.CompletionTokens > 0 {
		parts = append(parts, fmt.Sprintf("%d+%d tok", c.PromptTokens, c.CompletionTokens))
	}
	if c.AudioSeconds > 0 {
		parts = append(parts, fmt.Sprintf("%.0f s audio", c.AudioSeconds))
	}
	if c.EnergyWh > 0 {
		parts = append(parts, fmt.Sprintf("%.2f Wh", c.EnergyWh))
	}
	if len(c.Unpriced) > 0 {
		parts = append(parts, "no price for "+strings.Join(c.Unpriced, ", "))
	}
	return strings.Join(parts, " · ")
}

// FormatMoney prints an amount for people in the given currency, as
// "<amount> <currency>": two decimals from 1 up ("1.25 EUR"), below that
// two significant digits without an exponent ("0.0021 USD", "0.000014
// EUR"), so a fraction of a cent neither reads as 1.44e-05 nor rounds to
// 0.0000; zero is "0.00 EUR". An empty currency leaves the code out.
func FormatMoney(v float64, currency string) string {
	var amount string
	switch a := math.Abs(v); {
	case a == 0 || math.IsNaN(v) || math.IsInf(v, 0):
		amount = fmt.Sprintf("%.2f", v)
	case a >= 1:
		amount = fmt.Sprintf("%.2f", v)
	default:
		// Decimals for two significant digits, at least two.
		dec := max(2, 1-int(math.Floor(math.Log10(a))))
		amount = strconv.FormatFloat(v, 'f', dec, 64)
		if strings.Contains(amount, ".") {
			amount = strings.TrimRight(amount, "0")
			if i := strings.IndexByte(amount, '.'); len(amount)-i-1 < 2 {
				amount += strings.Repeat("0", 2-(len(amount)-i-1))
			}
		}
	}
	if currency == "" {
		return amount
	}
	return amount + " " + currency
}

// localUsage is one model call with the mean power measured while it ran.
type localUsage struct {
	llm.Usage
	Local bool
	Watts float64 // mean power during the call; 0 = not measured
	Power bool    // Watts is a measurement
}

// price turns the mail's model calls into a Cost.
func (w *Worker) price(calls []localUsage) Cost {
	p := w.o.Prices
	c := Cost{Currency: p.Currency, Calls: len(calls)}
	unpriced := map[string]bool{}
	for _, u := range calls {
		switch u.Kind {
		case "transcription":
			c.AudioSeconds += u.AudioSeconds
			c.Transcription += u.AudioSeconds / 60 * p.TranscriptionPerMinute
		default:
			c.PromptTokens += u.PromptTokens
			c.CompletionTokens += u.CompletionTokens
			if mp, ok := p.Models[u.Model]; ok {
				c.Classification += float64(u.PromptTokens)/1e6*mp.PromptPerMillion +
					float64(u.CompletionTokens)/1e6*mp.CompletionPerMillion
			} else if u.Model != "" && !u.Local {
				// A local model without a token price is normal: its
				// cost is the energy below.
				unpriced[u.Model] = true
			}
		}
		if u.Local {
			if u.Power {
				wh := u.Watts * u.Duration.Hours()
				c.EnergyWh += wh
				c.Energy += wh / 1000 * p.EnergyPerKWh
			} else {
				c.NoPower = true
			}
		}
	}
	for m := range unpriced {
		c.Unpriced = append(c.Unpriced, m)
	}
	sort.Strings(c.Unpriced)
	c.Total = c.Classification + c.Transcription + c.Energy
	return c
}

// measure runs call and samples the GPU power every 250 ms while it runs
// (plus once at the end), returning the mean. Without a PowerFunc it only
// runs call.
func (w *Worker) measure(ctx context.Context, local bool, call func()) (watts float64, ok bool) {
	if !local || w.o.Power == nil {
		call()
		return 0, false
	}
	var (
		mu      sync.Mutex
		sum     float64
		n       int
		done    = make(chan struct{})
		stopped = make(chan struct{})
	)
	sample := func() {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if v, ok := w.o.Power(sctx); ok {
			mu.Lock()
			sum += v
			n++
			mu.Unlock()
		}
	}
	go func() {
		defer close(stopped)
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				sample()
			}
		}
	}()
	call()
	close(done)
	<-stopped
	sample()
	mu.Lock()
	defer mu.Unlock()
	if n == 0 {
		return 0, false
	}
	return sum / float64(n), true
}
