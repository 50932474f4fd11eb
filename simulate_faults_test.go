package main

import (
	"strings"
	"testing"
)

func TestSimulateFaultFlags(t *testing.T) {
	tests := []struct {
		flavor, argv    string
		schema, transcr string
		err             string
	}{
		{"vllm", "serve qwen3-coder --schema-fault prose-once --transcription-fault=error --port 8001", "prose-once", "error", ""},
		{"vllm", "--schema-fault invalid serve M", "invalid", "", ""},
		{"ollama", "serve --schema-fault=prose", "prose", "", ""},
		{"vllm", "serve M", "", "", ""},
		{"vllm", "serve M --tool-call-fault content --enable-auto-tool-choice", "", "", ""},
	}
	for _, tt := range tests {
		o, err := simulateOptions(tt.flavor, strings.Fields(tt.argv))
		if err != nil {
			t.Fatalf("%s %s: %v", tt.flavor, tt.argv, err)
		}
		if o.SchemaFault != tt.schema || o.TranscriptionFault != tt.transcr {
			t.Errorf("%s %s: faults %q/%q, want %q/%q", tt.flavor, tt.argv, o.SchemaFault, o.TranscriptionFault, tt.schema, tt.transcr)
		}
		if want := strings.Contains(tt.argv, "--tool-call-fault content"); want != (o.ToolCallFault == "content") || (want && !o.EnableAutoToolChoice) {
			t.Errorf("%s: tool call fault %q, auto tool choice %v", tt.argv, o.ToolCallFault, o.EnableAutoToolChoice)
		}
		if tt.flavor == "vllm" && o.Model != strings.Fields(strings.SplitN(tt.argv, "serve ", 2)[1])[0] {
			t.Errorf("%s: model %q swallowed by a fault flag", tt.argv, o.Model)
		}
	}
}
