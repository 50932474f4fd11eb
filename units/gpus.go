package units

import (
	"fmt"
	"strconv"
	"strings"
)

// Environment a backend is pinned with (PinEnv). CUDA numbers devices
// fastest first unless CUDA_DEVICE_ORDER says PCI_BUS_ID, while NVML and
// nvidia-smi number them in PCI order; pinning by UUID names the card
// whatever the order, and the order is set too for anything that counts.
const (
	EnvCUDAVisibleDevices = "CUDA_VISIBLE_DEVICES"
	EnvCUDADeviceOrder    = "CUDA_DEVICE_ORDER"
	EnvNCCLP2PDisable     = "NCCL_P2P_DISABLE"
	// CUDADeviceOrderPCI is the CUDA_DEVICE_ORDER gpuhost sets.
	CUDADeviceOrderPCI = "PCI_BUS_ID"
)

// GPUSet is where a profile runs (key `gpus`): a list of NVML device
// indices, or `auto` (the first set where the profile fits, chosen at
// switch time). Unset means GPU 0, which is what a box had before it had
// placements.
type GPUSet struct {
	// Auto is `gpus: auto`.
	Auto bool
	// Indices are the listed NVML indices in the order written.
	Indices []int
	// Given records that the key was written, so `gpus: []` is an error
	// rather than the default.
	Given bool
	// bad is what was written when it was neither; validate names it
	// with the key (a decoder error would lose the key's path).
	bad string
}

// UnmarshalYAML reads `auto` or a list of integers (yaml.v3 accepts this
// form of the interface, so units need not import it).
func (g *GPUSet) UnmarshalYAML(unmarshal func(any) error) error {
	var word string
	if err := unmarshal(&word); err == nil {
		if word != "auto" {
			*g = GPUSet{Given: true, bad: word}
			return nil
		}
		*g = GPUSet{Auto: true, Given: true}
		return nil
	}
	var list []int
	if err := unmarshal(&list); err != nil {
		var v any
		_ = unmarshal(&v)
		*g = GPUSet{Given: true, bad: fmt.Sprint(v)}
		return nil //nolint:nilerr // reported by validate, with the key
	}
	*g = GPUSet{Indices: list, Given: true}
	return nil
}

// MarshalYAML writes the set back the way it is read.
func (g GPUSet) MarshalYAML() (any, error) {
	switch {
	case g.Auto:
		return "auto", nil
	case !g.Given:
		return nil, nil
	}
	return g.Indices, nil
}

// String is the set as the operator writes it: "auto", "[0]", "[0, 1]".
func (g GPUSet) String() string {
	if g.Auto {
		return "auto"
	}
	return IndicesString(g.Resolved())
}

// IndicesString writes indices as "[0, 1]".
func IndicesString(indices []int) string {
	words := make([]string, len(indices))
	for i, d := range indices {
		words[i] = strconv.Itoa(d)
	}
	return "[" + strings.Join(words, ", ") + "]"
}

// Resolved is the fixed set of indices: the listed ones, or [0] when the
// key is unset. It is nil for `auto`, which only a switch can resolve.
func (g GPUSet) Resolved() []int {
	if g.Auto {
		return nil
	}
	if !g.Given {
		return []int{0}
	}
	return g.Indices
}

// TensorParallel is the vLLM --tensor-parallel-size gpuhost sets for a
// fixed set: its length, or 0 (no flag) for one GPU or `auto`.
func (g GPUSet) TensorParallel() int {
	if n := len(g.Resolved()); n > 1 {
		return n
	}
	return 0
}

// validate checks the set itself (the devices present are checked at
// switch time, when NVML says which there are). heads is the model's
// attention head count when known (0 = unknown): vLLM splits heads across
// the tensor-parallel ranks, so the GPU count must divide it.
func (g GPUSet) validate(backend Backend, heads int) []FieldError {
	var errs []FieldError
	add := func(key, format string, a ...any) {
		errs = append(errs, FieldError{Key: key, Msg: fmt.Sprintf(format, a...)})
	}
	if g.Auto || !g.Given {
		return nil
	}
	if g.bad != "" {
		add("gpus", "%q is neither auto nor a list of GPU indices such as [0] or [0, 1]", g.bad)
		return errs
	}
	if len(g.Indices) == 0 {
		add("gpus", "must list at least one GPU index (e.g. [0]) or be auto; leave it out for GPU 0")
	}
	seen := map[int]bool{}
	for i, d := range g.Indices {
		key := fmt.Sprintf("gpus[%d]", i)
		switch {
		case d < 0:
			add(key, "GPU index must be >= 0 (NVML's index, as nvidia-smi shows it), got %d", d)
		case seen[d]:
			add(key, "GPU %d is listed twice", d)
		}
		seen[d] = true
	}
	if backend == VLLM && len(g.Indices) > 1 && heads > 0 && heads%len(g.Indices) != 0 {
		add("gpus", "%d GPUs means vLLM tensor parallel size %d, which does not divide the model's %d attention heads (model_params.attention_heads)", len(g.Indices), len(g.Indices), heads)
	}
	return errs
}

