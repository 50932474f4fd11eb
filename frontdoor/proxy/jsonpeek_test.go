package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestPeekModel(t *testing.T) {
	tests := []struct {
		name      string
		body      string
		wantFound bool
		wantStr   bool
		wantName  string
		wantValue string // the bytes at Start:End
		wantErr   string // substring; "" = no error
		rewritten string // withModel(body, f, "served") when set
	}{
		{name: "plain", body: `{"model":"qwen3-coder","stream":true}`, wantFound: true, wantStr: true,
			wantName: "qwen3-coder", wantValue: `"qwen3-coder"`, rewritten: `{"model":"served","stream":true}`},
		{name: "white space everywhere", body: " \n{ \"messages\" : [ ] ,\t\"model\" :\r\n \"m\" } \n", wantFound: true, wantStr: true,
			wantName: "m", wantValue: `"m"`, rewritten: " \n{ \"messages\" : [ ] ,\t\"model\" :\r\n \"served\" } \n"},
		{name: "model last after big nested values", body: `{"tools":[{"function":{"parameters":{"$defs":{"a":{"type":"string"}},"prefixItems":[{"$ref":"#/$defs/a"}]}}}],"model":"x"}`,
			wantFound: true, wantStr: true, wantName: "x", wantValue: `"x"`},
		{name: "absent", body: `{"messages":[{"role":"user","content":"hi"}]}`,
			rewritten: `{"model":"served","messages":[{"role":"user","content":"hi"}]}`},
		{name: "empty object", body: ` {} `, rewritten: ` {"model":"served"} `},
		{name: "null", body: `{"model":null,"a":1}`, wantFound: true, wantValue: `null`, rewritten: `{"model":"served","a":1}`},
		{name: "nested model is not the model", body: `{"messages":[{"model":"inner"}],"meta":{"model":"x"}}`},
		{name: "quoted model text inside a string", body: `{"content":"say \"model\":\"evil\"","model":"good"}`,
			wantFound: true, wantStr: true, wantName: "good", wantValue: `"good"`},
		{name: "escaped backslashes before a quote", body: `{"a":"\\\\","model":"m"}`, wantFound: true, wantStr: true,
			wantName: "m", wantValue: `"m"`},
		{name: "duplicate keys: last wins", body: `{"model":"first","model":"second"}`, wantFound: true, wantStr: true,
			wantName: "second", wantValue: `"second"`, rewritten: `{"model":"first","model":"served"}`},
		{name: "escaped key", body: `{"mod\u0065l":"m"}`, wantFound: true, wantStr: true, wantName: "m", wantValue: `"m"`},
		{name: "escaped value", body: `{"model":"a\"b\u00e9"}`, wantFound: true, wantStr: true, wantName: "a\"bé", wantValue: `"a\"b\u00e9"`},
		{name: "unicode value", body: `{"model":"модель"}`, wantFound: true, wantStr: true, wantName: "модель", wantValue: `"модель"`},
		{name: "literals and numbers", body: `{"a":true,"b":false,"c":null,"d":-1.5e+3,"model":"m"}`, wantFound: true, wantStr: true, wantName: "m", wantValue: `"m"`},

		{name: "number model", body: `{"model":5}`, wantErr: `"model" must be a string`},
		{name: "object model", body: `{"model":{"id":"x"}}`, wantErr: `"model" must be a string`},
		{name: "bad model then good model", body: `{"model":5,"model":"m"}`, wantFound: true, wantStr: true, wantName: "m", wantValue: `"m"`},
		{name: "empty", body: ``, wantErr: "empty body"},
		{name: "blank", body: " \n ", wantErr: "empty body"},
		{name: "array", body: `[{"model":"m"}]`, wantErr: "expected a JSON object"},
		{name: "truncated", body: `{"model":"m","messages":[`, wantErr: "unterminated array"},
		{name: "unterminated string", body: `{"model":"m`, wantErr: "unterminated string"},
		{name: "trailing comma", body: `{"a":1,}`, wantErr: "expected a member name"},
		{name: "missing colon", body: `{"a" 1}`, wantErr: "expected ':'"},
		{name: "missing comma", body: `{"a":1 "b":2}`, wantErr: "expected ',' or '}'"},
		{name: "bad literal", body: `{"a":tru}`, wantErr: "invalid literal"},
		{name: "mismatched brackets", body: `{"a":[1}`, wantErr: "mismatched"},
		{name: "trailing data", body: `{"a":1} {"b":2}`, wantErr: "unexpected data after"},
		{name: "unquoted key", body: `{model:"m"}`, wantErr: "expected a member name"},
		{name: "end after colon", body: `{"model":`, wantErr: "expected a value"},
		{name: "too deep", body: `{"a":` + strings.Repeat("[", maxDepth+1) + strings.Repeat("]", maxDepth+1) + `}`, wantErr: "nesting deeper"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, err := peekModel([]byte(tc.body))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("peekModel(%q) error = %v, want one containing %q", tc.body, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("peekModel(%q): %v", tc.body, err)
			}
			if f.KeyFound != tc.wantFound || f.IsString != tc.wantStr || f.Name != tc.wantName {
				t.Fatalf("peekModel(%q) = found %v string %v name %q, want %v %v %q", tc.body, f.KeyFound, f.IsString, f.Name, tc.wantFound, tc.wantStr, tc.wantName)
			}
			if tc.wantFound && tc.body[f.Start:f.End] != tc.wantValue {
				t.Fatalf("value bytes = %q, want %q", tc.body[f.Start:f.End], tc.wantValue)
			}
			if tc.rewritten != "" {
				if got := string(withModel([]byte(tc.body), f, "served")); got != tc.rewritten {
					t.Fatalf("withModel = %q, want %q", got, tc.rewritten)
				}
			}
		})
	}
}

