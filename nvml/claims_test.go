package nvml

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"gpuhost/internal/testkit"
)

// dirNames lists dir, sorted.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names
}

func TestClaimRoundTrip(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "created", "on", "demand")
	self := os.Getpid()
	c := Claim{PID: self, MiB: 21000, Name: "vllm \"sim\" ✓"}
	if err := WriteClaim(dir, c); err != nil {
		t.Fatalf("WriteClaim: %v", err)
	}
	if got := dirNames(t, dir); !reflect.DeepEqual(got, []string{pidString(self) + ".json"}) {
		t.Fatalf("dir holds %v; want only the claim (no temp files)", got)
	}
	got, err := ReadClaims(dir)
	if err != nil || !reflect.DeepEqual(got, []Claim{c}) {
		t.Fatalf("ReadClaims = %+v, %v; want %+v", got, err, c)
	}

	if data, err := os.ReadFile(claimPath(dir, self)); err != nil || strings.Contains(string(data), "host_mib") {
		t.Fatalf("claim file %s (%v); want no host_mib when it is 0", data, err)
	}

	c.MiB, c.HostMiB = 500, 14000 // replace, as a vLLM going to sleep level 1 does
	if err := WriteClaim(dir, c); err != nil {
		t.Fatalf("WriteClaim (replace): %v", err)
	}
	if got, err := ReadClaims(dir); err != nil || !reflect.DeepEqual(got, []Claim{c}) {
		t.Fatalf("after replace ReadClaims = %+v, %v; want %+v", got, err, c)
	}
	if got := dirNames(t, dir); len(got) != 1 {
		t.Fatalf("after replace dir holds %v; want one file", got)
	}

	if err := RemoveClaim(dir, self); err != nil {
		t.Fatalf("RemoveClaim: %v", err)
	}
	if err := RemoveClaim(dir, self); err != nil {
		t.Fatalf("RemoveClaim of a missing claim: %v", err)
	}
	if got, err := ReadClaims(dir); err != nil || len(got) != 0 {
		t.Fatalf("after remove ReadClaims = %+v, %v; want none", got, err)
	}
}

func TestClaimInvalidPID(t *testing.T) {
	dir := t.TempDir()
	for _, pid := range []int{0, -1, -12345} {
		t.Run(fmt.Sprint(pid), func(t *testing.T) {
			if err := WriteClaim(dir, Claim{PID: pid, MiB: 1}); err == nil || !strings.Contains(err.Error(), "invalid pid") {
				t.Errorf("WriteClaim(pid %d) = %v; want invalid pid", pid, err)
			}
			if err := RemoveClaim(dir, pid); err == nil || !strings.Contains(err.Error(), "invalid pid") {
				t.Errorf("RemoveClaim(pid %d) = %v; want invalid pid", pid, err)
			}
		})
	}
	if got := dirNames(t, dir); len(got) != 0 {
		t.Fatalf("invalid claims left files: %v", got)
	}
}

func TestWriteClaimErrors(t *testing.T) {
	parent := t.TempDir()
	file := filepath.Join(parent, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Run("dir is a file", func(t *testing.T) {
		err := WriteClaim(file, Claim{PID: os.Getpid(), MiB: 1})
		if err == nil || !strings.Contains(err.Error(), file) {
			t.Fatalf("WriteClaim = %v; want an error naming %s", err, file)
		}
	})
	t.Run("claim path is a non-empty dir", func(t *testing.T) {
		dir := filepath.Join(parent, "claims")
		blocker := claimPath(dir, os.Getpid())
		if err := os.MkdirAll(filepath.Join(blocker, "x"), 0o755); err != nil {
			t.Fatal(err)
		}
		err := WriteClaim(dir, Claim{PID: os.Getpid(), MiB: 1})
		if err == nil || !strings.Contains(err.Error(), "rename") {
			t.Fatalf("WriteClaim = %v; want a rename error", err)
		}
		if got := dirNames(t, dir); !reflect.DeepEqual(got, []string{pidString(os.Getpid()) + ".json"}) {
			t.Fatalf("failed write left %v; want only the blocking dir", got)
		}
		if err := RemoveClaim(dir, os.Getpid()); err == nil {
			t.Fatal("RemoveClaim of a non-empty dir succeeded; want an error")
		}
	})
}

func TestReadClaimsSkipsForeignFiles(t *testing.T) {
	dir := t.TempDir()
	self := os.Getpid()
	files := map[string]string{
		"notes.txt":                 "hello",
		"abc.json":                  `{"pid":1,"mib":5}`,
		"12.json":                   fmt.Sprintf(`{"pid":%d,"mib":5}`, self), // name and content disagree
		pidString(self+1) + ".json": `{"pid":`,                               // truncated
		"0.json":                    `{"pid":0,"mib":5}`,
		"-3.json":                   `{"pid":-3,"mib":5}`,
		".hidden.json":              `{"pid":1,"mib":5}`,
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "1.json"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := WriteClaim(dir, Claim{PID: self, MiB: 7, Name: "me"}); err != nil {
		t.Fatal(err)
	}
	got, err := ReadClaims(dir)
	if err != nil || !reflect.DeepEqual(got, []Claim{{PID: self, MiB: 7, Name: "me"}}) {
		t.Fatalf("ReadClaims = %+v, %v; want only the own claim", got, err)
	}
	for name := range files {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Errorf("foreign file %s was touched: %v", name, err)
		}
	}
}

func TestReadClaimsSortedByPID(t *testing.T) {
	dir := t.TempDir()
	var want []Claim
	for i := 0; i < 3; i++ {
		c := Claim{PID: startSleeper(t).Process.Pid, MiB: uint64(i + 1)}
		want = append(want, c)
		if err := WriteClaim(dir, c); err != nil {
			t.Fatal(err)
		}
	}
	// Make one PID sort differently as text than as a number.
	c := Claim{PID: 1, MiB: 99, Name: "init"}
	want = append(want, c)
	if err := WriteClaim(dir, c); err != nil {
		t.Fatal(err)
	}
	sort.Slice(want, func(i, j int) bool { return want[i].PID < want[j].PID })
	got, err := ReadClaims(dir)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("ReadClaims = %+v, %v; want %+v", got, err, want)
	}
}

