package simulator

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"gpuhost/units"
)

// vllmShortValueFlags are vLLM's single-dash aliases that take a value.
var vllmShortValueFlags = map[string]string{
	"-q":  "--quantization",
	"-tp": "--tensor-parallel-size",
	"-pp": "--pipeline-parallel-size",
	"-dp": "--data-parallel-size",
	"-O":  "--compilation-config",
}

// ApplyVLLMArgv reads the words a vLLM unit's ExecStart passes after
// `gpuhost simulate vllm` (the same words `vllm serve` takes) into o, so one
// profile produces the same argv for the real server and the simulator, and
// the simulator honours the settings gpuhost checks (port, memory fraction,
// context length, concurrency, tool calling).
//
// Accepted: an optional leading "serve", the positional model (or --model),
// --served-model-name (one or more names, as vLLM's nargs="+": words after it
// up to the next flag are further names, not the model), --host, --port, --gpu-memory-utilization,
// --max-num-seqs, --max-model-len (with vLLM's k/K/m/M suffixes),
// --enable-auto-tool-choice, --enable-sleep-mode, --tool-call-parser,
// --quantization/-q and --kv-cache-dtype, each also as --flag=value. Any other flag is ignored
// together with its value. A malformed number is an error naming the flag.
func (o *Options) ApplyVLLMArgv(args []string) error {
	if len(args) > 0 && args[0] == "serve" {
		args = args[1:]
	}
	positional := false
	for i := 0; i < len(args); i++ {
		word := args[i]
		if word == "--" {
			for _, rest := range args[i+1:] {
				if err := o.setVLLMModel(rest, &positional); err != nil {
					return err
				}
			}
			return nil
		}
		if !strings.HasPrefix(word, "-") || word == "-" || isNegativeNumber(word) {
			if err := o.setVLLMModel(word, &positional); err != nil {
				return err
			}
			continue
		}
		name, value, inline := strings.Cut(word, "=")
		if long, ok := vllmShortValueFlags[name]; ok {
			name = long
		} else if strings.HasPrefix(name, "-O") && !strings.HasPrefix(name, "--") {
			continue // -O3 style compilation level, attached value
		}
		// vLLM (argparse) accepts both --max-model-len and --max_model_len.
		if strings.HasPrefix(name, "--") {
			name = "--" + strings.ReplaceAll(name[2:], "_", "-")
		}
		// A flag in units' table of vLLM booleans, or one spelled like a
		// switch, takes no value. Flags not matched and not starting
		// with --enable-/--disable-/--no- are assumed to take one value
		// when the next word does not start with "-", which keeps the
		// positional model from being swallowed by a flag the simulator
		// ignores.
		isBool := units.IsVLLMBoolFlag(strings.TrimPrefix(name, "--")) || strings.HasPrefix(name, "--no-") ||
			strings.HasPrefix(name, "--enable-") || strings.HasPrefix(name, "--disable-")
		if isBool {
			on := true
			if inline {
				b, err := strconv.ParseBool(value)
				if err != nil {
					return fmt.Errorf("vllm argv: flag %s: %q is not a boolean", name, value)
				}
				on = b
			}
			if name == "--enable-auto-tool-choice" {
				o.EnableAutoToolChoice = on
			}
			if name == "--no-enable-auto-tool-choice" {
				o.EnableAutoToolChoice = !on
			}
			if name == "--enable-sleep-mode" {
				o.EnableSleepMode = on
			}
			if name == "--no-enable-sleep-mode" {
				o.EnableSleepMode = !on
			}
			continue
		}
		if !inline {
			if i+1 >= len(args) || (strings.HasPrefix(args[i+1], "-") && !isNegativeNumber(args[i+1])) {
				if knownVLLMValueFlag(name) {
					return fmt.Errorf("vllm argv: flag %s needs a value", name)
				}
				continue // unknown flag without a value: treat as a switch
			}
			i++
			value = args[i]
			if name == "--served-model-name" {
				// nargs="+": every following word up to the next flag is a name.
				for i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
					i++
					o.ServedNameAliases = append(o.ServedNameAliases, args[i])
				}
			}
		}
		if err := o.setVLLMFlag(name, value); err != nil {
			return err
		}
	}
	return nil
}

func (o *Options) setVLLMModel(word string, seen *bool) error {
	if *seen {
		return fmt.Errorf("vllm argv: unexpected extra positional argument %q (model already %q)", word, o.Model)
	}
	*seen = true
	o.Model = word
	return nil
}

func knownVLLMValueFlag(name string) bool {
	switch name {
	case "--model", "--served-model-name", "--host", "--port", "--gpu-memory-utilization",
		"--max-num-seqs", "--max-model-len", "--tool-call-parser", "--quantization", "--kv-cache-dtype":
		return true
	}
	return false
}

func (o *Options) setVLLMFlag(name, value string) error {
	switch name {
	case "--model":
		o.Model = value
	case "--served-model-name":
		o.ServedName = value
	case "--host":
		o.Host = value
	case "--port":
		p, err := strconv.Atoi(value)
		if err != nil || p < 1 || p > 65535 {
			return fmt.Errorf("vllm argv: flag --port: %q is not a port number 1-65535", value)
		}
		o.Port = p
	case "--gpu-memory-utilization":
		f, err := strconv.ParseFloat(value, 64)
		if err != nil || math.IsNaN(f) || f <= 0 || f > 1 {
			return fmt.Errorf("vllm argv: flag --gpu-memory-utilization: %q is not a fraction in (0, 1]", value)
		}
		o.GPUMemoryUtilization = f
	case "--max-num-seqs":
		n, err := strconv.Atoi(value)
		if err != nil || n < 1 {
			return fmt.Errorf("vllm argv: flag --max-num-seqs: %q is not a positive integer", value)
		}
		o.MaxNumSeqs = n
	case "--max-model-len":
		n, err := parseHumanInt(value)
		if err != nil {
			return fmt.Errorf("vllm argv: flag --max-model-len: %w", err)
		}
		o.MaxModelLen = n
	case "--tool-call-parser":
		o.ToolCallParser = value
	case "--quantization":
		o.Quantization = value
	case "--kv-cache-dtype":
		o.KVCacheDType = value
	}
	return nil
}

// parseHumanInt parses vLLM's human-readable sizes: a plain integer, or a
// number with k/m/g (powers of 1000) or K/M/G (powers of 1024), e.g. "32k",
// "32K", "25.6k".
func parseHumanInt(s string) (int, error) {
	num, mult := s, 1.0
	if s != "" {
		switch s[len(s)-1] {
		case 'k':
			mult = 1e3
		case 'm':
			mult = 1e6
		case 'g':
			mult = 1e9
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		}
		if mult != 1 {
			num = s[:len(s)-1]
		}
	}
	if mult == 1 {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return 0, fmt.Errorf("%q is not a positive integer", s)
		}
		return n, nil
	}
	f, err := strconv.ParseFloat(num, 64)
	v := f * mult
	if err != nil || math.IsNaN(v) || v < 1 || v > math.MaxInt32 || v != math.Trunc(v) {
		return 0, fmt.Errorf("%q is not a positive whole number of tokens", s)
	}
	return int(v), nil
}

func isNegativeNumber(s string) bool {
	if len(s) < 2 || s[0] != '-' {
		return false
	}
	_, err := strconv.ParseFloat(s, 64)
	return err == nil
}
