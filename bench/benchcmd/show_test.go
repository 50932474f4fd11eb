package benchcmd

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"gpuhost/bench"
)

var updateGolden = flag.Bool("update", false, "rewrite testdata/show-result-v1.golden")

// TestShowGolden: `bench show` of the stored version-1 result prints the
// header, the llama-bench summary, the phase tables and the vLLM-style
// serving sweep exactly as in testdata/show-result-v1.golden (the start
// time, printed in the local zone, is replaced by STARTED). Run with
// -update to rewrite the file after an intended change of the text.
func TestShowGolden(t *testing.T) {
	data, err := os.ReadFile("../testdata/result-v1.json")
	if err != nil {
		t.Fatal(err)
	}
	r, err := bench.ParseResult(data)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, r.ID+".json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	out, _, err := runCmd(t, Deps{}, "show", r.ID, "--dir", dir)
	if err != nil {
		t.Fatal(err)
	}
	out = strings.Replace(out, r.StartedAt.Local().Format("2006-01-02 15:04:05"), "STARTED", 1)
	const golden = "testdata/show-result-v1.golden"
	if *updateGolden {
		if err := os.WriteFile(golden, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if out != string(want) {
		t.Errorf("bench show differs from %s (go test -run TestShowGolden -update rewrites it):\n%s", golden, out)
	}
	// JSON output is unchanged: the stored figures, not the tables.
	js, _, err := runCmd(t, Deps{}, "show", r.ID, "--dir", dir, "--json")
	if err != nil || strings.Contains(js, "pp512") || !strings.Contains(js, `"target_tokens": 512`) {
		t.Errorf("show --json: %v\n%s", err, js)
	}
}
