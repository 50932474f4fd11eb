package appliance

import (
	"context"
	"fmt"
	"strings"

	"gpuhost/nvml"
	"gpuhost/units"
)

// placement is where a profile runs at one switch: its NVML indices, the
// devices' UUIDs (what the backend is pinned by) and whether NCCL must not
// use peer-to-peer between them, with the reason (the doctor says it).
type placement struct {
	Indices    []int
	UUIDs      []string
	P2PDisable bool
	P2PWhy     string
}

// pinning is what units.PinnedEnvFile needs of it.
func (pl placement) pinning() units.Pinning {
	return units.Pinning{UUIDs: pl.UUIDs, P2PDisable: pl.P2PDisable}
}

// placeProfile resolves p's GPU set against snap: a fixed set must name
// devices that are present; auto takes the first set, single GPUs first in
// index order, then pairs and so on, where p's per-GPU need
// (units.GPUNeedMiB) is free on every device.
func placeProfile(p *units.Profile, snap nvml.Snapshot) (placement, error) {
	var idx []int
	if p.GPUs.Auto {
		var err error
		if idx, err = autoPlace(p, snap); err != nil {
			return placement{}, err
		}
	} else {
		idx = p.GPUs.Resolved()
		for i, d := range idx {
			if _, ok := snap.Device(d); !ok {
				key := fmt.Sprintf("profiles.%s.gpus[%d]", p.Name, i)
				if !p.GPUs.Given {
					key = fmt.Sprintf("profiles.%s.gpus (unset: GPU 0)", p.Name)
				}
				return placement{}, fmt.Errorf("profile %q: %s: GPU %d is not present (%s)", p.Name, key, d, presentGPUs(snap))
			}
		}
	}
	pl := placement{Indices: idx}
	for _, d := range idx {
		dev, _ := snap.Device(d)
		pl.UUIDs = append(pl.UUIDs, dev.UUID)
	}
	pl.P2PDisable, pl.P2PWhy = p2pDecision(p, snap, idx)
	return pl, nil
}

// p2pDecision decides NCCL_P2P_DISABLE for vLLM on several GPUs from NVML's
// P2P status of every pair (never from the card's name), and says why.
func p2pDecision(p *units.Profile, snap nvml.Snapshot, idx []int) (bool, string) {
	if len(idx) < 2 {
		return false, "one GPU: no peer-to-peer traffic"
	}
	if p.Backend != units.VLLM {
		return false, fmt.Sprintf("%s does not use NCCL", p.Backend)
	}
	missing := snap.P2PMissing(idx)
	if len(missing) == 0 {
		return false, "NVML reports P2P ok between every pair of " + units.IndicesString(idx)
	}
	var pairs []string
	for _, l := range missing {
		why := l.Status
		if l.Err != "" {
			why += ": " + l.Err
		}
		pairs = append(pairs, fmt.Sprintf("GPU %d–%d %s", l.A, l.B, why))
	}
	return true, "NVML reports no working P2P (" + strings.Join(pairs, ", ") + "): NCCL_P2P_DISABLE=1"
}

// autoPlace is the first GPU set where p fits; see placeProfile.
func autoPlace(p *units.Profile, snap nvml.Snapshot) ([]int, error) {
	n := len(snap.Devices)
	if n == 0 {
		return nil, fmt.Errorf("profile %q: profiles.%s.gpus: auto: no GPU present", p.Name, p.Name)
	}
	var tried []string
	for size := 1; size <= n; size++ {
		if !units.TensorParallelOK(*p, size) {
			continue
		}
		var found []int
		forEachSubset(n, size, func(set []int) bool {
			if fitsOn(p, snap, set, &tried) {
				found = append([]int(nil), set...)
				return false
			}
			return true
		})
		if found != nil {
			return found, nil
		}
	}
	return nil, fmt.Errorf("profile %q: profiles.%s.gpus: auto: fits on no GPU set now (%s)", p.Name, p.Name, strings.Join(tried, "; "))
}

