package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func testResult(id string, at time.Time) *Result {
	return &Result{SchemaVersion: SchemaVersion, ID: id, Status: StatusOK, StartedAt: at, FinishedAt: at.Add(time.Minute),
		Decode: []Decode{{Tokens: 128, TokS: NewStat([]float64{150, 151})}}}
}

func TestStoreSaveLoadList(t *testing.T) {
	var logs bytes.Buffer
	s := &Store{Dir: filepath.Join(t.TempDir(), "bench"), Log: slog.New(slog.NewTextHandler(&logs, nil))}
	t0 := time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)
	r1 := testResult(NewID(t0, "coder"), t0)
	p1, err := s.Save(r1)
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Base(p1) != "20260102T150405Z-coder.json" {
		t.Fatalf("path %s", p1)
	}
	// Same second, same profile: a suffix, never an overwrite.
	r2 := testResult(NewID(t0, "coder"), t0.Add(time.Millisecond))
	p2, err := s.Save(r2)
	if err != nil || r2.ID != "20260102T150405Z-coder-2" || p1 == p2 {
		t.Fatalf("second save: %s %s %v", r2.ID, p2, err)
	}
	got, err := s.Load(r1.ID)
	if err != nil || got.Decode[0].TokS.Mean != 150.5 {
		t.Fatalf("load: %+v %v", got, err)
	}
	if latest, err := s.Load("latest"); err != nil || latest.ID != r2.ID {
		t.Fatalf("latest = %v, %v", latest, err)
	}
	// No temp files left behind.
	entries, _ := os.ReadDir(s.Dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("leftover temp file %s", e.Name())
		}
	}

	// Corrupt, foreign and future files are skipped with a warning naming them.
	bad := map[string]string{
		"20260103T000000Z-truncated.json": `{"schema_version": 1, "id": "20260103T000000Z-trunc`,
		"20260103T000001Z-foreign.json":   `{"hello": "world"}`,
		"20260103T000002Z-future.json":    `{"schema_version": 99, "id": "20260103T000002Z-future"}`,
		"20260103T000003Z-badid.json":     `{"schema_version": 1, "id": "../../etc/passwd"}`,
	}
	for name, body := range bad {
		if err := os.WriteFile(filepath.Join(s.Dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(s.Dir, "notes.txt"), []byte("ignored"), 0o644); err != nil {
		t.Fatal(err)
	}
	all, warns, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 || all[0].ID != r1.ID || all[1].ID != r2.ID {
		t.Fatalf("list = %d results", len(all))
	}
	if len(warns) != len(bad) {
		t.Fatalf("warnings = %v", warns)
	}
	for _, w := range warns {
		if _, ok := bad[filepath.Base(w.File)]; !ok || w.Reason == "" {
			t.Errorf("warning %v does not name a bad file", w)
		}
		if !strings.Contains(logs.String(), filepath.Base(w.File)) {
			t.Errorf("log does not name %s", w.File)
		}
	}
	if !strings.Contains(warnText(warns), "newer than this gpuhost reads") {
		t.Errorf("future schema not explained: %v", warns)
	}
}

func warnText(ws []Warning) string {
	var b strings.Builder
	for _, w := range ws {
		b.WriteString(w.String() + "\n")
	}
	return b.String()
}

func TestStoreRejectsBadIDs(t *testing.T) {
	s := &Store{Dir: t.TempDir(), Log: slog.Default()}
	for _, id := range []string{"", "../x", "20260102T150405Z-../../x", "20260102T150405Z-a/b", "latest2", "20260102T150405Z-.."} {
		if _, err := s.Load(id); !errors.Is(err, ErrNotFound) {
			t.Errorf("Load(%q) = %v, want ErrNotFound", id, err)
		}
	}
	if _, err := s.Save(&Result{ID: "../evil"}); err == nil {
		t.Error("Save accepted a bad id")
	}
	if _, err := s.Load("latest"); !errors.Is(err, ErrNotFound) {
		t.Errorf("latest on an empty store = %v", err)
	}
	// A missing directory is an empty store, not an error.
	all, warns, err := (&Store{Dir: filepath.Join(t.TempDir(), "nope")}).List()
	if err != nil || all != nil || warns != nil {
		t.Errorf("missing dir: %v %v %v", all, warns, err)
	}
}

func TestNewID(t *testing.T) {
	t0 := time.Date(2026, 3, 4, 5, 6, 7, 0, time.FixedZone("x", 3600))
	for name, want := range map[string]string{
		"coder":                   "20260304T040607Z-coder",
		"Qwen/Qwen3-Coder:latest": "20260304T040607Z-Qwen_Qwen3-Coder_latest",
		"":                        "20260304T040607Z-run",
		"../..":                   "20260304T040607Z-run",
	} {
		if got := NewID(t0, name); got != want || !ValidID(got) {
			t.Errorf("NewID(%q) = %q (valid %v), want %q", name, got, ValidID(got), want)
		}
	}
}

func FuzzParseResult(f *testing.F) {
	good, _ := os.ReadFile("testdata/result-v1.json")
	f.Add(good)
	sw, _ := os.ReadFile("testdata/switch-result-v1.json")
	f.Add(sw)
	f.Add([]byte(`{"schema_version": 1}`))
	f.Add([]byte(`{"schema_version": 1, "id": "20260102T150405Z-x", "prefill": [{"tok_s": {"samples": [1e308, -0]}}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := ParseResult(data)
		if err == nil {
			if !ValidID(r.ID) {
				t.Fatalf("accepted id %q", r.ID)
			}
			_ = r.Metrics()
			if c, err := Compare(r, r, CompareOptions{}); err == nil {
				_ = c.WriteText(&bytes.Buffer{})
			}
			_ = ChartSVG([]Result{*r})
			_ = WriteReport(&bytes.Buffer{}, r)
		}
	})
}

// TestSchemaV1Golden: a stored version-1 result (written by this code,
// kept in testdata) still reads, with every figure.
func TestSchemaV1Golden(t *testing.T) {
	data, err := os.ReadFile("testdata/result-v1.json")
	if err != nil {
		t.Fatal(err)
	}
	r, err := ParseResult(data)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, m := range r.Metrics() {
		names[m.Name] = m.Stat.N == 2
	}
	for _, want := range []string{"prefill.512.tok_s", "prefill.512.ttft_ms", "decode.128.tok_s", "serving.c1.output_tok_s",
		"serving.c4.req_s", "serving.c4.ttft_p99_ms", "serving.c4.tpot_p50_ms", "serving.c4.itl_p50_ms", "serving.c4.e2e_p50_ms"} {
		if !names[want] {
			t.Errorf("metric %s missing or without 2 samples", want)
		}
	}
	if r.Roofline == nil || !near(r.Roofline.BandwidthGBs, 1008, 0.5) || len(r.CrossChecks) != 2 || r.Fingerprint.Driver != "610.43.02" {
		t.Errorf("roofline %+v, cross-checks %d, fingerprint %+v", r.Roofline, len(r.CrossChecks), r.Fingerprint)
	}
}

// TestSwitchSchemaV1Golden: a stored `bench switch` result (written by this
// code against the simulator daemon, kept in testdata) still reads, with
// its samples, groups and metrics.
func TestSwitchSchemaV1Golden(t *testing.T) {
	data, err := os.ReadFile("testdata/switch-result-v1.json")
	if err != nil {
		t.Fatal(err)
	}
	r, err := ParseResult(data)
	if err != nil {
		t.Fatal(err)
	}
	sb := r.Switch
	if r.SchemaVersion != 1 || r.Kind() != KindSwitch || sb == nil || sb.A != "coder" || sb.B != "llama" || sb.Rounds != 2 ||
		len(sb.Samples) != 8 || len(sb.Groups) != 4 || len(sb.Profiles) != 2 || sb.RequestPath != RequestPathMeasured {
		t.Fatalf("switch result %+v", sb)
	}
	for _, g := range sb.Groups {
		if g.N != 2 || g.FirstTokenMS.N != 2 || g.SwitchMS.N != 2 || g.Mode != ModeCold {
			t.Errorf("group %+v", g)
		}
	}
	names := map[string]bool{}
	for _, m := range r.Metrics() {
		names[m.Name] = m.Stat.N == 2
	}
	for _, want := range []string{"switch.coder->llama.switch_path.cold.first_token_ms", "switch.coder->llama.request_path.cold.switch_ms",
		"switch.llama->coder.switch_path.cold.switch_ms", "switch.llama->coder.request_path.cold.first_token_ms"} {
		if !names[want] {
			t.Errorf("metric %s missing or without 2 samples", want)
		}
	}
	if len(names) != 8 {
		t.Errorf("%d metrics, want 8", len(names))
	}
}

// TestStoreRetention: after each Save the oldest results (by the time in
// their ID) beyond bench.max_results files or bench.max_bytes go; the
// result just saved stays even when its ID is the oldest (before: no
// bound; 50 uploads of ~4 MB took 201 MB on disk).
func TestStoreRetention(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)
	ids := func(s *Store) []string {
		all, warns, err := s.List()
		if err != nil || len(warns) > 0 {
			t.Fatalf("list: %v %v", err, warns)
		}
		var out []string
		for _, r := range all {
			out = append(out, strings.TrimPrefix(r.ID, "20260102T1504"))
		}
		return out
	}
	t.Run("count", func(t *testing.T) {
		s := &Store{Dir: t.TempDir(), Log: slog.New(slog.DiscardHandler), MaxResults: 3}
		for i := range 5 {
			at := t0.Add(time.Duration(i) * time.Second)
			if _, err := s.Save(testResult(NewID(at, "coder"), at)); err != nil {
				t.Fatal(err)
			}
		}
		if got := strings.Join(ids(s), " "); got != "07Z-coder 08Z-coder 09Z-coder" {
			t.Errorf("kept %q, want the 3 newest", got)
		}
		// A result with an old ID (an upload measured long ago) is kept;
		// the oldest of the others goes.
		old := t0.Add(-time.Hour)
		if _, err := s.Save(testResult(NewID(old, "old"), old)); err != nil {
			t.Fatal(err)
		}
		all, _, _ := s.List()
		if len(all) != 3 || all[0].ID != NewID(old, "old") || all[1].ID != NewID(t0.Add(3*time.Second), "coder") {
			t.Errorf("kept %d results, want the just-saved old one and the two newest", len(all))
		}
	})
	t.Run("bytes", func(t *testing.T) {
		s := &Store{Dir: t.TempDir(), Log: slog.New(slog.DiscardHandler)}
		r := testResult(NewID(t0, "big"), t0)
		r.Notes = []string{strings.Repeat("n", 10_000)}
		if _, err := s.Save(r); err != nil {
			t.Fatal(err)
		}
		info, err := os.Stat(s.path(r.ID))
		if err != nil {
			t.Fatal(err)
		}
		s.MaxBytes = 3*info.Size() + info.Size()/2 // room for three
		for i := 1; i < 6; i++ {
			at := t0.Add(time.Duration(i) * time.Second)
			r := testResult(NewID(at, "big"), at)
			r.Notes = []string{strings.Repeat("n", 10_000)}
			if _, err := s.Save(r); err != nil {
				t.Fatal(err)
			}
		}
		if got := strings.Join(ids(s), " "); got != "08Z-big 09Z-big 10Z-big" {
			t.Errorf("kept %q, want the 3 newest", got)
		}
	})
}

// TestStoreListParsesOnce: List reads a file again only when its size or
// modification time changed (before: every List parsed every file whole);
// a deleted file leaves the list.
func TestStoreListParsesOnce(t *testing.T) {
	s := &Store{Dir: t.TempDir(), Log: slog.New(slog.DiscardHandler)}
	t0 := time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)
	r := testResult(NewID(t0, "coder"), t0)
	path, err := s.Save(r)
	if err != nil {
		t.Fatal(err)
	}
	if all, _, _ := s.List(); len(all) != 1 {
		t.Fatalf("list: %d results", len(all))
	}
	// Same size, same mtime, different bytes: not read again.
	info, _ := os.Stat(path)
	data, _ := os.ReadFile(path)
	if err := os.WriteFile(path, bytes.Repeat([]byte("x"), len(data)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, info.ModTime(), info.ModTime()); err != nil {
		t.Fatal(err)
	}
	if all, warns, _ := s.List(); len(all) != 1 || len(warns) != 0 {
		t.Fatalf("unchanged file read again: %d results, warnings %v", len(all), warns)
	}
	// A changed mtime: read again (and now it is corrupt).
	if err := os.Chtimes(path, info.ModTime().Add(time.Second), info.ModTime().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if all, warns, _ := s.List(); len(all) != 0 || len(warns) != 1 {
		t.Fatalf("changed file not read again: %d results, warnings %v", len(all), warns)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if all, warns, _ := s.List(); len(all) != 0 || len(warns) != 0 || len(s.cache) != 0 {
		t.Fatalf("deleted file still listed: %d results, %d warnings, %d cached", len(all), len(warns), len(s.cache))
	}
}

// TestStorePrunesByArrival: retention follows when results arrived, not
// the ID or started_at a client chose: an upload dated 2999 that arrived
// first is the first to go, and genuine later results stay.
func TestStorePrunesByArrival(t *testing.T) {
	s := &Store{Dir: t.TempDir(), Log: slog.New(slog.DiscardHandler), MaxResults: 3}
	past := time.Now().Add(-time.Hour)
	save := func(i int, at time.Time, name string) string {
		t.Helper()
		path, err := s.Save(testResult(NewID(at, name), at))
		if err != nil {
			t.Fatal(err)
		}
		// Arrival order made explicit (file times can tie within a tick).
		arrived := past.Add(time.Duration(i) * time.Minute)
		if err := os.Chtimes(path, arrived, arrived); err != nil {
			t.Fatal(err)
		}
		return filepath.Base(path)
	}
	future := time.Date(2999, 12, 31, 23, 59, 59, 0, time.UTC)
	t0 := time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)
	save(0, future, "forged")
	for i := 1; i <= 3; i++ {
		save(i, t0.Add(time.Duration(i)*time.Second), "coder")
	}
	all, _, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range all {
		got = append(got, r.ID)
	}
	want := []string{NewID(t0.Add(time.Second), "coder"), NewID(t0.Add(2*time.Second), "coder"), NewID(t0.Add(3*time.Second), "coder")}
	if !slices.Equal(got, want) {
		t.Errorf("kept %v, want the three genuine results (the forged 2999 one arrived first)", got)
	}
}

// TestParseResultBoundsValues: a result inflated with many small values
// (580k one-character notes held ~14 MB parsed) is refused before it is
// decoded, naming the bound; real results pass.
func TestParseResultBoundsValues(t *testing.T) {
	at := time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)
	r := testResult(NewID(at, "coder"), at)
	r.Notes = make([]string, MaxResultValues)
	for i := range r.Notes {
		r.Notes[i] = "x"
	}
	data, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseResult(data); err == nil || !strings.Contains(err.Error(), "JSON values") {
		t.Errorf("inflated result: %v, want a refusal naming the values", err)
	}
	for _, f := range []string{"testdata/result-v1.json", "testdata/switch-result-v1.json"} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ParseResult(data); err != nil {
			t.Errorf("%s: %v", f, err)
		}
		if n := countValues(data); n < 300 || n > 2000 {
			t.Errorf("%s: %d values counted; a real result has a few hundred", f, n)
		}
	}
	if n := countValues([]byte(`{"a":"x,{[","b":[1,2,{"c":"\"]"}]}`)); n != 7 {
		t.Errorf("countValues: %d, want 7 (brackets and commas inside strings do not count)", n)
	}
}
