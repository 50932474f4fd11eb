package simulator

import (
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
)

// simFlags are the simulator's own flags that take a value; they are taken
// out before the rest is read as `vllm serve` words.
var simFlags = map[string]bool{"--sim-dir": true, "--load-time": true, "--prefill-tps": true,
	"--decode-tps": true, "--vram-mib": true, "--served-name": true, "--model": true,
	"--schema-fault": true, "--tool-call-fault": true, "--transcription-fault": true, "--wake-fault": true, "--stop-delay": true,
	"--sleep-residual-mib": true, "--weights-mib": true, "--h2d-gbps": true, "--reload-gbps": true,
	"--jitter": true, "--jitter-seed": true, "--network": true, "--crash-file": true, "--crash-after-requests": true}

// simBoolFlags are the simulator's own flags without a value.
var simBoolFlags = map[string]bool{"--scripted-tools": true}

func withoutSimFlags(args []string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		name, _, hasValue := strings.Cut(args[i], "=")
		if simBoolFlags[name] {
			continue
		}
		if simFlags[name] {
			if !hasValue {
				i++ // skip the value word
			}
			continue
		}
		out = append(out, args[i])
	}
	return out
}

// ParseArgs turns the command line of `gpuhost simulate FLAVOR ARGS...`
// and the environment into the simulator's Options (Logger left unset).
// It reads the simulator's own flags (--port, --host, --model, --served-name,
// --load-time, --prefill-tps, --decode-tps, --vram-mib, --sim-dir,
// --stop-delay, --schema-fault, --tool-call-fault, --transcription-fault,
// --wake-fault, --crash-file, --crash-after-requests,
// --scripted-tools, --network auto|fenced|open (network.go: where the hub
// is unreachable it refuses to start without the offline settings,
// units.OfflineEnv), and for vllm's sleep mode --sleep-residual-mib,
// --weights-mib, --h2d-gbps, --reload-gbps, and --jitter, --jitter-seed for
// per-request rate noise) and, for vllm, the `vllm serve`
// words (ApplyVLLMArgv) and VLLM_SERVER_DEV_MODE (an integer, non-zero
// mounts the sleep routes, as vLLM reads it); for ollama, OLLAMA_HOST and
// OLLAMA_CONTEXT_LENGTH from getenv (nil: os.Getenv). Unknown flags are
// ignored. Errors name the flag or the variable.
func ParseArgs(flavor string, args []string, getenv func(string) string) (Options, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	opts := Options{Flavor: Flavor(flavor)}
	switch opts.Flavor {
	case FlavorVLLM:
		if err := opts.ApplyVLLMArgv(withoutSimFlags(args)); err != nil {
			return opts, err
		}
		if v := strings.TrimSpace(getenv("VLLM_SERVER_DEV_MODE")); v != "" {
			// vLLM: bool(int(os.getenv("VLLM_SERVER_DEV_MODE", "0"))).
			n, err := strconv.Atoi(v)
			if err != nil {
				return opts, fmt.Errorf("VLLM_SERVER_DEV_MODE=%q: want an integer (1 mounts the development routes)", v)
			}
			opts.DevMode = n != 0
		}
	case FlavorOllama:
		if h := getenv("OLLAMA_HOST"); h != "" {
			host, port, err := net.SplitHostPort(strings.TrimPrefix(h, "http://"))
			if err != nil {
				return opts, fmt.Errorf("OLLAMA_HOST=%q: want host:port: %w", h, err)
			}
			n, err := strconv.Atoi(port)
			if err != nil {
				return opts, fmt.Errorf("OLLAMA_HOST=%q: port is not a number", h)
			}
			opts.Host, opts.Port = host, n
		}
	default:
		return opts, fmt.Errorf("simulate %q: want vllm or ollama", flavor)
	}
	fs := pflag.NewFlagSet("simulate", pflag.ContinueOnError)
	fs.ParseErrorsAllowlist.UnknownFlags = true
	fs.SetOutput(io.Discard)
	port := fs.Int("port", 0, "")
	host := fs.String("host", "", "")
	models := fs.StringArray("model", nil, "")
	served := fs.String("served-name", "", "")
	load := fs.Duration("load-time", 0, "")
	fs.DurationVar(&opts.StopDelay, "stop-delay", 0, "")
	prefill := fs.Float64("prefill-tps", 0, "")
	decode := fs.Float64("decode-tps", 0, "")
	vram := fs.Int("vram-mib", 0, "")
	fs.StringVar(&opts.SimDir, "sim-dir", "", "")
	fs.StringVar(&opts.SchemaFault, "schema-fault", "", "")
	fs.StringVar(&opts.TranscriptionFault, "transcription-fault", "", "")
	fs.StringVar(&opts.ToolCallFault, "tool-call-fault", "", "")
	fs.StringVar(&opts.WakeFault, "wake-fault", "", "")
	fs.StringVar(&opts.CrashFile, "crash-file", "", "")
	fs.IntVar(&opts.CrashAfterRequests, "crash-after-requests", 0, "")
	fs.BoolVar(&opts.ScriptedTools, "scripted-tools", false, "")
	fs.IntVar(&opts.SleepResidualMiB, "sleep-residual-mib", 0, "")
	fs.IntVar(&opts.WeightsMiB, "weights-mib", 0, "")
	fs.Float64Var(&opts.H2DGBps, "h2d-gbps", 0, "")
	fs.Float64Var(&opts.ReloadGBps, "reload-gbps", 0, "")
	fs.Float64Var(&opts.Jitter, "jitter", 0, "")
	fs.Uint64Var(&opts.JitterSeed, "jitter-seed", 0, "")
	network := fs.String("network", NetworkAuto, "")
	if err := fs.Parse(args); err != nil {
		return opts, fmt.Errorf("simulate %s: %w", flavor, err)
	}
	if *port != 0 {
		opts.Port = *port
	}
	if *host != "" {
		opts.Host = *host
	}
	if len(*models) > 0 {
		if opts.Flavor == FlavorOllama {
			opts.Models = append(opts.Models, *models...)
		} else {
			opts.Model = (*models)[0]
		}
	}
	if *served != "" {
		opts.ServedName = *served
	}
	if fs.Changed("load-time") {
		opts.LoadTime = *load
	}
	if *prefill != 0 {
		opts.PrefillTPS = *prefill
	}
	if *decode != 0 {
		opts.DecodeTPS = *decode
	}
	if *vram != 0 {
		opts.VRAMMiB = *vram
	}
	if v := getenv("OLLAMA_CONTEXT_LENGTH"); v != "" && opts.Flavor == FlavorOllama {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return opts, fmt.Errorf("OLLAMA_CONTEXT_LENGTH=%q: want a positive number of tokens", v)
		}
		opts.MaxModelLen = n
	}
	return opts, checkOffline(opts.Flavor, *network, getenv)
}
