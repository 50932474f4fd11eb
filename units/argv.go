package units

import (
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Environment variable names in the file gpuhost writes per switch. The backend
// unit references GPUHOST_ARGS in its ExecStart; the others are read by the
// backend (Ollama) or are there for the operator (`systemctl show -p Environment`).
const (
	EnvProfile       = "GPUHOST_PROFILE"
	EnvArgs          = "GPUHOST_ARGS"
	EnvOllamaHost    = "OLLAMA_HOST"
	EnvOllamaKeep    = "OLLAMA_KEEP_ALIVE"
	EnvOllamaContext = "OLLAMA_CONTEXT_LENGTH"
)

// VLLMArgs is the vLLM argv (after the program) for a profile:
//
//	serve MODEL [--gpu-memory-utilization U] [--max-num-seqs N] [--max-model-len N]
//	  [--enable-auto-tool-choice] [--tool-call-parser P] [--quantization Q]
//	  [--kv-cache-dtype D] --served-model-name SERVED [--port PORT]
//	  [--enable-sleep-mode] --host 127.0.0.1 EXTRA...
//
// Zero and empty fields are omitted so vLLM's own default applies; floats use
// the shortest exact decimal form so ParseVLLMArgv reads back the same value.
func VLLMArgs(p Profile) []string {
	f := p.VLLM
	a := []string{"serve", p.Model}
	if f.GPUMemoryUtilization != 0 {
		a = append(a, "--gpu-memory-utilization", strconv.FormatFloat(f.GPUMemoryUtilization, 'f', -1, 64))
	}
	if f.MaxNumSeqs != 0 {
		a = append(a, "--max-num-seqs", strconv.Itoa(f.MaxNumSeqs))
	}
	if f.MaxModelLen != 0 {
		a = append(a, "--max-model-len", strconv.Itoa(f.MaxModelLen))
	}
	if f.EnableAutoToolChoice {
		a = append(a, "--enable-auto-tool-choice")
	}
	if f.ToolCallParser != "" {
		a = append(a, "--tool-call-parser", f.ToolCallParser)
	}
	if f.Quantization != "" {
		a = append(a, "--quantization", f.Quantization)
	}
	if f.KVCacheDtype != "" {
		a = append(a, "--kv-cache-dtype", f.KVCacheDtype)
	}
	if s := p.ServedModelName(); s != "" {
		a = append(a, "--served-model-name", s)
	}
	if p.Port != 0 {
		a = append(a, "--port", strconv.Itoa(p.Port))
	}
	a = append(a, AddedVLLMArgs(p)...)
	return append(a, f.ExtraArgs...)
}

// AddedVLLMArgs are the words VLLMArgs adds beyond the profile's own
// settings: on several GPUs --tensor-parallel-size, with standby
// --enable-sleep-mode, and always (unless extra_args
// set a loopback host, which Validate checks) --host 127.0.0.1. The
// doctor's drift check counts them as wanted, since gpuhost put them there
// itself.
func AddedVLLMArgs(p Profile) []string {
	var a []string
	if n := p.GPUs.TensorParallel(); n > 1 {
		// One rank per GPU of the placement; the operator writes gpus,
		// not the size, so the two cannot disagree.
		a = append(a, "--tensor-parallel-size", strconv.Itoa(n))
	}
	if p.StandbyEnabled() {
		// Sleep mode is chosen at start; its endpoints come with vLLM's
		// development endpoints (VLLM_SERVER_DEV_MODE).
		a = append(a, "--enable-sleep-mode")
	}
	// Always loopback: without --host vLLM binds every interface, with no
	// auth, CORS * and (with standby) its sleep endpoints. Under systemd the
	// unit's private network namespace adds the real fence (RenderBackendUnit);
	// this is what is left under the demo's process runner.
	x := p.VLLM.ExtraArgs
	if !slices.Contains(x, "--host") && !slices.ContainsFunc(x, func(s string) bool { return strings.HasPrefix(s, "--host=") }) {
		a = append(a, "--host", "127.0.0.1")
	}
	return a
}

// Simulator flag names, shared with `gpuhost simulate`. Drift ignores them in
// a live argv because they are not vLLM settings.
const (
	SimFlagLoadTime   = "--load-time"
	SimFlagPrefillTPS = "--prefill-tps"
	SimFlagDecodeTPS  = "--decode-tps"
	SimFlagVRAMMiB    = "--vram-mib"
	SimFlagModel      = "--model"
	// Sleep mode of the simulated vLLM.
	SimFlagSleepResidualMiB = "--sleep-residual-mib"
	SimFlagWeightsMiB       = "--weights-mib"
	SimFlagH2DGBps          = "--h2d-gbps"
	SimFlagReloadGBps       = "--reload-gbps"
)

// SimArgs are the extra flags for `gpuhost simulate` taken from p.Sim; zero
// values are omitted so the simulator's defaults apply. For an Ollama profile
// it adds `--model MODEL` so the simulated Ollama has that model "pulled".
func SimArgs(p Profile) []string {
	var a []string
	if p.Sim.LoadTime != "" {
		a = append(a, SimFlagLoadTime, p.Sim.LoadTime)
	}
	if p.Sim.PrefillTPS != 0 {
		a = append(a, SimFlagPrefillTPS, strconv.FormatFloat(p.Sim.PrefillTPS, 'f', -1, 64))
	}
	if p.Sim.DecodeTPS != 0 {
		a = append(a, SimFlagDecodeTPS, strconv.FormatFloat(p.Sim.DecodeTPS, 'f', -1, 64))
	}
	if p.Sim.VRAMMiB != 0 {
		a = append(a, SimFlagVRAMMiB, strconv.Itoa(p.Sim.VRAMMiB))
	}
	if p.Backend == VLLM {
		if p.Sim.SleepResidualMiB != 0 {
			a = append(a, SimFlagSleepResidualMiB, strconv.Itoa(p.Sim.SleepResidualMiB))
		}
		if p.Sim.WeightsMiB != 0 {
			a = append(a, SimFlagWeightsMiB, strconv.Itoa(p.Sim.WeightsMiB))
		}
		if p.Sim.H2DGBps != 0 {
			a = append(a, SimFlagH2DGBps, strconv.FormatFloat(p.Sim.H2DGBps, 'f', -1, 64))
		}
		if p.Sim.ReloadGBps != 0 {
			a = append(a, SimFlagReloadGBps, strconv.FormatFloat(p.Sim.ReloadGBps, 'f', -1, 64))
		}
	}
	if p.Backend == Ollama && p.Model != "" {
		a = append(a, SimFlagModel, p.Model)
	}
	return a
}

// BackendArgs is what goes into GPUHOST_ARGS: the arguments after the unit's
// Exec prefix. For vLLM that is VLLMArgs; Ollama takes its settings from the
// environment, so its argv is just `serve`. With simulated set, SimArgs are
// appended for `gpuhost simulate`.
func BackendArgs(p Profile, simulated bool) []string {
	var a []string
	switch p.Backend {
	case VLLM:
		a = VLLMArgs(p)
	case Ollama:
		a = []string{"serve"}
	default:
		return nil
	}
	if simulated {
		a = append(a, SimArgs(p)...)
	}
	return a
}

// EnvFile renders the systemd EnvironmentFile for the backend unit: the
// profile name, GPUHOST_ARGS (BackendArgs joined by single spaces, split again
// by systemd at `$GPUHOST_ARGS`), the offline settings (OfflineEnv) unless the
// profile's network is open, and, for Ollama, its OLLAMA_* settings. Values
// are quoted per systemd's EnvironmentFile rules where needed; ParseEnvFile
// reads them back exactly.
func EnvFile(p Profile, simulated bool) string {
	return PinnedEnvFile(p, simulated, Pinning{})
}

// PinnedEnvFile is EnvFile with the backend pinned to its GPUs (PinEnv).
func PinnedEnvFile(p Profile, simulated bool, pin Pinning) string {
	var b strings.Builder
	b.WriteString("# Written by gpuhost on every switch; edits are overwritten. Profiles live in the gpuhost config.\n")
	line := func(k, v string) {
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(envQuote(v))
		b.WriteByte('\n')
	}
	line(EnvProfile, p.Name)
	line(EnvArgs, strings.Join(BackendArgs(p, simulated), " "))
	if p.Backend == VLLM && p.StandbyEnabled() {
		line(EnvVLLMDevMode, "1")
	}
	if p.Offline() {
		for _, e := range OfflineEnv(p.Backend) {
			line(e.Name, e.Value)
		}
	}
	if p.Backend == Ollama {
		line(EnvOllamaHost, "127.0.0.1:"+strconv.Itoa(p.Port))
		line(EnvOllamaKeep, p.Ollama.EffectiveKeepAlive())
		if p.Ollama.NumCtx > 0 {
			line(EnvOllamaContext, strconv.Itoa(p.Ollama.NumCtx))
		}
	}
	for _, e := range PinEnv(pin) {
		line(e.Name, e.Value)
	}
	return b.String()
}

// envQuote returns v as written after `KEY=` in an EnvironmentFile: bare when
// it is made of characters that are never special, double-quoted with `"`,
// `\`, “`” and `$` escaped otherwise.
func envQuote(v string) string {
	if v != "" && strings.IndexFunc(v, func(r rune) bool { return !plainRune(r) }) < 0 {
		return v
	}
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range v {
		switch r {
		case '"', '\\', '`', '$':
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	b.WriteByte('"')
	return b.String()
}

// plainRune reports characters that need no quoting in an EnvironmentFile
// value or an ExecStart word.
func plainRune(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' ||
		strings.ContainsRune("_-./:@+,=", r)
}

// ParseEnvFile reads an EnvironmentFile the way systemd does (env-file.c):
// `#`/`;` comment lines, bare values with backslash escapes and trimmed
// trailing whitespace, '…' verbatim, "…" with \" \\ \` \$ escapes, quoted
// values spanning lines, backslash-newline continuation. Assignments with an
// invalid name or invalid UTF-8, and lines without '=', are ignored, as systemd
// ignores them. Later assignments win. It never fails; doctor uses it to read
// which profile the file on disk describes.
func ParseEnvFile(text string) map[string]string {
	p := envParser{out: map[string]string{}, keyWS: -1, valWS: -1}
	for i := 0; i < len(text); i++ {
		p.step(text[i])
	}
	switch p.state {
	case envPreValue, envInValue, envValueEscape, envSingleQuote, envDoubleQuote, envDoubleQuoteEscape:
		p.commit() // the last assignment has no newline after it
	}
	return p.out
}

// envState is where ParseEnvFile's state machine (systemd's env-file.c) is.
type envState int

const (
	envPreKey envState = iota
	envInKey
	envPreValue
	envInValue
	envValueEscape
	envSingleQuote
	envDoubleQuote
	envDoubleQuoteEscape
	envComment
	envCommentEscape
)

// envParser is ParseEnvFile's state: the assignments so far and the one
// being read.
type envParser struct {
	state        envState
	out          map[string]string
	key, val     []byte
	keyWS, valWS int // start of trailing whitespace, -1 = none
}

func envIsNL(c byte) bool { return c == '\n' || c == '\r' }
func envIsWS(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// appendTrackingWS appends c to buf and keeps *ws at the start of buf's
// trailing whitespace (-1: none), which a bare key or value drops.
func appendTrackingWS(buf []byte, ws *int, c byte) []byte {
	if !envIsWS(c) {
		*ws = -1
	} else if *ws < 0 {
		*ws = len(buf)
	}
	return append(buf, c)
}

// commit stores the assignment read so far, if its name and value are
// valid, and starts the next one.
func (p *envParser) commit() {
	k := p.key
	if p.keyWS >= 0 {
		k = k[:p.keyWS]
	}
	v := p.val
	if p.valWS >= 0 {
		v = v[:p.valWS]
	}
	if envNameValid(string(k)) && utf8.Valid(v) {
		p.out[string(k)] = string(v)
	}
	p.key, p.val = p.key[:0], p.val[:0]
	p.keyWS, p.valWS = -1, -1
}

// step feeds one byte of the file to the state machine.
func (p *envParser) step(c byte) {
	switch p.state {
	case envPreKey, envInKey:
		p.keyByte(c)
	case envPreValue:
		p.preValueByte(c)
	case envInValue, envValueEscape:
		p.bareValueByte(c)
	case envSingleQuote, envDoubleQuote, envDoubleQuoteEscape:
		p.quotedValueByte(c)
	case envComment, envCommentEscape:
		p.commentByte(c)
	}
}

// keyByte: before and in the name, up to '='. A line without '=' is
// dropped.
func (p *envParser) keyByte(c byte) {
	if p.state == envPreKey {
		if c == '#' || c == ';' {
			p.state = envComment
		} else if !envIsWS(c) {
			p.state = envInKey
			p.keyWS = -1
			p.key = append(p.key, c)
		}
		return
	}
	switch {
	case envIsNL(c):
		p.state = envPreKey
		p.key = p.key[:0]
	case c == '=':
		p.state = envPreValue
		p.valWS = -1
	default:
		p.key = appendTrackingWS(p.key, &p.keyWS, c)
	}
}

// preValueByte: after '=' or a closing quote, before a bare value.
func (p *envParser) preValueByte(c byte) {
	switch {
	case envIsNL(c):
		p.state = envPreKey
		p.commit()
	case c == '\'':
		p.state = envSingleQuote
	case c == '"':
		p.state = envDoubleQuote
	case c == '\\':
		p.state = envValueEscape
	case !envIsWS(c):
		p.state = envInValue
		p.val = append(p.val, c)
	}
}

// bareValueByte: an unquoted value, with backslash escapes and
// backslash-newline continuation; trailing whitespace is dropped.
func (p *envParser) bareValueByte(c byte) {
	if p.state == envValueEscape {
		p.state = envInValue
		if !envIsNL(c) {
			p.val = append(p.val, c)
		}
		return
	}
	switch {
	case envIsNL(c):
		p.state = envPreKey
		p.commit()
	case c == '\\':
		p.state = envValueEscape
		p.valWS = -1
	default:
		p.val = appendTrackingWS(p.val, &p.valWS, c)
	}
}

// quotedValueByte: '…' verbatim; "…" with \" \\ \` \$ escapes (any other
// backslash is kept, a backslash-newline is dropped).
func (p *envParser) quotedValueByte(c byte) {
	switch p.state {
	case envSingleQuote:
		if c == '\'' {
			p.state = envPreValue
		} else {
			p.val = append(p.val, c)
		}
	case envDoubleQuote:
		switch c {
		case '"':
			p.state = envPreValue
		case '\\':
			p.state = envDoubleQuoteEscape
		default:
			p.val = append(p.val, c)
		}
	case envDoubleQuoteEscape:
		p.state = envDoubleQuote
		switch {
		case c == '"' || c == '\\' || c == '`' || c == '$':
			p.val = append(p.val, c)
		case c != '\n':
			p.val = append(p.val, '\\', c)
		}
	}
}

// commentByte: a '#' or ';' line up to its newline; a backslash before
// the newline does not continue the comment.
func (p *envParser) commentByte(c byte) {
	if p.state == envCommentEscape {
		if envIsNL(c) {
			p.state = envPreKey
		} else {
			p.state = envComment
		}
		return
	}
	if c == '\\' {
		p.state = envCommentEscape
	} else if envIsNL(c) {
		p.state = envPreKey
	}
}

// envNameValid mirrors systemd's env_name_is_valid: a non-empty name of
// letters, digits and '_', not starting with a digit.
func envNameValid(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}
