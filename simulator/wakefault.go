package simulator

import (
	"context"
	"fmt"
	"strings"
)

// Wake faults (Options.WakeFault, `--wake-fault`): the ways vLLM's tracker
// shows a woken engine to be wrong while /health stays green, so that
// gpuhost's verified wake can be tested against each. Every fault but
// "residual" arms at the first wake_up that wakes the engine and stays
// armed until the process exits; a cold start (a new process) is healthy
// again, which is the recovery gpuhost falls back to.
const (
	// WakeFaultHang: generations after a wake never emit a token (vLLM
	// 49237: FP8 KV cache, the engine hangs while /health answers).
	WakeFaultHang = "hang"
	// WakeFaultOutput: generations after a wake emit other words than the
	// same request did before (gibberish after wake: vLLM 16234, 29341).
	WakeFaultOutput = "output"
	// WakeFaultSlow: generations after a wake decode at half the rate
	// (vLLM 52479: MTP draft weights not reloaded after level 2).
	WakeFaultSlow = "slow"
	// WakeFaultResidual: every sleep after the first keeps
	// wakeFaultResidualMiB more than the residual (vLLM 32714: the
	// residual grew from ~1 GB to 16 GB in one release).
	WakeFaultResidual = "residual"
)

// wakeFaultResidualMiB is what the residual fault keeps above the residual.
const wakeFaultResidualMiB = 4096

func validateWakeFault(f string) error {
	switch f {
	case "", WakeFaultHang, WakeFaultOutput, WakeFaultSlow, WakeFaultResidual:
		return nil
	}
	return fmt.Errorf("simulator options: wake fault %q: want %q, %q, %q, %q or none",
		f, WakeFaultHang, WakeFaultOutput, WakeFaultSlow, WakeFaultResidual)
}

// activeWakeFault is the armed fault that changes generations ("" when
// none): one of hang, output, slow, once the engine has woken.
func (s *server) activeWakeFault() string {
	if s.engine == nil {
		return ""
	}
	s.engine.mu.Lock()
	defer s.engine.mu.Unlock()
	if !s.engine.woken || s.opts.WakeFault == WakeFaultResidual {
		return ""
	}
	return s.opts.WakeFault
}

// hangUntilDone is the hang fault: nothing is emitted until the client
// gives up (or the engine is put to sleep).
func hangUntilDone(ctx context.Context) error {
	<-ctx.Done()
	return ctx.Err()
}

// garble is the output fault's token: the same length class of text, other
// words, so a reply compared with the one before the sleep differs.
func garble(tok string) string {
	lead := tok[:len(tok)-len(strings.TrimLeft(tok, " "))]
	return lead + "garbled"
}
