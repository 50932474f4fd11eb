package simulator

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// triageSchema mirrors triage/llm/classify.v1.schema.json.
const triageSchema = `{"type":"object","properties":{
 "isRealConversation":{"type":"boolean"},
 "contactType":{"type":"string","enum":["customer","prospect","lead","promotional","other"]},
 "importance":{"type":"integer","minimum":1,"maximum":10},
 "reasoning":{"type":"string"}},
 "required":["isRealConversation","contactType","importance","reasoning"],
 "additionalProperties":false}`

// compileSchema compiles a JSON Schema with the validator the triage worker
// uses, so "valid" means the same here and there.
func compileSchema(t testing.TB, schema string) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		t.Fatalf("schema %s: %v", schema, err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("test.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("test.json")
	if err != nil {
		t.Fatalf("compile %s: %v", schema, err)
	}
	return s
}

func validateDoc(t testing.TB, s *jsonschema.Schema, doc string) error {
	t.Helper()
	inst, err := jsonschema.UnmarshalJSON(strings.NewReader(doc))
	if err != nil {
		return err
	}
	return s.Validate(inst)
}

// chatWithFormat is a chat body with one user message and response_format.
func chatWithFormat(user string, rf string) []byte {
	msgs, _ := json.Marshal([]map[string]string{{"role": "system", "content": "Classify. unsubscribe"}, {"role": "user", "content": user}})
	body := `{"model":"m","messages":` + string(msgs)
	if rf != "" {
		body += `,"response_format":` + rf
	}
	return []byte(body + "}")
}

func jsonSchemaFormat(schema string, strict bool) string {
	s := "false"
	if strict {
		s = "true"
	}
	return `{"type":"json_schema","json_schema":{"name":"t","strict":` + s + `,"schema":` + schema + `}}`
}

// replyOf runs prepareChat and returns the planned exact reply.
func replyOf(t *testing.T, s *server, body []byte) string {
	t.Helper()
	j, e := s.prepareChat(body)
	if e != nil {
		t.Fatalf("prepareChat: %v", e)
	}
	if j.textToks == nil {
		t.Fatal("no fixed reply planned")
	}
	return strings.Join(j.textToks, "")
}

func TestStructuredOutputValidAgainstSchema(t *testing.T) {
	schemas := []struct{ name, schema string }{
		{"triage", triageSchema},
		{"nested and arrays", `{"type":"object","properties":{
			"tags":{"type":"array","items":{"type":"string","minLength":3,"maxLength":5},"minItems":2,"maxItems":4},
			"owner":{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer","exclusiveMinimum":17,"maximum":19}},"required":["name","age"],"additionalProperties":false},
			"score":{"type":"number","minimum":0.25,"maximum":0.75,"multipleOf":0.05},
			"ratio":{"type":"number","exclusiveMinimum":0,"exclusiveMaximum":1},
			"count":{"type":"integer","minimum":-7,"maximum":40,"multipleOf":5}},
			"required":["tags","owner","score","ratio","count"],"additionalProperties":false}`},
		{"defs and refs", `{"$defs":{"item":{"type":"object","properties":{"id":{"type":"string","format":"uuid"},"when":{"type":"string","format":"date-time"}},"required":["id","when"]}},
			"type":"object","properties":{"items":{"type":"array","items":{"$ref":"#/$defs/item"},"minItems":3},"first":{"$ref":"#/$defs/item"}},"required":["items","first"]}`},
		{"anyOf oneOf const", `{"type":"object","properties":{
			"a":{"anyOf":[{"type":"string","const":"x"},{"type":"integer"}]},
			"b":{"oneOf":[{"type":"null"},{"type":"string"}]},
			"c":{"const":{"k":[1,2]}},
			"d":{"type":["null","boolean"]}},"required":["a","b","c","d"]}`},
		{"allOf", `{"allOf":[{"type":"object","properties":{"x":{"type":"integer","minimum":5,"maximum":5}},"required":["x"]},
			{"properties":{"y":{"enum":["p","q"]}},"required":["y"]}]}`},
		{"tuple", `{"type":"array","prefixItems":[{"type":"integer"},{"type":"string","minLength":40}],"items":false,"minItems":2}`},
		{"minProperties", `{"type":"object","properties":{"a":{"type":"integer"}},"minProperties":3}`},
		{"draft-7 definitions", `{"definitions":{"n":{"type":"integer","minimum":100}},"type":"object","properties":{"n":{"$ref":"#/definitions/n"}},"required":["n"]}`},
		{"top-level string", `{"type":"string","maxLength":4}`},
		{"empty object schema", `{}`},
	}
	s := fuzzServer(t, FlavorVLLM)
	mails := []string{"Hello, please unsubscribe me from the newsletter", "Invoice 4711 attached, urgent", "Lunch on Friday?", "Angebot für die neue Maschine"}
	for _, sc := range schemas {
		compiled := compileSchema(t, sc.schema)
		for _, strict := range []bool{true, false} {
			for _, mail := range mails {
				reply := replyOf(t, s, chatWithFormat(mail, jsonSchemaFormat(sc.schema, strict)))
				if err := validateDoc(t, compiled, reply); err != nil {
					t.Errorf("%s (strict %v, mail %q): reply %s is invalid: %v", sc.name, strict, mail, reply, err)
				}
			}
		}
	}
}

func TestStructuredOutputTriageVerdicts(t *testing.T) {
	s := fuzzServer(t, FlavorVLLM)
	type verdictDoc struct {
		IsRealConversation bool   `json:"isRealConversation"`
		ContactType        string `json:"contactType"`
		Importance         int    `json:"importance"`
		Reasoning          string `json:"reasoning"`
	}
	tests := []struct {
		mail     string
		contact  string
		real     *bool
		min, max int
		keyword  string
	}{
		{"Our spring newsletter! Click here to unsubscribe.", "promotional", ptr(false), 1, 2, "unsubscribe"},
		{"Hier können Sie sich abmelden.", "promotional", ptr(false), 1, 2, "abmelden"},
		{"Please find the invoice for March attached.", "customer", ptr(true), 7, 9, "invoice"},
		{"Could you send us a quote for 40 units?", "lead", ptr(true), 6, 8, "quote"},
		{"Wir bitten um ein Angebot.", "lead", ptr(true), 6, 8, "angebot"},
		{"URGENT: the machine stopped", "customer", ptr(true), 7, 9, "urgent"},
		{"See you at the barbecue on Saturday", "", nil, 3, 6, ""},
	}
	for _, tt := range tests {
		reply := replyOf(t, s, chatWithFormat(tt.mail, jsonSchemaFormat(triageSchema, true)))
		var v verdictDoc
		if err := json.Unmarshal([]byte(reply), &v); err != nil {
			t.Fatalf("%q: reply %s: %v", tt.mail, reply, err)
		}
		if tt.contact != "" && v.ContactType != tt.contact {
			t.Errorf("%q: contactType %q, want %q", tt.mail, v.ContactType, tt.contact)
		}
		if tt.real != nil && v.IsRealConversation != *tt.real {
			t.Errorf("%q: isRealConversation %v, want %v", tt.mail, v.IsRealConversation, *tt.real)
		}
		if v.Importance < tt.min || v.Importance > tt.max {
			t.Errorf("%q: importance %d, want %d..%d", tt.mail, v.Importance, tt.min, tt.max)
		}
		if !strings.Contains(v.Reasoning, "Simulator verdict") || (tt.keyword != "" && !strings.Contains(v.Reasoning, `"`+tt.keyword+`"`)) {
			t.Errorf("%q: reasoning %q does not name the simulator and keyword %q", tt.mail, v.Reasoning, tt.keyword)
		}
		// Deterministic: the same mail gets the same reply.
		if again := replyOf(t, s, chatWithFormat(tt.mail, jsonSchemaFormat(triageSchema, true))); again != reply {
			t.Errorf("%q: replies differ: %s vs %s", tt.mail, reply, again)
		}
		if !strings.HasPrefix(reply, `{"isRealConversation":`) {
			t.Errorf("reply %s does not follow the schema's property order", reply)
		}
	}
	// Different neutral mails get different verdicts somewhere.
	seen := map[string]bool{}
	for _, m := range []string{"a", "b", "c", "d", "e", "f", "g", "h"} {
		seen[replyOf(t, s, chatWithFormat("note "+m, jsonSchemaFormat(triageSchema, true)))] = true
	}
	if len(seen) < 2 {
		t.Errorf("eight different mails all got the same verdict")
	}
}

func ptr[T any](v T) *T { return &v }

func TestResponseFormatKinds(t *testing.T) {
	vllm, ollama := fuzzServer(t, FlavorVLLM), fuzzServer(t, FlavorOllama)
	tests := []struct {
		name     string
		s        *server
		rf       string
		fixed    string // "" = no fixed reply
		errPart  string
		anyFixed bool
	}{
		{"absent", vllm, "", "", "", false},
		{"null", vllm, "null", "", "", false},
		{"text", vllm, `{"type":"text"}`, "", "", false},
		{"structural_tag", vllm, `{"type":"structural_tag","structures":[]}`, "", "", false},
		{"json_object", vllm, `{"type":"json_object"}`, "{}", "", false},
		{"json_object ollama", ollama, `{"type":"json_object"}`, "{}", "", false},
		{"json_schema", vllm, jsonSchemaFormat(triageSchema, true), "", "", true},
		{"vllm unknown type", vllm, `{"type":"xml"}`, "", "response_format.type", false},
		{"vllm no json_schema", vllm, `{"type":"json_schema"}`, "response_format.json_schema", "response_format.json_schema", false},
		{"vllm no schema", vllm, `{"type":"json_schema","json_schema":{"name":"x"}}`, "", "json_schema.schema: Field required", false},
		{"vllm schema not object", vllm, `{"type":"json_schema","json_schema":{"name":"x","schema":[1]}}`, "", "valid dictionary", false},
		{"vllm response_format not object", vllm, `"json"`, "", "response_format", false},
		{"ollama unknown type ignored", ollama, `{"type":"xml"}`, "", "", false},
		{"ollama no schema ignored", ollama, `{"type":"json_schema","json_schema":{"name":"x"}}`, "", "", false},
		{"ollama schema not object", ollama, `{"type":"json_schema","json_schema":{"schema":5}}`, "", "invalid format", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j, e := tt.s.prepareChat(chatWithFormat("hello", tt.rf))
			if tt.errPart != "" {
				if e == nil || e.status != http.StatusBadRequest || !strings.Contains(e.message, tt.errPart) {
					t.Fatalf("error %+v, want 400 naming %q", e, tt.errPart)
				}
				return
			}
			if e != nil {
				t.Fatalf("unexpected error %v", e)
			}
			got := strings.Join(j.textToks, "")
			switch {
			case tt.anyFixed && (j.textToks == nil || !json.Valid([]byte(got))):
				t.Errorf("want a JSON reply, got %q", got)
			case !tt.anyFixed && tt.fixed == "" && j.textToks != nil:
				t.Errorf("want no fixed reply, got %q", got)
			case tt.fixed != "" && got != tt.fixed:
				t.Errorf("reply %q, want %q", got, tt.fixed)
			}
		})
	}
}