func TestPeekModelErrorsAreSyntaxErrors(t *testing.T) {
	_, err := peekModel([]byte(`{"a":[}`))
	var se *syntaxError
	if !errors.As(err, &se) || se.Offset != 6 {
		t.Fatalf("error = %#v, want a syntaxError at offset 6", err)
	}
}

// FuzzPeekModel checks the scanner against encoding/json on every valid
// object, and that withModel changes "model" and nothing else.
func FuzzPeekModel(f *testing.F) {
	for _, s := range []string{
		`{"model":"qwen3-coder","messages":[{"role":"user","content":"hi"}],"stream":true}`,
		`{"messages":[],"model":null}`, `{}`, `{"model":5}`, `{"mod\u0065l":"x","model":"y"}`,
		`{"a":"\\\"","model":"\"q\""}`, `{"a":[{"b":{"c":[1,2,{"model":"no"}]}}],"model":"yes"}`,
		`[1]`, `{"a":1,}`, `{"model":"m"} x`, `{"a":tru}`, "{\"model\":\"\xff\"}",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		fld, err := peekModel(body)
		var m map[string]json.RawMessage
		if !json.Valid(body) || json.Unmarshal(body, &m) != nil || m == nil {
			return // peekModel may accept or refuse; it must only not panic
		}
		raw, has := m["model"]
		switch {
		case !has:
			if err != nil || fld.KeyFound {
				t.Fatalf("no model in %q but peekModel = %+v, %v", body, fld, err)
			}
		case raw[0] == '"':
			var want string
			_ = json.Unmarshal(raw, &want)
			if err != nil || !fld.IsString {
				t.Fatalf("model %s in %q but peekModel = %+v, %v", raw, body, fld, err)
			}
			if utf8.Valid(raw) && fld.Name != want {
				t.Fatalf("model %q, peekModel says %q", want, fld.Name)
			}
			if !bytes.Equal(bytes.TrimSpace(body[fld.Start:fld.End]), raw) {
				t.Fatalf("value range %q, want %s", body[fld.Start:fld.End], raw)
			}
		case string(raw) == "null":
			if err != nil || !fld.KeyFound || !fld.Null {
				t.Fatalf("null model in %q but peekModel = %+v, %v", body, fld, err)
			}
		default:
			if !errors.Is(err, errModelNotString) {
				t.Fatalf("model %s in %q: error %v, want errModelNotString", raw, body, err)
			}
			return
		}
		out := withModel(body, fld, "served")
		var m2 map[string]json.RawMessage
		if err := json.Unmarshal(out, &m2); err != nil {
			t.Fatalf("withModel made invalid JSON %q from %q: %v", out, body, err)
		}
		if string(m2["model"]) != `"served"` {
			t.Fatalf("withModel: model = %s in %q", m2["model"], out)
		}
		for k, v := range m {
			if k != "model" && !bytes.Equal(m2[k], v) {
				t.Fatalf("withModel changed %q: %s → %s", k, v, m2[k])
			}
		}
		if len(m2) != len(m)+map[bool]int{true: 0, false: 1}[has] {
			t.Fatalf("withModel changed the member count: %d → %d", len(m), len(m2))
		}
	})
}

func BenchmarkPeekModel30KB(b *testing.B) {
	body := opencodeLikeBody(b)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := peekModel(body); err != nil {
			b.Fatal(err)
		}
	}
}

// opencodeLikeBody is a ~30 KB chat request with a tools list, model last.
func opencodeLikeBody(tb testing.TB) []byte {
	tb.Helper()
	var tools []any
	for i := 0; len(tools) < 20; i++ {
		tools = append(tools, map[string]any{"type": "function", "function": map[string]any{
			"name": "tool" + strings.Repeat("x", i), "description": strings.Repeat("Does a thing with \"quotes\" and \\ slashes. ", 30),
			"parameters": map[string]any{"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
				"properties": map[string]any{"path": map[string]any{"type": "string"}, "n": map[string]any{"type": "integer", "minimum": 1}},
				"required":   []string{"path"}, "additionalProperties": false},
		}})
	}
	body, err := json.Marshal(map[string]any{"messages": []any{map[string]any{"role": "user", "content": "hi"}}, "tools": tools,
		"stream": true, "zz_model_last": true})
	if err != nil {
		tb.Fatal(err)
	}
	return append(body[:len(body)-1], `,"model":"qwen3-coder"}`...)
}
