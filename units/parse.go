package units

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// VLLMSettings are the vLLM settings read back from a live command line.
// Zero values mean "flag not given" (vLLM's default applies), as in VLLMFlags.
type VLLMSettings struct {
	Model      string
	Flags      VLLMFlags // ExtraArgs is left empty; unknown words are in Unknown
	ServedName string
	Port       int
	// Unknown holds every word gpuhost does not manage, in order and as found
	// (`--flag value` stays two words, `--flag=value` one), including the
	// simulator's own flags when the command is `gpuhost simulate`.
	Unknown []string
	// ExtraServedNames are further names after the first of a
	// multi-valued --served-model-name (vLLM accepts several).
	ExtraServedNames []string
}

type flagKind int

const (
	kindString flagKind = iota
	kindInt
	kindHumanInt
	kindFloat
	kindBool
	kindNames // nargs="+": one or more plain words
)

// knownFlag is a vLLM flag gpuhost manages.
type knownFlag struct {
	flag string // canonical spelling, e.g. --max-num-seqs
	key  string // the profile key that sets it, for messages
	kind flagKind
}

var managedFlags = map[string]knownFlag{
	"model":                   {"--model", "model", kindString},
	"served-model-name":       {"--served-model-name", "served_name", kindNames},
	"port":                    {"--port", "port", kindInt},
	"gpu-memory-utilization":  {"--gpu-memory-utilization", "vllm.gpu_memory_utilization", kindFloat},
	"max-num-seqs":            {"--max-num-seqs", "vllm.max_num_seqs", kindInt},
	"max-model-len":           {"--max-model-len", "vllm.max_model_len", kindHumanInt},
	"enable-auto-tool-choice": {"--enable-auto-tool-choice", "vllm.enable_auto_tool_choice", kindBool},
	"tool-call-parser":        {"--tool-call-parser", "vllm.tool_call_parser", kindString},
	"quantization":            {"--quantization", "vllm.quantization", kindString},
	"kv-cache-dtype":          {"--kv-cache-dtype", "vllm.kv_cache_dtype", kindString},
}

// shortFlags are vLLM's one-letter aliases for managed flags.
var shortFlags = map[string]string{"q": "quantization"}

// vllmBoolFlags are vLLM serve flags that take no value, by long name
// without the leading dashes. Knowing them keeps an unknown-flag heuristic
// ("a flag followed by a plain word takes it as its value") from eating a
// positional model, as in `serve --trust-remote-code M`. Not exhaustive;
// an unlisted boolean followed by a plain word is misread. This is the one
// table: the simulator's argv parser reads it through IsVLLMBoolFlag.
var vllmBoolFlags = map[string]bool{
	"trust-remote-code":                       true,
	"enforce-eager":                           true,
	"headless":                                true,
	"async-scheduling":                        true,
	"skip-tokenizer-init":                     true,
	"return-tokens-as-token-ids":              true,
	"use-tqdm-on-load":                        true,
	"fully-sharded-loras":                     true,
	"calculate-kv-scales":                     true,
	"served-model-name-as-root":               true,
	"show-hidden-metrics":                     true,
	"worker-use-ray":                          true,
	"ray-workers-use-nsight":                  true,
	"multi-step-stream-outputs":               true,
	"allow-credentials":                       true,
	"disable-fastapi-docs":                    true,
	"enable-auto-tool-choice":                 true,
	"enable-prompt-tokens-details":            true,
	"enable-server-load-tracking":             true,
	"enable-force-include-usage":              true,
	"enable-request-id-headers":               true,
	"enable-tokenizer-info-endpoint":          true,
	"enable-log-outputs":                      true,
	"enable-log-requests":                     true,
	"disable-log-requests":                    true,
	"disable-log-stats":                       true,
	"disable-uvicorn-access-log":              true,
	"disable-frontend-multiprocessing":        true,
	"enable-ssl-refresh":                      true,
	"enable-sleep-mode":                       true,
	"enable-expert-parallel":                  true,
	"enable-eplb":                             true,
	"enable-lora":                             true,
	"enable-chunked-prefill":                  true,
	"enable-prefix-caching":                   true,
	"disable-custom-all-reduce":               true,
	"disable-sliding-window":                  true,
	"disable-cascade-attn":                    true,
	"disable-async-output-proc":               true,
	"enable-reasoning":                        true,
	"enable-lora-bias":                        true,
	"enable-multimodal-encoder-data-parallel": true,
}

// IsVLLMBoolFlag reports whether the vLLM serve flag name (the long name
// without leading dashes and without "=value", e.g. "trust-remote-code")
// takes no value. A "no-" prefix is not stripped: pass the bare name.
func IsVLLMBoolFlag(name string) bool { return vllmBoolFlags[name] }