func TestSchemaFaults(t *testing.T) {
	compiled := compileSchema(t, triageSchema)
	body := chatWithFormat("Please send the invoice", jsonSchemaFormat(triageSchema, true))
	newSrv := func(fault string) *server {
		o, err := Options{Flavor: FlavorVLLM, Model: "m", SchemaFault: fault, Logger: discard()}.withDefaults()
		if err != nil {
			t.Fatal(err)
		}
		return newServer(o)
	}
	t.Run("prose", func(t *testing.T) {
		s := newSrv(SchemaFaultProse)
		for range 2 {
			if r := replyOf(t, s, body); json.Valid([]byte(r)) || !strings.Contains(r, "--schema-fault") {
				t.Errorf("reply %q, want labelled prose", r)
			}
		}
	})
	t.Run("invalid", func(t *testing.T) {
		r := replyOf(t, newSrv(SchemaFaultInvalid), body)
		if !strings.Contains(r, `"importance":42`) {
			t.Errorf("reply %s, want importance 42", r)
		}
		if err := validateDoc(t, compiled, r); err == nil {
			t.Errorf("reply %s validates, want a schema violation", r)
		}
	})
	t.Run("invalid without bounds", func(t *testing.T) {
		for _, sc := range []string{
			`{"type":"object","properties":{"k":{"enum":["a"]}},"required":["k"]}`,
			`{"type":"object","properties":{"k":{"type":"string"}},"required":["k"]}`,
			`{"type":"string"}`,
			`{"type":"array"}`,
		} {
			r := replyOf(t, newSrv(SchemaFaultInvalid), chatWithFormat("x", jsonSchemaFormat(sc, true)))
			if err := validateDoc(t, compileSchema(t, sc), r); err == nil {
				t.Errorf("schema %s: reply %s validates, want a violation", sc, r)
			}
		}
	})
	t.Run("prose-once", func(t *testing.T) {
		s := newSrv(SchemaFaultProseOnce)
		// A request without response_format does not use up the prose.
		if _, e := s.prepareChat(chatWithFormat("hi", "")); e != nil {
			t.Fatal(e)
		}
		if r := replyOf(t, s, body); json.Valid([]byte(r)) {
			t.Errorf("first reply %q, want prose", r)
		}
		for range 3 {
			if r := replyOf(t, s, body); validateDoc(t, compiled, r) != nil {
				t.Errorf("later reply %q, want valid JSON", r)
			}
		}
		// Another server (another run) gets its own first prose answer.
		if r := replyOf(t, newSrv(SchemaFaultProseOnce), body); json.Valid([]byte(r)) {
			t.Errorf("new server's first reply %q, want prose", r)
		}
	})
	t.Run("bad value", func(t *testing.T) {
		for _, o := range []Options{
			{Flavor: FlavorVLLM, Model: "m", SchemaFault: "chaos"},
			{Flavor: FlavorVLLM, Model: "m", TranscriptionFault: "slow"},
		} {
			if _, err := o.withDefaults(); err == nil || !strings.Contains(err.Error(), "fault") {
				t.Errorf("%+v: err %v, want a fault error", o, err)
			}
		}
	})
}

