package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestMDTable(t *testing.T) {
	tests := []struct {
		name string
		t    mdTable
		want string
	}{
		{"pads to the widest cell, right-aligns numbers",
			mdTable{head: []string{"model", "pp512"}, right: []bool{false, true}, rows: [][]string{{"m", "2481 ± 7.52"}}},
			"| model |       pp512 |\n| ----- | ----------: |\n| m     | 2481 ± 7.52 |\n"},
		{"short headers get three dashes",
			mdTable{head: []string{"a", "b"}, right: []bool{false, true}, rows: [][]string{{"x", "1"}}},
			"| a   |   b |\n| --- | --: |\n| x   |   1 |\n"},
		{"widths count runes, not bytes",
			mdTable{head: []string{"tg128†"}, right: []bool{true}, rows: [][]string{{"1 ± 2"}}},
			"| tg128† |\n| -----: |\n|  1 ± 2 |\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			tt.t.write(&b)
			if b.String() != tt.want {
				t.Errorf("got\n%s\nwant\n%s", b.String(), tt.want)
			}
		})
	}
}

func TestSummaryTable(t *testing.T) {
	st := func(xs ...float64) Stat { return NewStat(xs) }
	tests := []struct {
		name          string
		r             Result
		want, wantNot []string
	}{
		{"one column per length, pp before tg",
			Result{Fingerprint: Fingerprint{Model: "llama3.1:8b", Backend: "ollama", BackendVersion: "0.12.3", Driver: "610.43.02"},
				Config:  RunConfig{Repeats: 3},
				Prefill: []Prefill{{TargetTokens: 512, TokS: st(100, 110, 120)}, {TargetTokens: 2048, TokS: st(90, 91, 92)}},
				Decode:  []Decode{{Tokens: 128, TokS: st(50, 51, 52)}}},
			[]string{"| llama3.1:8b | ollama 0.12.3 | -   | 610.43.02 |", "pp512", "pp2048", "tg128 |", "110.0 ± 10.00", "over 3 repeats"}, []string{"†"}},
		{"capped decode is marked, missing fields are dashes",
			Result{Config: RunConfig{Repeats: 1}, Decode: []Decode{{Tokens: 64, Length: LengthCapped, TokS: st(40)}}},
			[]string{"tg64†", "| -     | -       | -   | -      |", "only capped", "over 1 repeat)"}, []string{"| pp"}},
		{"nothing measured: no table", Result{}, nil, []string{"summary"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			writeSummary(&b, &tt.r)
			for _, w := range tt.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("lacks %q:\n%s", w, b.String())
				}
			}
			for _, w := range tt.wantNot {
				if strings.Contains(b.String(), w) {
					t.Errorf("has %q:\n%s", w, b.String())
				}
			}
		})
	}
}

func TestServingTable(t *testing.T) {
	dist := func(mean, p50, p99 float64) DistStat {
		return DistStat{Mean: NewStat([]float64{mean}), P50: NewStat([]float64{p50}), P99: NewStat([]float64{p99})}
	}
	level := Serving{Concurrency: 4, InputTokens: 512, OutputTokens: 32, ReqPerS: NewStat([]float64{9, 10}),
		OutputTPS: NewStat([]float64{300, 310}), TTFT: dist(210, 209, 250), TPOT: dist(6.5, 6.4, 7.1), Completed: 8}
	withITL := level
	withITL.ITL = dist(6.6, 6.3, 9.9)
	tests := []struct {
		name          string
		levels        []Serving
		want, wantNot []string
	}{
		{"with ITL", []Serving{withITL}, []string{"| concurrency |", "TTFT mean | TTFT p50 | TTFT p99", "ITL p99 |",
			"|           4 | 9.50 ± 0.707 |", "210.0 |    209.0 |    250.0 |", "9.90 |"}, []string{"not recorded"}},
		{"without ITL the header says so", []Serving{level}, []string{"ITL not recorded by this run", "TPOT p99 |\n"}, []string{"ITL mean"}},
		{"open loop level", []Serving{func() Serving { s := withITL; s.Concurrency, s.RequestRate = 0, 2.5; return s }()},
			[]string{"rate 2.5/s"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			writeServing(&b, &Result{Serving: tt.levels})
			for _, w := range tt.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("lacks %q:\n%s", w, b.String())
				}
			}
			for _, w := range tt.wantNot {
				if strings.Contains(b.String(), w) {
					t.Errorf("has %q:\n%s", w, b.String())
				}
			}
		})
	}
}

