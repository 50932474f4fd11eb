package jsonlimit

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	big := "[" + strings.Repeat("{},", 999) + "{}]"
	tests := []struct {
		name     string
		doc      string
		lim      Limits
		want     Counts // Bytes filled in
		wantKind string // "" for no error
	}{
		{"scalar", `42`, Limits{}, Counts{Values: 1}, ""},
		{"object", `{"a":1,"b":[true,null,"x"]}`, Limits{}, Counts{Depth: 2, Values: 8, Strings: 3}, ""},
		{"escaped quote stays inside the string", `["a\"]{[","b"]`, Limits{}, Counts{Depth: 1, Values: 3, Strings: 2}, ""},
		{"escaped backslash ends before the quote", `["a\\","b"]`, Limits{}, Counts{Depth: 1, Values: 3, Strings: 2}, ""},
		{"depth at the limit", `[[[]]]`, Limits{MaxDepth: 3}, Counts{Depth: 3, Values: 3}, ""},
		{"depth over the limit", `[[[[]]]]`, Limits{MaxDepth: 3}, Counts{}, "depth"},
		{"values at the limit", big, Limits{MaxValues: 1001}, Counts{Depth: 2, Values: 1001}, ""},
		{"values over the limit", big, Limits{MaxValues: 1000}, Counts{}, "values"},
		{"keys count as strings", `{"a":1,"b":2}`, Limits{MaxStrings: 1}, Counts{}, "strings"},
		{"unbalanced close", `[]]`, Limits{}, Counts{}, "syntax"},
		{"unclosed", `{"a":[`, Limits{}, Counts{}, "syntax"},
		{"an HTML page", `<html>error page, error page</html>`, Limits{MaxValues: 2}, Counts{}, "syntax"},
		{"empty", ``, Limits{}, Counts{}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Check([]byte(tc.doc), tc.lim)
			if tc.wantKind != "" {
				var le *Error
				if !errors.As(err, &le) || le.Kind != tc.wantKind {
					t.Fatalf("err %v, want a %s error", err, tc.wantKind)
				}
				return
			}
			if err != nil {
				t.Fatalf("err %v", err)
			}
			tc.want.Bytes = len(tc.doc)
			if got != tc.want {
				t.Errorf("counts %+v, want %+v", got, tc.want)
			}
		})
	}
}

// Check stops at the limit: a document of a million values over a limit
// of a thousand is refused within the first few kilobytes.
func TestCheckStopsEarly(t *testing.T) {
	doc := []byte("[" + strings.Repeat(`"x",`, 1_000_000) + `"x"]`)
	_, err := Check(doc, Limits{MaxValues: 1000})
	var le *Error
	if !errors.As(err, &le) || le.Offset > 5000 {
		t.Fatalf("err %v, want a values error within 5000 bytes", err)
	}
}

// FuzzCheck: on every valid document Check's counts match what a decoder
// sees (values and strings counted by encoding/json's tokenizer), and
// Check never panics on anything.
func FuzzCheck(f *testing.F) {
	for _, s := range []string{`{"a":[1,2,{"b":"c\"d"}]}`, `[]`, `"\\"`, `[1e5,-2,true,false,null]`, `{"":{}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		got, err := Check(doc, Limits{})
		if !json.Valid(doc) {
			return
		}
		if err != nil {
			t.Fatalf("valid %q refused: %v", doc, err)
		}
		want := Counts{Bytes: len(doc)}
		dec := json.NewDecoder(bytes.NewReader(doc))
		dec.UseNumber()
		depth := 0
		for {
			tok, terr := dec.Token()
			if terr != nil {
				break
			}
			switch v := tok.(type) {
			case json.Delim:
				if v == '{' || v == '[' {
					depth++
					want.Values++
					want.Depth = max(want.Depth, depth)
				} else {
					depth--
				}
			case string:
				want.Values++
				want.Strings++
			default:
				want.Values++
			}
		}
		if got != want {
			t.Fatalf("%q: counts %+v, want %+v", doc, got, want)
		}
	})
}

func BenchmarkCheck(b *testing.B) {
	doc := []byte("[" + strings.Repeat(`{"k":"v","n":12.5},`, 50_000) + "{}]")
	b.SetBytes(int64(len(doc)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Check(doc, Limits{}); err != nil {
			b.Fatal(err)
		}
	}
}