// TestStructuredOutputOverHTTP checks the reply a real client sees, whole
// and streamed, on both flavours.
func TestStructuredOutputOverHTTP(t *testing.T) {
	compiled := compileSchema(t, triageSchema)
	for _, f := range []Flavor{FlavorVLLM, FlavorOllama} {
		t.Run(string(f), func(t *testing.T) {
			sim := startSim(t, Options{Flavor: f, Model: "m", DecodeTPS: 100000, PrefillTPS: 1e7})
			body := chatWithFormat("Newsletter: unsubscribe here", jsonSchemaFormat(triageSchema, true))
			code, data, _ := sim.do(t, http.MethodPost, "/v1/chat/completions", body)
			if code != http.StatusOK {
				t.Fatalf("status %d: %s", code, truncate(data))
			}
			resp := decode[struct {
				Choices []struct {
					Message      struct{ Content string }
					FinishReason string `json:"finish_reason"`
				}
				Usage oaiUsage
			}](t, data)
			whole := resp.Choices[0].Message.Content
			if err := validateDoc(t, compiled, whole); err != nil || resp.Choices[0].FinishReason != "stop" {
				t.Fatalf("reply %s (finish %s): %v", whole, resp.Choices[0].FinishReason, err)
			}
			if resp.Usage.CompletionTokens != len(tokenize(whole)) {
				t.Errorf("completion tokens %d, reply has %d", resp.Usage.CompletionTokens, len(tokenize(whole)))
			}
			streamBody := bytes.Replace(body, []byte(`"model":"m"`), []byte(`"model":"m","stream":true`), 1)
			code, data, _ = sim.do(t, http.MethodPost, "/v1/chat/completions", streamBody)
			if code != http.StatusOK {
				t.Fatalf("stream status %d", code)
			}
			var streamed strings.Builder
			for _, ev := range parseSSE(t, data).events {
				c := decode[chunk](t, ev)
				for _, ch := range c.Choices {
					if ch.Delta.Content != nil {
						streamed.WriteString(*ch.Delta.Content)
					}
				}
			}
			if streamed.String() != whole {
				t.Errorf("streamed %q, whole %q", streamed.String(), whole)
			}
			code, data, _ = sim.do(t, http.MethodPost, "/v1/chat/completions", chatWithFormat("x", `{"type":"json_schema","json_schema":{"schema":"no"}}`))
			if f == FlavorVLLM && code != http.StatusBadRequest {
				t.Errorf("bad schema: status %d, want 400: %s", code, truncate(data))
			}
		})
	}
}

