package systemd

import (
	"context"
	"reflect"
	"strings"
	"testing"
)

func TestParseJournalJSON(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []string
		wantErr string
	}{
		{"empty output", "", nil, ""},
		{"strings in order", `{"MESSAGE":"one","_PID":"1"}` + "\n" + `{"MESSAGE":"two"}` + "\n", []string{"one", "two"}, ""},
		{"byte array", `{"MESSAGE":[98,105,110,1,97,114,121]}`, []string{"bin\x01ary"}, ""},
		{"invalid UTF-8 kept as bytes", `{"MESSAGE":[255,254]}`, []string{"\xff\xfe"}, ""},
		{"null (too large) and missing skipped", `{"MESSAGE":null}{"_PID":"3"}{"MESSAGE":"x"}`, []string{"x"}, ""},
		{"repeated field joined", `{"MESSAGE":["a",[98],"c"]}`, []string{"a\nb\nc"}, ""},
		{"empty array", `{"MESSAGE":[]}`, []string{""}, ""},
		{"escapes", `{"MESSAGE":"tab\there \u00e9 \"q\""}`, []string{"tab\there é \"q\""}, ""},
		{"byte out of range", `{"MESSAGE":[256]}`, nil, "out of range"},
		{"negative byte", `{"MESSAGE":[-1]}`, nil, "out of range"},
		{"number instead of string", `{"MESSAGE":12}`, nil, "unexpected"},
		{"truncated", `{"MESSAGE":"one"}{"MESS`, []string{"one"}, "entry 1"},
		{"not JSON", "-- No entries --\n", nil, "entry 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseJournalJSON(strings.NewReader(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want %q", err, tt.wantErr)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestJournalTailRejectsBadInput(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		unit string
		n    int
	}{{"", 10}, {"--rotate", 10}, {"x.service", 0}, {"x.service", -1}, {"x.service", maxJournalLines + 1}} {
		if _, err := JournalTail(ctx, tc.unit, tc.n); err == nil {
			t.Errorf("JournalTail(%q, %d) accepted", tc.unit, tc.n)
		}
	}
}

func FuzzParseJournalJSON(f *testing.F) {
	f.Add([]byte(`{"MESSAGE":"one"}{"MESSAGE":[1,2,3]}`))
	f.Add([]byte(`{"MESSAGE":["a",[98],null]}`))
	f.Add([]byte(`{"MESSAGE":[[[[[1]]]]]}`))
	f.Add([]byte(`[`))
	f.Fuzz(func(t *testing.T, data []byte) {
		msgs, err := parseJournalJSON(strings.NewReader(string(data)))
		if err == nil && len(data) == 0 && len(msgs) != 0 {
			t.Errorf("messages from empty input: %q", msgs)
		}
	})
}
