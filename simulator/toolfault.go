package simulator

import (
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// Tool-call faults (Options.ToolCallFault, `--tool-call-fault`): a server
// whose tool-call parser does not match the model's output format answers
// tool calls as text, which an agent sees as "the model answers but never
// uses its tools". The doctor's endpoint.tool_calls check is tested
// against these.
const (
	// ToolCallFaultContent answers every tool call as JSON text in
	// content ({"name": …, "arguments": {…}}) with no tool_calls entry.
	ToolCallFaultContent = "content"
	// ToolCallFaultXML answers every tool call as Qwen3-Coder XML text in
	// content (<tool_call><function=…>…), as vLLM does with a parser that
	// does not know the format.
	ToolCallFaultXML = "xml"
	// ToolCallFaultBadArguments keeps the tool_calls entry but its
	// arguments are not valid JSON.
	ToolCallFaultBadArguments = "bad-arguments"
)

func validateToolCallFault(f string) error {
	switch f {
	case "", ToolCallFaultContent, ToolCallFaultXML, ToolCallFaultBadArguments:
		return nil
	}
	return fmt.Errorf("simulator options: tool call fault %q: want %q, %q, %q or none",
		f, ToolCallFaultContent, ToolCallFaultXML, ToolCallFaultBadArguments)
}

// namedToolCall is the reply of the default (unscripted) mode to a user
// turn that names an offered tool: the model calls it, as a real model with
// working tool calling does when asked to. nil when the last message is not
// a user message or names no offered tool.
func namedToolCall(req *oaiChatRequest) *forcedToolCall {
	n := len(req.Messages)
	if n == 0 || req.Messages[n-1].Role != "user" || len(req.Tools) == 0 {
		return nil
	}
	q, err := contentText(req.Messages[n-1].Content)
	if err != nil || q == "" {
		return nil
	}
	for _, t := range req.Tools {
		name := t.Function.Name
		if len(name) < 3 {
			continue
		}
		re, err := regexp.Compile(`(^|[^A-Za-z0-9_])` + regexp.QuoteMeta(name) + `([^A-Za-z0-9_]|$)`)
		if err != nil || !re.MatchString(q) {
			continue
		}
		return &forcedToolCall{Name: name, Arguments: questionArguments(t, q), Finish: "tool_calls"}
	}
	return nil
}

// toolCallFault applies Options.ToolCallFault to planned calls: text, true
// when the calls are to be answered as content instead; otherwise the calls
// to send (arguments broken for bad-arguments).
func (s *server) toolCallFault(calls []forcedToolCall) ([]forcedToolCall, string, bool) {
	switch s.opts.ToolCallFault {
	case ToolCallFaultContent:
		var parts []string
		for _, c := range calls {
			args := json.RawMessage(c.Arguments)
			if !json.Valid(args) {
				args = json.RawMessage("{}")
			}
			b, _ := json.Marshal(struct {
				Name      string          `json:"name"`
				Arguments json.RawMessage `json:"arguments"`
			}{c.Name, args})
			parts = append(parts, string(b))
		}
		return nil, strings.Join(parts, "\n"), true
	case ToolCallFaultXML:
		var b strings.Builder
		for _, c := range calls {
			var args map[string]any
			_ = json.Unmarshal([]byte(c.Arguments), &args)
			keys := make([]string, 0, len(args))
			for k := range args {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			fmt.Fprintf(&b, "<tool_call>\n<function=%s>\n", c.Name)
			for _, k := range keys {
				fmt.Fprintf(&b, "<parameter=%s>\n%v\n</parameter>\n", k, args[k])
			}
			b.WriteString("</function>\n</tool_call>\n")
		}
		return nil, b.String(), true
	case ToolCallFaultBadArguments:
		out := make([]forcedToolCall, len(calls))
		for i, c := range calls {
			c.Arguments = strings.TrimSuffix(c.Arguments, "}") + `, "unterminated`
			out[i] = c
		}
		return out, "", false
	}
	return calls, "", false
}