// lookupFlag finds a managed flag by its name without dashes (as splitFlag
// returns it). vLLM's parser accepts underscores for dashes, and so do we.
func lookupFlag(name string) (knownFlag, bool) {
	if long, ok := shortFlags[name]; ok {
		name = long
	}
	kf, ok := managedFlags[name]
	return kf, ok
}

// isFlagWord reports whether w is an option rather than a value: it starts
// with '-' and is not a negative number or a lone '-'.
func isFlagWord(w string) bool {
	if len(w) < 2 || w[0] != '-' {
		return false
	}
	c := w[1]
	return !(c >= '0' && c <= '9' || c == '.')
}

// splitFlag turns "--max_num_seqs=3" into ("max-num-seqs", "3", true) and
// "-q" into ("q", "", false). Underscores become dashes in long names only.
func splitFlag(w string) (name, value string, hasValue bool) {
	long := strings.HasPrefix(w, "--")
	name = strings.TrimLeft(w, "-")
	if i := strings.IndexByte(name, '='); i >= 0 {
		name, value, hasValue = name[:i], name[i+1:], true
	}
	if long {
		name = strings.ReplaceAll(name, "_", "-")
	}
	return name, value, hasValue
}

var apiServerRe = regexp.MustCompile(`(^|[./])vllm[./]entrypoints[./](openai[./])?api_server(\.py)?$`)

// argvStart finds where vLLM's own arguments begin in a full command line and
// whether a positional model may follow. It skips interpreter and program
// words: `/usr/bin/python3 -m vllm.entrypoints.openai.api_server`,
// `/opt/venv/bin/vllm serve`, `gpuhost simulate vllm --sim-dir D serve`.
// Scanning stops at the first managed vLLM flag, so a later `serve` (say, a
// served name) is never mistaken for the subcommand.
func argvStart(argv []string) (start int, positional bool) {
	for i, w := range argv {
		if w == "serve" {
			return i + 1, true
		}
		if apiServerRe.MatchString(w) {
			return i + 1, false
		}
		if isFlagWord(w) {
			name, _, _ := splitFlag(w)
			if _, ok := lookupFlag(strings.TrimPrefix(name, "no-")); ok {
				break
			}
		}
	}
	// No subcommand or entrypoint: skip leading program words up to the
	// first option.
	for i, w := range argv {
		if isFlagWord(w) {
			return i, false
		}
	}
	return len(argv), false
}

// ParseVLLMArgv reads vLLM settings from a command line as found in a live
// unit's ExecStart or /proc/<pid>/cmdline, the inverse of VLLMArgs. It accepts
// leading program words (see argvStart), `--flag value` and `--flag=value`,
// underscores for dashes, `-q`, the model positionally after `serve` or as
// `--model`, `--no-enable-auto-tool-choice`, and human-readable
// --max-model-len values (`32k`, `32K`; `auto` reads as -1). Unknown flags
// and their values are kept verbatim in Unknown. Repeated flags: the last
// wins, as in vLLM.
//
// It fails, naming the flag, on a managed flag without a value, a value that
// is not a number where one is needed, or two different models.
func ParseVLLMArgv(argv []string) (VLLMSettings, error) {
	var s VLLMSettings
	if len(argv) == 0 {
		return s, errors.New("parsing vLLM command line: empty argv")
	}
	start, positional := argvStart(argv)
	var posModel, flagModel string
	for i := start; i < len(argv); i++ {
		w := argv[i]
		if w == "--" {
			s.Unknown = append(s.Unknown, argv[i:]...)
			break
		}
		if !isFlagWord(w) {
			if positional && posModel == "" {
				posModel = w
			} else {
				s.Unknown = append(s.Unknown, w)
			}
			continue
		}
		name, val, hasVal := splitFlag(w)
		negated := false
		kf, ok := lookupFlag(name)
		if !ok && strings.HasPrefix(name, "no-") {
			if k, ok2 := lookupFlag(name[3:]); ok2 && k.kind == kindBool {
				kf, ok, negated = k, true, true
			}
		}
		if !ok {
			s.Unknown = append(s.Unknown, w)
			bare := strings.TrimPrefix(name, "no-")
			if !hasVal && !vllmBoolFlags[bare] && i+1 < len(argv) && !isFlagWord(argv[i+1]) && argv[i+1] != "--" {
				i++
				s.Unknown = append(s.Unknown, argv[i])
			}
			continue
		}

		switch kf.kind {
		case kindBool:
			b := !negated
			if hasVal {
				v, err := parseBool(val)
				if err != nil {
					return s, fmt.Errorf("parsing vLLM flag %s: %w", w, err)
				}
				b = v != negated
			}
			s.Flags.EnableAutoToolChoice = b
			continue
		case kindNames:
			var names []string
			if hasVal {
				names = []string{val}
			} else {
				for i+1 < len(argv) && !isFlagWord(argv[i+1]) && argv[i+1] != "--" {
					i++
					names = append(names, argv[i])
				}
			}
			if len(names) == 0 {
				return s, fmt.Errorf("parsing vLLM flag %s: missing value", kf.flag)
			}
			s.ServedName, s.ExtraServedNames = names[0], names[1:]
			continue
		}

		if !hasVal {
			if i+1 >= len(argv) || isFlagWord(argv[i+1]) || argv[i+1] == "--" {
				return s, fmt.Errorf("parsing vLLM flag %s: missing value", kf.flag)
			}
			i++
			val = argv[i]
		}
		if err := s.set(kf, val, &flagModel); err != nil {
			return s, fmt.Errorf("parsing vLLM flag %s value %q: %w", kf.flag, val, err)
		}
	}
	switch {
	case posModel != "" && flagModel != "" && posModel != flagModel:
		return s, fmt.Errorf("parsing vLLM command line: two models, %q after serve and %q from --model", posModel, flagModel)
	case posModel != "":
		s.Model = posModel
	default:
		s.Model = flagModel
	}
	return s, nil
}