// fitsOn reports whether p's per-GPU need is free on every device of set
// (by index into snap.Devices), noting each refusal in tried.
func fitsOn(p *units.Profile, snap nvml.Snapshot, set []int, tried *[]string) bool {
	for _, i := range set {
		d := snap.Devices[i]
		need, ok := units.GPUNeedMiB(*p, d.MemoryTotalMiB, len(set))
		if !ok {
			*tried = append(*tried, fmt.Sprintf("%s: the model does not fit GPU %d's budget", setOf(snap, set), d.Index))
			return false
		}
		if d.MemoryFreeMiB < need {
			*tried = append(*tried, fmt.Sprintf("%s: GPU %d has %d MiB free, needs %d", setOf(snap, set), d.Index, d.MemoryFreeMiB, need))
			return false
		}
	}
	return true
}

func setOf(snap nvml.Snapshot, set []int) string {
	idx := make([]int, len(set))
	for k, i := range set {
		idx[k] = snap.Devices[i].Index
	}
	return units.IndicesString(idx)
}

// forEachSubset calls fn with every size-k subset of 0..n-1 in
// lexicographic order until fn returns false.
func forEachSubset(n, k int, fn func([]int) bool) {
	set := make([]int, k)
	var rec func(start, depth int) bool
	rec = func(start, depth int) bool {
		if depth == k {
			return fn(set)
		}
		for i := start; i <= n-(k-depth); i++ {
			set[depth] = i
			if !rec(i+1, depth+1) {
				return false
			}
		}
		return true
	}
	rec(0, 0)
}

// presentGPUs says which GPUs the snapshot has, for errors.
func presentGPUs(snap nvml.Snapshot) string {
	if len(snap.Devices) == 0 {
		return "NVML reports no GPU"
	}
	idx := make([]int, 0, len(snap.Devices))
	for _, d := range snap.Devices {
		idx = append(idx, d.Index)
	}
	return fmt.Sprintf("NVML reports %d: %s", len(idx), units.IndicesString(idx))
}

// placedProfile is p with its GPU set fixed to pl, so that the argv
// (vLLM's --tensor-parallel-size) follows what auto chose.
func placedProfile(p units.Profile, pl placement) units.Profile {
	p.GPUs = units.GPUSet{Indices: pl.Indices, Given: p.GPUs.Given || len(pl.Indices) != 1 || pl.Indices[0] != 0}
	return p
}

// CheckGPUs is the ID of the placement check.
const CheckGPUs = "gpus"

// placementCheck refuses a switch to a fixed GPU set naming a device NVML
// does not report; ok (bad false) when the set is present, auto or the GPU
// facts are unavailable (the release wait refuses that on its own).
func (s *Supervisor) placementCheck(ctx context.Context, p *units.Profile) (units.Check, bool) {
	if p.GPUs.Auto || !p.GPUs.Given {
		return units.Check{}, false
	}
	snap, err := s.snapshot(ctx)
	if err != nil {
		return units.Check{}, false
	}
	if _, err := placeProfile(p, snap); err != nil {
		return units.Check{ID: CheckGPUs, Severity: units.SeverityFail, Value: p.GPUs.String(), Message: err.Error(),
			Fix: "set profiles." + p.Name + ".gpus to GPUs that `gpuhost status` lists"}, true
	}
	return units.Check{}, false
}

// fitDevice is the device whose size the fit checks judge p by: the
// smallest of its fixed set, or GPU 0 (unset or auto).
func fitDevice(p *units.Profile, snap nvml.Snapshot) (nvml.Device, bool) {
	if p.GPUs.Auto || !p.GPUs.Given {
		return snap.Device0()
	}
	var best nvml.Device
	found := false
	for _, i := range p.GPUs.Resolved() {
		if d, ok := snap.Device(i); ok && (!found || d.MemoryTotalMiB < best.MemoryTotalMiB) {
			best, found = d, true
		}
	}
	return best, found
}
