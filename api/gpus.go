package api

import (
	"fmt"
	"strings"
)

// GPUStatus is one GPU as /api/status shows it: which card (NVML index,
// UUID, PCI address), its memory, and who holds memory on it.
type GPUStatus struct {
	Index          int    `json:"index"`
	UUID           string `json:"uuid"`
	Name           string `json:"name"`
	PCIBusID       string `json:"pci_bus_id,omitempty"`
	MemoryUsedMiB  uint64 `json:"memory_used_mib"`
	MemoryTotalMiB uint64 `json:"memory_total_mib"`
	// Holders are the processes holding memory on it, each with the
	// backend unit and profile it belongs to (empty for a process that is
	// not gpuhost's).
	Holders []GPUHolder `json:"holders"`
	// Profiles are the profiles placed on this GPU by the config (a fixed
	// gpus set, or GPU 0 when unset); auto profiles are not listed.
	Profiles []string `json:"profiles,omitempty"`
}

// GPUHolder is one process holding memory on a GPU.
type GPUHolder struct {
	PID     int    `json:"pid"`
	Name    string `json:"name"`
	UsedMiB uint64 `json:"used_mib"`
	Unit    string `json:"unit,omitempty"`
	Profile string `json:"profile,omitempty"`
}

// Line is the GPU in one line, for `gpuhost status` and Telegram:
// "GPU 1 NVIDIA GeForce RTX 4090 (GPU-5a1f4090…) 6.1/24.0 GiB: llama (gpuhost-ollama.service) 6200 MiB".
func (g GPUStatus) Line() string {
	var b strings.Builder
	fmt.Fprintf(&b, "GPU %d %s (%s) %.1f/%.1f GiB", g.Index, g.Name, ShortUUID(g.UUID),
		float64(g.MemoryUsedMiB)/1024, float64(g.MemoryTotalMiB)/1024)
	if len(g.Holders) == 0 {
		b.WriteString(": free")
		return b.String()
	}
	var hs []string
	for _, h := range g.Holders {
		who := fmt.Sprintf("pid %d %s (not gpuhost's)", h.PID, h.Name)
		if h.Unit != "" {
			who = h.Unit
			if h.Profile != "" {
				who = h.Profile + " (" + h.Unit + ")"
			}
		}
		hs = append(hs, fmt.Sprintf("%s %d MiB", who, h.UsedMiB))
	}
	b.WriteString(": " + strings.Join(hs, ", "))
	return b.String()
}

// ShortUUID shortens a GPU UUID to its first group ("GPU-5a1f4090…"),
// enough to tell cards apart in a line.
func ShortUUID(u string) string {
	rest, ok := strings.CutPrefix(u, "GPU-")
	if i := strings.IndexByte(rest, '-'); ok && i >= 0 {
		return "GPU-" + rest[:i] + "…"
	}
	return u
}
