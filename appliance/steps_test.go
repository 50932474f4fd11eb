package appliance

import (
	"os"
	"strings"
	"syscall"
	"testing"

	"gpuhost/api"
)

// TestConfigureKeepsAnUnchangedEnvFile: a start whose env file already
// says what it needs leaves the file as it is (no rewrite, no sync); a
// first start writes it.
func TestConfigureKeepsAnUnchangedEnvFile(t *testing.T) {
	f := newProcFixture(t, "10ms")
	path := f.cfg.EnvFilePath(f.cfg.Backends.VLLM.Unit)
	var inodes []uint64
	for i, profile := range []string{"coder", "llama", "coder"} {
		evs, err := f.switchTo(t, profile)
		if err != nil {
			t.Fatalf("switch %d to %s: %v%s", i, profile, err, describe(evs))
		}
		if profile != "coder" {
			continue
		}
		ev, ok := stepEvent(evs, api.StepConfigure, api.StatusDone)
		want := "wrote "
		if i > 0 {
			want = "already as wanted"
		}
		if !ok || !strings.Contains(ev.Message, want) {
			t.Errorf("switch %d to coder: configure says %q, want %q", i, ev.Message, want)
		}
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		inodes = append(inodes, fi.Sys().(*syscall.Stat_t).Ino)
	}
	if len(inodes) != 2 || inodes[0] != inodes[1] {
		t.Errorf("env file inodes %v: the unchanged file was replaced", inodes)
	}
}