func (s *VLLMSettings) set(kf knownFlag, val string, model *string) error {
	switch kf.flag {
	case "--model":
		*model = val
	case "--tool-call-parser":
		s.Flags.ToolCallParser = val
	case "--quantization":
		s.Flags.Quantization = val
	case "--kv-cache-dtype":
		s.Flags.KVCacheDtype = val
	case "--port":
		n, err := strconv.Atoi(val)
		if err != nil {
			return fmt.Errorf("not an integer: %w", err)
		}
		if n < 0 || n > 65535 {
			return fmt.Errorf("port %d out of range 0..65535", n)
		}
		s.Port = n
	case "--max-num-seqs":
		n, err := strconv.Atoi(val)
		if err != nil {
			return fmt.Errorf("not an integer: %w", err)
		}
		s.Flags.MaxNumSeqs = n
	case "--max-model-len":
		n, err := parseHumanInt(val)
		if err != nil {
			return err
		}
		s.Flags.MaxModelLen = n
	case "--gpu-memory-utilization":
		f, err := strconv.ParseFloat(val, 64)
		if err != nil {
			return fmt.Errorf("not a number: %w", err)
		}
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return fmt.Errorf("not a finite number")
		}
		s.Flags.GPUMemoryUtilization = f
	}
	return nil
}

func parseBool(v string) (bool, error) {
	switch strings.ToLower(v) {
	case "1", "t", "true", "yes", "y", "on":
		return true, nil
	case "0", "f", "false", "no", "n", "off":
		return false, nil
	}
	return false, fmt.Errorf("%q is not a boolean", v)
}

var humanIntRe = regexp.MustCompile(`^(\d+(?:\.\d+)?)([kKmMgGtT])$`)

// parseHumanInt reads vLLM's human-readable integers: plain integers,
// decimal suffixes k/m/g/t (×1000…) allowing fractions ("25.6k"), binary
// suffixes K/M/G/T (×1024…) on whole numbers only, and "auto" (= -1).
func parseHumanInt(v string) (int, error) {
	v = strings.TrimSpace(v)
	if strings.EqualFold(v, "auto") {
		return -1, nil
	}
	m := humanIntRe.FindStringSubmatch(v)
	if m == nil {
		n, err := strconv.Atoi(v)
		if err != nil {
			return 0, fmt.Errorf("not an integer (or 32k, 32K, auto): %w", err)
		}
		return n, nil
	}
	num, suffix := m[1], m[2]
	exp := strings.IndexByte("kmgt", strings.ToLower(suffix)[0]) + 1
	if suffix == strings.ToLower(suffix) {
		f, err := strconv.ParseFloat(num, 64)
		if err != nil {
			return 0, fmt.Errorf("not a number: %w", err)
		}
		r := f * math.Pow(1000, float64(exp))
		if r > math.MaxInt32*1024.0 {
			return 0, fmt.Errorf("%s is too large", v)
		}
		return int(r), nil
	}
	n, err := strconv.Atoi(num)
	if err != nil {
		return 0, fmt.Errorf("binary suffix %s needs a whole number: %w", suffix, err)
	}
	shift := 10 * exp
	if n > (math.MaxInt32*1024)>>shift {
		return 0, fmt.Errorf("%s is too large", v)
	}
	return n << shift, nil
}

// Difference is one setting where a running backend differs from its profile.
// Flag is the vLLM flag (or "model"); Want and Live are display strings, with
// unset values spelled as what vLLM does then (e.g. "(vLLM default)").
type Difference struct{ Flag, Want, Live string }

