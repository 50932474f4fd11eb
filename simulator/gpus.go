package simulator

import (
	"os"
	"strconv"
	"strings"

	"gpuhost/nvml"
	"gpuhost/units"
)

// visibleSimGPUs is the Claim.GPUs of this process: the simulated devices
// that CUDA_VISIBLE_DEVICES names, by UUID (nvml.SimUUIDFor) or index, as a
// real backend would allocate on each GPU it sees. Unset, empty or naming
// no simulated device, it is device 0, as before placements.
func visibleSimGPUs() string {
	return simGPUsOf(os.Getenv(units.EnvCUDAVisibleDevices))
}

func simGPUsOf(visible string) string {
	var idx []int
	for _, w := range strings.Split(visible, ",") {
		w = strings.TrimSpace(w)
		if i, ok := nvml.SimDeviceIndex(w); ok {
			idx = append(idx, i)
		} else if n, err := strconv.Atoi(w); err == nil && n >= 0 {
			idx = append(idx, n)
		}
	}
	return nvml.ClaimGPUs(idx)
}
