package nvml

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"gpuhost/internal/atomicfile"
)

// Claim is one simulated process's hold on simulated GPU memory. Simulator
// backends write one while they run so that the simulated GPU's used memory
// follows what is really running, across process boundaries, the way NVML
// reports other processes' allocations on a real card. A process rewrites
// its claim (WriteClaim replaces it) whenever what it holds changes, e.g. a
// vLLM going to sleep drops MiB to its residual and, at sleep level 1, holds
// the offloaded weights in HostMiB.
type Claim struct {
	PID int `json:"pid"`
	// MiB is the simulated GPU memory held.
	MiB uint64 `json:"mib"`
	// HostMiB is simulated host (CPU) memory held for the GPU's sake, such
	// as model weights offloaded to pinned host memory; it does not count
	// toward the GPU's used memory but toward Sim.HostMemAvailableMiB.
	// Omitted when 0, so claims written before it existed read the same.
	HostMiB uint64 `json:"host_mib,omitempty"`
	Name    string `json:"name"`
	// GPUs are the simulated GPU indices the process holds MiB on, each
	// (tensor parallelism allocates on every card it spans), as
	// comma-separated indices, see ClaimGPUs. Empty means device 0, so
	// claims written before it existed read the same.
	GPUs string `json:"gpus,omitempty"`
}

// ClaimGPUs is the Claim.GPUs text for indices ("" for none or just 0).
func ClaimGPUs(indices []int) string {
	if len(indices) == 0 || (len(indices) == 1 && indices[0] == 0) {
		return ""
	}
	words := make([]string, len(indices))
	for i, d := range indices {
		words[i] = strconv.Itoa(d)
	}
	return strings.Join(words, ",")
}

// On reports whether the claim holds memory on simulated device index.
func (c Claim) On(index int) bool {
	if c.GPUs == "" {
		return index == 0
	}
	for _, w := range strings.Split(c.GPUs, ",") {
		if n, err := strconv.Atoi(strings.TrimSpace(w)); err == nil && n == index {
			return true
		}
	}
	return false
}

// claimTempPrefix starts the name of a claim being written. Readers skip
// such files; ReadClaims deletes ones older than staleTempAge, which only a
// writer killed between create and rename leaves behind.
const (
	claimTempPrefix = ".claim-"
	staleTempAge    = time.Minute
)

// claimPath is where the claim of pid lives in dir.
func claimPath(dir string, pid int) string {
	return filepath.Join(dir, strconv.Itoa(pid)+".json")
}

// WriteClaim records (or replaces) the claim of c.PID in dir atomically
// (internal/atomicfile: temp file named claimTempPrefix*, fsync, rename,
// fsync of dir), so a reader never sees a half-written claim and a crash
// never leaves one.
func WriteClaim(dir string, c Claim) error {
	if c.PID <= 0 {
		return fmt.Errorf("write simulated VRAM claim in %s: invalid pid %d", dir, c.PID)
	}
	final := claimPath(dir, c.PID)
	data, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("write simulated VRAM claim %s: encode: %w", final, err)
	}
	if err := atomicfile.WriteWith(final, data, 0o600, atomicfile.Options{TempPattern: claimTempPrefix + "*"}); err != nil {
		return fmt.Errorf("simulated VRAM claim: %w", err)
	}
	return nil
}

// RemoveClaim drops the claim of pid, which releases its simulated memory; a
// missing claim is not an error, so a simulator may call it unconditionally
// on shutdown.
func RemoveClaim(dir string, pid int) error {
	if pid <= 0 {
		return fmt.Errorf("remove simulated VRAM claim in %s: invalid pid %d", dir, pid)
	}
	p := claimPath(dir, pid)
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove simulated VRAM claim %s: %w", p, err)
	}
	return nil
}

// ReadClaims returns the claims of processes that are still alive, sorted by
// PID. Claims of dead or zombie processes (for example a simulator killed
// with SIGKILL, reaped or not) are ignored and removed, which is how the
// simulated GPU releases memory on a crash, as a real driver does at process
// exit. Files that are not well-formed claims are skipped and left alone. A
// missing dir means no claims.
func ReadClaims(dir string) ([]Claim, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read simulated VRAM claims in %s: %w", dir, err)
	}
	var out []Claim
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, claimTempPrefix) {
			removeStaleTemp(dir, e)
			continue
		}
		if !e.Type().IsRegular() {
			continue
		}
		pidText, isJSON := strings.CutSuffix(name, ".json")
		if !isJSON {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			continue // removed between ReadDir and ReadFile, or not ours to read
		}
		c, err := parseClaim(data)
		if err != nil || strconv.Itoa(c.PID) != pidText {
			continue
		}
		if !processAlive(c.PID) {
			_ = os.Remove(filepath.Join(dir, name)) // a concurrent reader may have won
			continue
		}
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PID < out[j].PID })
	return out, nil
}

// removeStaleTemp deletes a temp file that a killed writer left behind. A
// young one may belong to a writer that is still running and is kept.
func removeStaleTemp(dir string, e os.DirEntry) {
	info, err := e.Info()
	if err != nil || time.Since(info.ModTime()) < staleTempAge {
		return
	}
	_ = os.Remove(filepath.Join(dir, e.Name()))
}

// parseClaim decodes one claim file. It rejects what WriteClaim would never
// write, so a stray file cannot add memory to the simulated GPU.
func parseClaim(data []byte) (Claim, error) {
	var c Claim
	if err := json.Unmarshal(data, &c); err != nil {
		return Claim{}, fmt.Errorf("decode simulated VRAM claim: %w", err)
	}
	if c.PID <= 0 {
		return Claim{}, fmt.Errorf("decode simulated VRAM claim: invalid pid %d", c.PID)
	}
	return c, nil
}

// processAlive reports whether pid exists and is not a zombie. A zombie has
// exited and, on a real GPU, has already released its memory; only its
// parent has not reaped it yet.
func processAlive(pid int) bool {
	if pid <= 0 {
		return false // kill(0 or negative) would address process groups
	}
	err := syscall.Kill(pid, 0)
	if err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	stat, rerr := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if rerr != nil {
		// With EPERM the process exists but /proc may hide it (hidepid);
		// without, it exited between kill and read.
		return errors.Is(err, syscall.EPERM) || !errors.Is(rerr, os.ErrNotExist)
	}
	state, ok := procState(stat)
	if !ok {
		return true // unknown format: kill said it exists
	}
	return state != 'Z' && state != 'X' && state != 'x'
}

// procState returns the state letter from the contents of /proc/<pid>/stat
// ("<pid> (<comm>) <state> ..."). The command name may itself contain spaces
// and parentheses, so the state is found after the last ')'.
func procState(stat []byte) (byte, bool) {
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) || s[i+1] != ' ' {
		return 0, false
	}
	return s[i+2], true
}