// Drift compares a vLLM profile with the settings read from the running
// process. Unset values are compared by what vLLM does with them (an unset
// served name is the model, an unset port 8000, unset utilisation 0.9, unset
// kv-cache-dtype "auto"). Extra arguments are compared flag by flag, ignoring
// order and the simulator's own flags. It returns nil for non-vLLM profiles
// and when nothing differs.
func Drift(want Profile, live VLLMSettings) []Difference {
	if want.Backend != VLLM {
		return nil
	}
	var d []Difference
	cmp := func(flag, w, l string) {
		if w != l {
			d = append(d, Difference{Flag: flag, Want: w, Live: l})
		}
	}
	orDefault := func(s, def string) string {
		if s == "" {
			return def
		}
		return s
	}
	intOr := func(n int, zero string) string {
		switch {
		case n == 0:
			return zero
		case n == -1:
			return "auto"
		}
		return strconv.Itoa(n)
	}
	util := func(u float64) string {
		if u == 0 {
			u = VLLMDefaultGPUMemoryUtilization
		}
		return strconv.FormatFloat(u, 'f', -1, 64)
	}
	port := func(p int) string {
		if p == 0 {
			p = VLLMDefaultPort
		}
		return strconv.Itoa(p)
	}
	kv := func(s string) string {
		if s == "" {
			return "auto"
		}
		return s
	}

	w, l := want.VLLM, live.Flags
	cmp("model", want.Model, live.Model)
	liveServed := orDefault(live.ServedName, live.Model)
	if len(live.ExtraServedNames) > 0 {
		liveServed += " " + strings.Join(live.ExtraServedNames, " ")
	}
	cmp("--served-model-name", want.ServedModelName(), liveServed)
	cmp("--port", port(want.Port), port(live.Port))
	cmp("--gpu-memory-utilization", util(w.GPUMemoryUtilization), util(l.GPUMemoryUtilization))
	cmp("--max-num-seqs", intOr(w.MaxNumSeqs, "(vLLM default)"), intOr(l.MaxNumSeqs, "(vLLM default)"))
	cmp("--max-model-len", intOr(w.MaxModelLen, "(model default)"), intOr(l.MaxModelLen, "(model default)"))
	cmp("--enable-auto-tool-choice", strconv.FormatBool(w.EnableAutoToolChoice), strconv.FormatBool(l.EnableAutoToolChoice))
	cmp("--tool-call-parser", orDefault(w.ToolCallParser, "(unset)"), orDefault(l.ToolCallParser, "(unset)"))
	cmp("--quantization", orDefault(w.Quantization, "(auto-detected)"), orDefault(l.Quantization, "(auto-detected)"))
	cmp("--kv-cache-dtype", kv(w.KVCacheDtype), kv(l.KVCacheDtype))

	wantExtra, liveExtra := extraFlags(w.ExtraArgs, false), extraFlags(live.Unknown, true)
	keys := make([]string, 0, len(wantExtra)+len(liveExtra))
	for k := range wantExtra {
		keys = append(keys, k)
	}
	for k := range liveExtra {
		if _, ok := wantExtra[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	show := func(vals []string, ok bool) string {
		if !ok {
			return "(absent)"
		}
		return strings.Join(vals, " ")
	}
	for _, k := range keys {
		wv, wok := wantExtra[k]
		lv, lok := liveExtra[k]
		if wok != lok || !slices.Equal(wv, lv) {
			d = append(d, Difference{Flag: k, Want: show(wv, wok), Live: show(lv, lok)})
		}
	}
	return d
}

// extraFlags groups unmanaged words by flag so Drift can compare them
// regardless of order and of `--f v` versus `--f=v`. A flag without a value
// reads as "(set)"; a plain word stands for itself. With skipSim the
// simulator's own flags (and their values) are dropped.
func extraFlags(words []string, skipSim bool) map[string][]string {
	sim := map[string]bool{"load-time": true, "prefill-tps": true, "decode-tps": true, "vram-mib": true,
		"sleep-residual-mib": true, "weights-mib": true, "h2d-gbps": true, "reload-gbps": true}
	out := map[string][]string{}
	for i := 0; i < len(words); i++ {
		w := words[i]
		if !isFlagWord(w) {
			out[w] = append(out[w], "(set)")
			continue
		}
		name, val, hasVal := splitFlag(w)
		if !hasVal {
			val = "(set)"
			if !vllmBoolFlags[strings.TrimPrefix(name, "no-")] && i+1 < len(words) && !isFlagWord(words[i+1]) {
				i++
				val = words[i]
			}
		}
		if skipSim && sim[name] {
			continue
		}
		key := "--" + name
		if len(w) > 1 && w[1] != '-' {
			key = "-" + name
		}
		out[key] = append(out[key], val)
	}
	return out
}
