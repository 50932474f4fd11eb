package llm

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// classifySchema is the JSON Schema sent as response_format and checked
// again in code: a server may ignore response_format (or not constrain
// decoding), and a verdict the worker acts on must be well-formed.
//
//go:embed classify.v1.schema.json
var classifySchema []byte

// maxReasoningChars bounds the reasoning kept from a reply; the schema
// does not limit it and a rambling model should not flood a chat post.
const maxReasoningChars = 1000

// compileClassifySchema compiles the embedded schema.
func compileClassifySchema() (*jsonschema.Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(classifySchema))
	if err != nil {
		return nil, fmt.Errorf("read embedded %s.schema.json: %w", PromptVersion, err)
	}
	c := jsonschema.NewCompiler()
	name := PromptVersion + ".schema.json"
	if err := c.AddResource(name, doc); err != nil {
		return nil, fmt.Errorf("load embedded %s: %w", name, err)
	}
	s, err := c.Compile(name)
	if err != nil {
		return nil, fmt.Errorf("compile embedded %s: %w", name, err)
	}
	return s, nil
}

// parseReply checks a model's reply (outside input) against the schema and
// decodes it. The error text says what was wrong, short enough to tell the
// model on a retry and to post as the reason a mail stayed unclassified.
// A reply wrapped in one Markdown code fence is accepted; anything else
// around the object is not.
func parseReply(schema *jsonschema.Schema, raw string) (Classification, error) {
	s := strings.TrimSpace(raw)
	if s == "" {
		return Classification{}, errors.New("the reply was empty")
	}
	s = stripFence(s)
	if !strings.HasPrefix(s, "{") {
		return Classification{}, fmt.Errorf("the reply is not a JSON object (it starts with %q)", clipBytes(s, 40))
	}
	inst, err := jsonschema.UnmarshalJSON(strings.NewReader(s))
	if err != nil {
		return Classification{}, fmt.Errorf("the reply is not valid JSON: %v", err)
	}
	if err := schema.Validate(inst); err != nil {
		return Classification{}, fmt.Errorf("the reply does not match the schema: %s", validationSummary(err))
	}
	obj, _ := inst.(map[string]any)
	var c Classification
	c.IsRealConversation, _ = obj["isRealConversation"].(bool)
	c.ContactType, _ = obj["contactType"].(string)
	n, _ := obj["importance"].(json.Number)
	f, err := n.Float64() // the schema allows 7.0 as an integer
	if err != nil || f != math.Trunc(f) {
		return Classification{}, fmt.Errorf("the reply's importance %q is not a whole number", n)
	}
	c.Importance = int(f)
	reasoning, _ := obj["reasoning"].(string)
	c.Reasoning = strings.TrimSpace(reasoning)
	if clipped, cut := clipRunes(c.Reasoning, maxReasoningChars); cut {
		c.Reasoning = clipped + "…"
	}
	return c, nil
}

// stripFence removes one ```json … ``` fence around s, if that is all
// there is.
func stripFence(s string) string {
	if !strings.HasPrefix(s, "```") || !strings.HasSuffix(s, "```") || len(s) < 6 {
		return s
	}
	inner := s[3 : len(s)-3]
	nl := strings.IndexByte(inner, '\n')
	if nl < 0 {
		return s
	}
	if lang := strings.TrimSpace(inner[:nl]); lang != "" && lang != "json" {
		return s
	}
	return strings.TrimSpace(inner[nl+1:])
}

// validationSummary turns the validator's indented tree into one line,
// e.g. "at '/importance': maximum: got 42, want 10".
func validationSummary(err error) string {
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return err.Error()
	}
	lines := strings.Split(ve.Error(), "\n")
	if len(lines) > 1 {
		lines = lines[1:] // "jsonschema validation failed with '…#'"
	}
	var parts []string
	for _, line := range lines {
		line = strings.TrimPrefix(strings.TrimSpace(line), "- ")
		if line != "" {
			parts = append(parts, line)
		}
	}
	return clipBytes(strings.Join(parts, "; "), 300)
}