func TestReadClaimsRemovesStaleTempFiles(t *testing.T) {
	dir := t.TempDir()
	old := filepath.Join(dir, claimTempPrefix+"killed-writer")
	young := filepath.Join(dir, claimTempPrefix+"busy-writer")
	for _, p := range []string{old, young} {
		if err := os.WriteFile(p, []byte(`{"pid":1`), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	past := time.Now().Add(-2 * staleTempAge)
	if err := os.Chtimes(old, past, past); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadClaims(dir); err != nil {
		t.Fatal(err)
	}
	if got := dirNames(t, dir); !reflect.DeepEqual(got, []string{filepath.Base(young)}) {
		t.Fatalf("dir holds %v; want only the young temp file", got)
	}
}

func TestReadClaimsMissingDir(t *testing.T) {
	got, err := ReadClaims(filepath.Join(t.TempDir(), "nope"))
	if err != nil || got != nil {
		t.Fatalf("ReadClaims(missing) = %v, %v; want nil, nil", got, err)
	}
}

// TestClaimWritesAreAtomic: readers racing with writers that replace the
// same claim must always see a complete claim, and nothing is left behind.
func TestClaimWritesAreAtomic(t *testing.T) {
	dir := t.TempDir()
	self := os.Getpid()
	longName := strings.Repeat("x", 8192) // bigger than one write page
	if err := WriteClaim(dir, Claim{PID: self, MiB: 0, Name: longName}); err != nil {
		t.Fatal(err)
	}
	const writers, writes, readers = 4, 50, 4
	var wg sync.WaitGroup
	done := make(chan struct{})
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 1; i <= writes; i++ {
				if err := WriteClaim(dir, Claim{PID: self, MiB: uint64(i), Name: longName}); err != nil {
					t.Errorf("WriteClaim: %v", err)
					return
				}
			}
		}()
	}
	var rg sync.WaitGroup
	for r := 0; r < readers; r++ {
		rg.Add(1)
		go func() {
			defer rg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				data, err := os.ReadFile(claimPath(dir, self))
				if err != nil {
					t.Errorf("claim vanished during replace: %v", err)
					return
				}
				var c Claim
				if err := json.Unmarshal(data, &c); err != nil || c.Name != longName {
					t.Errorf("torn claim (%d bytes): %v", len(data), err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(done)
	rg.Wait()
	if got := dirNames(t, dir); !reflect.DeepEqual(got, []string{pidString(self) + ".json"}) {
		t.Fatalf("dir holds %v; want only the claim", got)
	}
}

func TestProcessAlive(t *testing.T) {
	reaped := startSleeper(t)
	reapedPID := reaped.Process.Pid
	_ = reaped.Process.Kill()
	_ = reaped.Wait()

	zombie := startSleeper(t)
	_ = zombie.Process.Signal(syscall.SIGKILL)
	testkit.Eventually(t, 10*time.Second, func() bool { return isZombie(zombie.Process.Pid) }, "zombie")

	tests := []struct {
		name string
		pid  int
		want bool
	}{
		{"self", os.Getpid(), true},
		{"live child", startSleeper(t).Process.Pid, true},
		{"init", 1, true},
		{"zombie child", zombie.Process.Pid, false},
		{"reaped child", reapedPID, false},
		{"zero (would be own process group)", 0, false},
		{"minus one (would be every process)", -1, false},
		{"beyond pid_max", 1 << 30, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := processAlive(tt.pid); got != tt.want {
				t.Fatalf("processAlive(%d) = %v; want %v", tt.pid, got, tt.want)
			}
		})
	}
}

func TestProcState(t *testing.T) {
	tests := []struct {
		in     string
		want   byte
		wantOK bool
	}{
		{"123 (sleep) S 1 2 3", 'S', true},
		{"123 (sleep) Z 1 2 3", 'Z', true},
		{"123 (a) b) R 1", 'R', true},
		{"123 (we ird) (x) D 0", 'D', true},
		{"123 (sleep)", 0, false},
		{"123 (sleep) ", 0, false},
		{"123 (sleep)S", 0, false},
		{"no parens at all", 0, false},
		{"", 0, false},
	}
	for _, tt := range tests {
		got, ok := procState([]byte(tt.in))
		if got != tt.want || ok != tt.wantOK {
			t.Errorf("procState(%q) = %q, %v; want %q, %v", tt.in, got, ok, tt.want, tt.wantOK)
		}
	}
}

func FuzzProcState(f *testing.F) {
	for _, s := range []string{"123 (sleep) S 1", "1 ()) Z", ")", ") ", ") X", ""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, stat []byte) {
		st, ok := procState(stat)
		if !ok {
			return
		}
		i := strings.LastIndexByte(string(stat), ')')
		if i < 0 || stat[i+2] != st {
			t.Fatalf("procState(%q) = %q; not the byte after the last ') '", stat, st)
		}
	})
}

func TestParseClaim(t *testing.T) {
	tests := []struct {
		in      string
		want    Claim
		wantErr bool
	}{
		{in: `{"pid":42,"mib":1024,"name":"vllm"}`, want: Claim{PID: 42, MiB: 1024, Name: "vllm"}},
		{in: `{"pid":42}`, want: Claim{PID: 42}},
		{in: `{"pid":42,"mib":512,"host_mib":14000,"name":"vllm"}`, want: Claim{PID: 42, MiB: 512, HostMiB: 14000, Name: "vllm"}},
		{in: `{"pid":42,"host_mib":-1}`, wantErr: true},
		{in: `{"pid":42,"mib":1,"extra":true}`, want: Claim{PID: 42, MiB: 1}},
		{in: `{"pid":0,"mib":1}`, wantErr: true},
		{in: `{"pid":-1,"mib":1}`, wantErr: true},
		{in: `{"pid":42,"mib":-1}`, wantErr: true},
		{in: `{"pid":"42"}`, wantErr: true},
		{in: `{"pid":42`, wantErr: true},
		{in: ``, wantErr: true},
		{in: `null`, wantErr: true},
	}
	for _, tt := range tests {
		got, err := parseClaim([]byte(tt.in))
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("parseClaim(%s) = %+v, %v; want %+v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func FuzzParseClaim(f *testing.F) {
	for _, s := range []string{`{"pid":42,"mib":1024,"name":"vllm"}`, `{"pid":0}`, `{`, `[]`, `{"pid":1e99}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := parseClaim(data)
		if err != nil {
			if c != (Claim{}) {
				t.Fatalf("parseClaim(%q) = %+v with error; want zero", data, c)
			}
			return
		}
		if c.PID <= 0 {
			t.Fatalf("parseClaim(%q) accepted pid %d", data, c.PID)
		}
		again, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		if back, err := parseClaim(again); err != nil || back != c {
			t.Fatalf("claim %+v does not survive a round trip: %+v, %v", c, back, err)
		}
	})
}

// FuzzReadClaims feeds arbitrary claim file contents through the whole read
// path: it must never panic, never count a claim under the wrong PID, and
// never delete a file it cannot parse.
func FuzzReadClaims(f *testing.F) {
	f.Add([]byte(`{"pid":1,"mib":5}`))
	f.Add([]byte(`{"pid":1,"mib":18446744073709551615}`))
	f.Add([]byte(`garbage`))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		p := filepath.Join(dir, "1.json")
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := ReadClaims(dir)
		if err != nil {
			t.Fatalf("ReadClaims: %v", err)
		}
		for _, c := range got {
			if c.PID != 1 {
				t.Fatalf("claim file 1.json read as pid %d", c.PID)
			}
		}
		if _, err := os.Stat(p); errors.Is(err, os.ErrNotExist) {
			t.Fatalf("ReadClaims deleted the claim of pid 1 (alive) for content %q", data)
		}
	})
}
