package appliance

import (
	"fmt"
	"os"
	"strings"

	"gpuhost/api"
	"gpuhost/config"
	"gpuhost/nvml"
	"gpuhost/units"
)

// Doctor check IDs of the GPU placement.
const (
	CheckGPUDevice  = "gpu.device"
	CheckGPUP2P     = "gpus.p2p"
	CheckGPUPinning = "gpus.pinning"
)

// deviceChecks are the driver's view of every GPU: one line each, so an
// operator sees which index is which card (by UUID and PCI address, the
// order NVML and nvidia-smi use) and what each holds.
func deviceChecks(snap nvml.Snapshot) []api.DoctorCheck {
	var out []api.DoctorCheck
	for _, d := range snap.Devices {
		msg := fmt.Sprintf("GPU %d: %s, %s", d.Index, d.Name, d.UUID)
		if d.PCIBusID != "" {
			msg += " at PCI " + d.PCIBusID
		}
		msg += fmt.Sprintf(", %d/%d MiB used, %d processes", d.MemoryUsedMiB, d.MemoryTotalMiB, len(d.Processes))
		out = append(out, api.DoctorCheck{ID: CheckGPUDevice, Severity: units.SeverityOK, Value: fmt.Sprintf("GPU %d", d.Index), Message: msg})
	}
	return out
}

// placementChecks say where p would run now: its fixed set must be present
// (auto: the set it would take now, or that it fits nowhere now), and for
// vLLM on several GPUs what was decided about P2P and why.
func placementChecks(p *units.Profile, snap nvml.Snapshot) []api.DoctorCheck {
	pl, err := placeProfile(p, snap)
	if err != nil {
		sev := units.SeverityFail
		if p.GPUs.Auto {
			sev = units.SeverityWarn // the free memory may change before a switch
		}
		return []api.DoctorCheck{{ID: CheckGPUs, Severity: sev, Profile: p.Name, Value: p.GPUs.String(), Message: err.Error(),
			Fix: "set profiles." + p.Name + ".gpus to GPUs listed by gpu.device"}}
	}
	msg := fmt.Sprintf("runs on GPU %s (%s), pinned by UUID with CUDA_DEVICE_ORDER=PCI_BUS_ID", units.IndicesString(pl.Indices), strings.Join(pl.UUIDs, ", "))
	if p.GPUs.Auto {
		msg = "auto: would take " + msg[len("runs on "):] + " now"
	}
	out := []api.DoctorCheck{{ID: CheckGPUs, Severity: units.SeverityOK, Profile: p.Name, Value: units.IndicesString(pl.Indices), Message: msg}}
	if p.Backend == units.VLLM && len(pl.Indices) > 1 {
		v := "p2p"
		if pl.P2PDisable {
			v = "NCCL_P2P_DISABLE=1"
		}
		out = append(out, api.DoctorCheck{ID: CheckGPUP2P, Severity: units.SeverityOK, Profile: p.Name, Value: v,
			Message: fmt.Sprintf("tensor parallel size %d: %s", len(pl.Indices), pl.P2PWhy)})
	}
	return out
}

// pinningChecks read each running backend unit's env file: the backend must
// be pinned by UUIDs of GPUs present, in PCI order. An env file written
// before placements (no pinning) is a warning that the next switch fixes.
func pinningChecks(cfg *config.Config, bs []backendState, snap nvml.Snapshot) []api.DoctorCheck {
	var out []api.DoctorCheck
	for _, b := range bs {
		if !b.status.Active() {
			continue
		}
		path := cfg.EnvFilePath(b.unit)
		data, err := os.ReadFile(path)
		if err != nil {
			continue // the unit's own checks say what is wrong with it
		}
		env := units.ParseEnvFile(string(data))
		out = append(out, pinningCheck(b, path, env, snap))
	}
	return out
}

func pinningCheck(b backendState, path string, env map[string]string, snap nvml.Snapshot) api.DoctorCheck {
	c := api.DoctorCheck{ID: CheckGPUPinning, Profile: b.profile, Value: b.unit}
	visible, order := env[units.EnvCUDAVisibleDevices], env[units.EnvCUDADeviceOrder]
	if visible == "" {
		c.Severity = units.SeverityWarn
		c.Message = fmt.Sprintf("%s runs unpinned (%s has no %s): it sees every GPU and CUDA orders them fastest first", b.unit, path, units.EnvCUDAVisibleDevices)
		c.Fix = "switch to the profile again (gpuhost switch " + b.profile + "): gpuhost writes the pinning at every switch"
		return c
	}
	var idx []string
	for _, u := range strings.Split(visible, ",") {
		found := false
		for _, d := range snap.Devices {
			if d.UUID == u {
				idx, found = append(idx, fmt.Sprint(d.Index)), true
			}
		}
		if !found {
			c.Severity = units.SeverityFail
			c.Message = fmt.Sprintf("%s is pinned to %s, which NVML does not report (a card removed or replaced?)", b.unit, u)
			c.Fix = "switch to the profile again so gpuhost pins it to the GPUs present"
			return c
		}
	}
	if order != units.CUDADeviceOrderPCI {
		c.Severity = units.SeverityWarn
		c.Message = fmt.Sprintf("%s is pinned by UUID but %s is %q, not PCI_BUS_ID", b.unit, units.EnvCUDADeviceOrder, order)
		c.Fix = "switch to the profile again"
		return c
	}
	c.Severity = units.SeverityOK
	c.Message = fmt.Sprintf("%s pinned to GPU %s by UUID, CUDA_DEVICE_ORDER=PCI_BUS_ID", b.unit, strings.Join(idx, ", "))
	if env[units.EnvNCCLP2PDisable] == "1" {
		c.Message += ", NCCL_P2P_DISABLE=1"
	}
	return c
}