func TestTextHelpers(t *testing.T) {
	tests := []struct{ got, want string }{
		{joinNonEmpty(" ", "openai", ""), "openai"},
		{joinNonEmpty(", ", "backend openai", "model m", ""), "backend openai, model m"},
		{joinNonEmpty(" ", " ", ""), ""},
		{plural(1, "repeat", "repeats"), "1 repeat"},
		{plural(0, "repeat", "repeats"), "0 repeats"},
		{plural(3, "repeat", "repeats"), "3 repeats"},
		{truncate("Qwen/Qwen3-Coder-30B-A3B-Instruct", 12), "Qwen/Qwen3-…"},
		{truncate("short", 12), "short"},
		{truncate("exactly-ten", 11), "exactly-ten"},
		{truncate("↔↔↔↔↔", 3), "↔↔…"},
		{prefixed("driver ", ""), ""},
		{prefixed("driver ", "610"), "driver 610"},
	}
	for i, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%d: got %q, want %q", i, tt.got, tt.want)
		}
	}
}

// TestRunHeaderEmptyFields: a --url run against an unknown server (no
// version, no GPU facts, no gpuhost version) prints no stray spaces,
// commas or "driver -".
func TestRunHeaderEmptyFields(t *testing.T) {
	var b bytes.Buffer
	start := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	writeRunHeader(&b, &Result{ID: "x", Status: StatusOK, StartedAt: start, FinishedAt: start.Add(time.Second),
		Config: RunConfig{Repeats: 1}, Fingerprint: Fingerprint{Backend: "openai", Model: "m", URL: "http://h/v1"}})
	out := b.String()
	for _, bad := range []string{"openai ,", " ,", "  \n", "driver", "gpuhost -", "1 repeats"} {
		if strings.Contains(out, bad) {
			t.Errorf("header has %q:\n%s", bad, out)
		}
	}
	if !strings.Contains(out, "  backend openai, model m, http://h/v1\n") || !strings.Contains(out, "  1 repeat\n") {
		t.Errorf("header:\n%s", out)
	}
}

// TestListTruncatesLongValues: a long model name is cut with "…" so the
// figures stay in their columns; the ID (what show takes) is never cut.
func TestListTruncatesLongValues(t *testing.T) {
	long := "hf.co/unsloth/Qwen3-Coder-30B-A3B-Instruct-GGUF:UD-Q4_K_XL"
	id := "20261201T100000Z-a-very-long-profile-name-that-someone-chose-for-their-experiment"
	var b bytes.Buffer
	if err := WriteList(&b, []Summary{{ID: id, Status: "ok", Backend: "ollama", BackendVersion: "0.12.3", Model: long,
		PrefillTokS: map[int]float64{512: 2400}, DecodeTokS: map[int]float64{128: 150}},
		{ID: "20261201T100001Z-b", Status: "ok", Backend: "vllm", Model: "m", PrefillTokS: map[int]float64{}, DecodeTokS: map[int]float64{}}}); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if strings.Contains(out, long) || !strings.Contains(out, truncate(long, listModelWidth)) || !strings.Contains(out, id) {
		t.Errorf("list:\n%s", out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	runeIdx := func(s, sub string) int {
		i := strings.Index(s, sub)
		if i < 0 {
			return -1
		}
		return utf8.RuneCountInString(s[:i])
	}
	if col := runeIdx(lines[0], "PREFILL"); col < 0 || runeIdx(lines[1], "512:2400") != col {
		t.Errorf("prefill column not aligned:\n%s", out)
	}
}