// FuzzStructuredReply feeds arbitrary response_format bodies: no panic, an
// error is a 400, and a reply is JSON unless the fault asks for prose.
func FuzzStructuredReply(f *testing.F) {
	for _, seed := range []string{
		jsonSchemaFormat(triageSchema, true),
		`{"type":"json_object"}`,
		`{"type":"json_schema","json_schema":{"schema":{"$ref":"#"}}}`,
		`{"type":"json_schema","json_schema":{"schema":{"$defs":{"a":{"$ref":"#/$defs/a"}},"allOf":[{"$ref":"#/$defs/a"}]}}}`,
		`{"type":"json_schema","json_schema":{"schema":{"type":"array","minItems":1000000000,"items":{"type":"string","minLength":100000000}}}}`,
		`{"type":"json_schema","json_schema":{"schema":{"type":"integer","minimum":1e300,"multipleOf":1e-300}}}`,
		`{"type":"json_schema","json_schema":{"schema":{"type":"number","exclusiveMinimum":true,"minimum":3,"maximum":3}}}`,
		`{"type":"json_schema","json_schema":{"schema":{"anyOf":[{"oneOf":[{"allOf":[{"type":"object","minProperties":9}]}]}]}}}`,
		`{"type":"json_schema","json_schema":{"schema":{"properties":{"importance":{"type":"integer","minimum":-9223372036854775808,"maximum":9223372036854775807}},"required":["importance"]}}}`,
		`{"type":"nope"}`, `[]`, `7`,
	} {
		f.Add([]byte(seed), "Invoice please")
	}
	servers := []*server{fuzzServer(f, FlavorVLLM), fuzzServer(f, FlavorOllama)}
	inv := fuzzServer(f, FlavorVLLM)
	inv.opts.SchemaFault = SchemaFaultInvalid
	servers = append(servers, inv)
	f.Fuzz(func(t *testing.T, rf []byte, user string) {
		msgs := []chatMessage{{Role: "user", Content: user}}
		for _, s := range servers {
			text, ok, e := s.fixedReply(&oaiChatRequest{ResponseFormat: rf}, msgs)
			if e != nil {
				if e.status != http.StatusBadRequest || e.message == "" {
					t.Fatalf("bad error %+v", e)
				}
				continue
			}
			if ok && !json.Valid([]byte(text)) {
				t.Fatalf("reply %q is not JSON", text)
			}
		}
	})
}