// tensorParallelArg finds --tensor-parallel-size (or -tp) in extra_args:
// its value text and whether it is there.
func tensorParallelArg(args []string) (string, bool) {
	for i, a := range args {
		name, val, hasVal := splitFlag(a)
		if name != "tensor-parallel-size" && name != "tp" {
			continue
		}
		if !hasVal && i+1 < len(args) && !isFlagWord(args[i+1]) {
			val = args[i+1]
		}
		return val, true
	}
	return "", false
}

// PlacementConflicts refuses a --tensor-parallel-size in a vLLM profile's
// extra_args that the placement would contradict: with `gpus:` gpuhost sets
// it from the set's size; without, the backend is pinned to GPU 0, where
// only 1 works. The config loader calls it beside Validate (which checks
// each argument word, not what the words mean together).
func (p Profile) PlacementConflicts() []FieldError {
	if p.Backend != VLLM {
		return nil
	}
	val, ok := tensorParallelArg(p.VLLM.ExtraArgs)
	if !ok {
		return nil
	}
	if p.GPUs.Given {
		return []FieldError{{"vllm.extra_args", fmt.Sprintf("--tensor-parallel-size %s is set by gpuhost from gpus (%s); remove it", val, p.GPUs)}}
	}
	if n, err := strconv.Atoi(val); err == nil && n > 1 {
		return []FieldError{{"vllm.extra_args", fmt.Sprintf("--tensor-parallel-size %s needs as many GPUs: set gpus (e.g. gpus: [0, 1]) instead, which pins them and sets the size", val)}}
	}
	return nil
}

// Pinning is what pins a backend to its GPUs at switch time, from the NVML
// snapshot: the UUIDs of the set, and whether NCCL must not use P2P (a pair
// of the set without working peer-to-peer access, as NVML reports it).
type Pinning struct {
	UUIDs      []string
	P2PDisable bool
}

// PinEnv is the environment of a pinned backend: CUDA_VISIBLE_DEVICES by
// UUID, CUDA_DEVICE_ORDER=PCI_BUS_ID and, when asked, NCCL_P2P_DISABLE=1.
// Nothing without UUIDs (the GPU facts were unavailable).
func PinEnv(pin Pinning) []EnvVar {
	if len(pin.UUIDs) == 0 {
		return nil
	}
	env := []EnvVar{
		{EnvCUDAVisibleDevices, strings.Join(pin.UUIDs, ",")},
		{EnvCUDADeviceOrder, CUDADeviceOrderPCI},
	}
	if pin.P2PDisable {
		env = append(env, EnvVar{EnvNCCLP2PDisable, "1"})
	}
	return env
}

// GPUNeedMiB is what p needs free on each of n GPUs of totalMiB each, by
// the fit estimate, for `gpus: auto`: vLLM takes its
// gpu_memory_utilization share of every GPU it spans (and refuses to start
// without that much free), so that is its need, unless the estimated model
// (weights and KV split over n, plus overhead) does not fit that share, in
// which case nothing fits (ok false). Ollama needs the estimate split over
// n plus overhead; with unknown model_params its need is 0 (any GPU).
func GPUNeedMiB(p Profile, totalMiB uint64, n int) (needMiB uint64, ok bool) {
	if n < 1 {
		n = 1
	}
	weights, _, kv := EstimateVRAM(p)
	known := p.Params.TotalParamsB > 0
	model := (weights+kv)/float64(n) + VRAMOverheadBytes
	if p.Backend == VLLM {
		budget := effectiveUtil(p) * float64(totalMiB) * (1 << 20)
		if known && model > budget {
			return 0, false
		}
		return uint64(budget / (1 << 20)), true
	}
	if !known {
		return 0, true
	}
	return uint64(model / (1 << 20)), true
}

// TensorParallelOK reports whether n GPUs suit p: always for Ollama (it
// spreads layers itself); for vLLM n must divide the model's attention
// heads when they are known.
func TensorParallelOK(p Profile, n int) bool {
	h := p.Params.AttentionHeads
	return p.Backend != VLLM || n <= 1 || h == 0 || h%n == 0
}
