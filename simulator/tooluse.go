package simulator

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Scripted tool use (Options.ScriptedTools, `--scripted-tools`): the
// simulated model plays an agent's side of a tool-calling conversation
// deterministically, so the demo and the agent loop's tests show the whole
// loop (call, error, retry, answer) without a GPU. The rules are meant to be
// read and predicted, not to look clever:
//
//   - tools offered, tool_choice auto (or absent), last message the user's:
//     call the tool the question names (name parts and description words
//     that occur in it, scored); a question that names none, or a shell
//     tool when the question holds no quoted command or arithmetic to run,
//     gets a prose answer saying so, never a guessed call. When the question joins two different tools' names
//     with "and", call both in one reply (indices 0 and 1, as vLLM streams
//     parallel calls). Arguments come from the schema: required properties,
//     an enum's first value (or the one the question mentions), strings from
//     the question (a quoted part, an arithmetic expression, a proper noun).
//   - last messages are tool results: a result that reads as an error, from a
//     tool not yet retried in this conversation, gets the same tool called
//     again with arguments corrected from the error text (a value it lists,
//     else the enum's first value); otherwise the reply is prose that quotes
//     the results, prefixed "[simulated model]" so nobody mistakes it for a
//     real model's answer.

// scriptedPrefix labels every prose reply of the scripted mode.
const scriptedPrefix = "[simulated model] "

// maxScriptedCalls bounds the calls of one scripted reply.
const maxScriptedCalls = 4

// quoteRunes is how much of each tool result a scripted answer quotes.
const quoteRunes = 300

// scriptedReply is the scripted mode's turn: tool calls, or prose.
type scriptedReply struct {
	calls []forcedToolCall
	text  string
	// results names the tools whose results (the trailing tool messages)
	// the reply retries or answers from; empty for a user's question.
	results []string
}

// logScripted logs the scripted turn, so the unit's log shows the tool
// loop: the calls a question got, and the tool results a request carried.
func (s *server) logScripted(r scriptedReply) {
	calls := make([]string, len(r.calls))
	for i, c := range r.calls {
		calls[i] = c.Name
	}
	if len(r.results) == 0 && len(r.calls) == 0 {
		s.log.Info("scripted prose answer: the question names no tool it can call")
		return
	}
	if len(r.results) == 0 {
		s.log.Info("scripted tool calls", "calls", strings.Join(calls, ","))
		return
	}
	s.log.Info("scripted turn on tool results", "tool_results", len(r.results), "tools", strings.Join(r.results, ","),
		"retry_calls", strings.Join(calls, ","), "answered", len(r.calls) == 0)
}

// histCall is one tool call found in an assistant message of the history.
type histCall struct {
	ID        string
	Name      string
	Arguments string
}

// scriptedTurn plans the reply of the scripted mode; ok false means the
// request is not a tool-use turn (no tools and no tool results) and gets the
// ordinary reply.
func scriptedTurn(req *oaiChatRequest, offer bool) (scriptedReply, bool) {
	n := len(req.Messages)
	if n == 0 {
		return scriptedReply{}, false
	}
	switch req.Messages[n-1].Role {
	case "user":
		if !offer || len(req.Tools) == 0 {
			return scriptedReply{}, false
		}
		q, _ := contentText(req.Messages[n-1].Content)
		q = unquoteWhole(q)
		if calls := chooseCalls(q, req.Tools); len(calls) > 0 {
			return scriptedReply{calls: calls}, true
		}
		return scriptedReply{text: noToolAnswer(q, req.Tools)}, true
	case "tool":
		return afterToolResults(req, offer), true
	}
	return scriptedReply{}, false
}

// toolResult is one trailing tool message, matched to its call.
type toolResult struct {
	call    histCall
	content string
	isError bool
}

// afterToolResults retries a failed tool once, or answers in prose.
func afterToolResults(req *oaiChatRequest, offer bool) scriptedReply {
	msgs := req.Messages
	first := len(msgs)
	for first > 0 && msgs[first-1].Role == "tool" {
		first--
	}
	var calls []histCall
	if first > 0 && msgs[first-1].Role == "assistant" {
		calls = parseHistCalls(msgs[first-1].ToolCalls)
	}
	byID := make(map[string]histCall, len(calls))
	for _, c := range calls {
		if c.ID != "" {
			byID[c.ID] = c
		}
	}
	seen := map[string]int{} // calls per tool name over the whole conversation
	for _, m := range msgs {
		if m.Role == "assistant" {
			for _, c := range parseHistCalls(m.ToolCalls) {
				seen[c.Name]++
			}
		}
	}
	var results []toolResult
	for i, m := range msgs[first:] {
		c, ok := byID[m.ToolCallID]
		if !ok && i < len(calls) && m.ToolCallID == "" {
			c = calls[i] // positional, for clients that send no ids
		}
		if c.Name == "" {
			c.Name = m.Name
		}
		if c.Name == "" {
			c.Name = "the tool"
		}
		text, _ := contentText(m.Content)
		results = append(results, toolResult{call: c, content: text, isError: looksLikeError(text)})
	}
	names := make([]string, len(results))
	for i, r := range results {
		names[i] = r.call.Name
	}
	if offer {
		var retry []forcedToolCall
		retried := map[string]bool{}
		for _, r := range results {
			if !r.isError || seen[r.call.Name] >= 2 || retried[r.call.Name] {
				continue
			}
			t := findTool(req.Tools, r.call.Name)
			if t == nil {
				continue
			}
			retried[r.call.Name] = true
			retry = append(retry, forcedToolCall{Name: t.Function.Name,
				Arguments: correctedArguments(t.Function.Parameters, r.call.Arguments, r.content), Finish: "tool_calls"})
			if len(retry) == maxScriptedCalls {
				break
			}
		}
		if len(retry) > 0 {
			return scriptedReply{calls: retry, results: names}
		}
	}
	return scriptedReply{text: proseAnswer(results), results: names}
}

// proseAnswer quotes the results, errors named as such.
func proseAnswer(results []toolResult) string {
	var ok, failed []string
	for _, r := range results {
		q := quote(r.content)
		if r.isError {
			failed = append(failed, r.call.Name+" failed: "+q)
		} else {
			ok = append(ok, r.call.Name+": "+q)
		}
	}
	var b strings.Builder
	b.WriteString(scriptedPrefix)
	if len(ok) > 0 {
		b.WriteString("Based on ")
		b.WriteString(strings.Join(ok, "; "))
	}
	if len(failed) > 0 {
		if len(ok) > 0 {
			b.WriteString(". Also, ")
		}
		b.WriteString(strings.Join(failed, "; "))
		if len(ok) == 0 {
			b.WriteString(". I could not get the answer from the tools")
		}
	}
	if len(results) == 0 {
		b.WriteString("There are no tool results to answer from")
	}
	b.WriteString(".")
	return b.String()
}

// quote flattens whitespace (indented JSON reads as one line) and clips.
func quote(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) <= quoteRunes {
		return s
	}
	r := []rune(s)
	return string(r[:quoteRunes]) + "…"
}

// errorMarkers are what a tool result that failed starts with or says early
// on. Chat tool messages carry no isError flag, so this reads the text, as a
// model would; clients (gpuhost's agent loop) mark errors in words.
var errorMarkers = []string{"error", "invalid", "unknown tool", "not valid json", "failed", "timed out", "not found", "no such", "refused", "cannot"}

func looksLikeError(text string) bool {
	head := strings.ToLower(text)
	if len(head) > 200 {
		head = head[:200]
	}
	for _, m := range errorMarkers {
		if strings.Contains(head, m) {
			return true
		}
	}
	return false
}

// parseHistCalls reads an assistant message's tool_calls; arguments may be a
// JSON string (OpenAI) or an object (Ollama's native shape).
func parseHistCalls(raw json.RawMessage) []histCall {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var calls []struct {
		ID       string `json:"id"`
		Function struct {
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
		} `json:"function"`
	}
	if json.Unmarshal(raw, &calls) != nil {
		return nil
	}
	out := make([]histCall, 0, len(calls))
	for _, c := range calls {
		args := string(c.Function.Arguments)
		var s string
		if json.Unmarshal(c.Function.Arguments, &s) == nil {
			args = s
		}
		out = append(out, histCall{ID: c.ID, Name: c.Function.Name, Arguments: args})
	}
	return out
}

func findTool(tools []oaiTool, name string) *oaiTool {
	for i := range tools {
		if tools[i].Function.Name == name {
			return &tools[i]
		}
	}
	return nil
}

// stopwords never count as a match between a question and a tool.
var stopwords = func() map[string]bool {
	m := map[string]bool{}
	for _, w := range strings.Fields(`a an the and or but of to in on at for from by with without about into over
		is are was were be been being do does did has have had can could would should will shall may might must
		what which who whom whose when where why how this that these those it its there here then than
		i me my we our you your he she they them their his her us please tell show give let
		any some all each every no not yes now today right just also too very much many more most
		get got use used using`) {
		m[w] = true
	}
	return m
}()

// words lowercases s and splits it into letter/digit runs.
func words(s string) []string {
	return strings.FieldsFunc(strings.ToLower(s), func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) })
}

// wordMatch is equality up to a short suffix (gpu/gpus, process/processes).
func wordMatch(a, b string) bool {
	if a == b {
		return true
	}
	if len(a) > len(b) {
		a, b = b, a
	}
	return len(a) >= 3 && len(b)-len(a) <= 2 && strings.HasPrefix(b, a)
}

// toolScore scores how clearly q names tool t: 3 per name part, 1 per
// description word (4+ letters) found in q.
func toolScore(qwords []string, t oaiTool) (name, desc int) {
	has := func(w string) bool {
		for _, q := range qwords {
			if wordMatch(q, w) {
				return true
			}
		}
		return false
	}
	seen := map[string]bool{}
	for _, p := range words(t.Function.Name) {
		if !seen[p] && !stopwords[p] && has(p) {
			name += 3
		}
		seen[p] = true
	}
	for _, d := range words(t.Function.Description) {
		if len(d) >= 4 && !seen[d] && !stopwords[d] && has(d) {
			desc++
		}
		seen[d] = true
	}
	return name, desc
}

// bestTool returns the index of the best-scoring tool for q and its name
// score, or -1 when the question names no tool: no part of a tool's name
// (nor arithmetic for a calculator) and fewer than minDescWords words of
// one description. Prose that names no tool gets a prose answer.
func bestTool(q string, tools []oaiTool) (int, int) {
	qw := words(q)
	math := mathRe.MatchString(q)
	best, bestName, bestTotal := -1, 0, 0
	for i, t := range tools {
		n, d := toolScore(qw, t)
		if math && hasExpressionParam(t) {
			n += 3 // arithmetic in the question names a calculator
		}
		if n == 0 && d < minDescWords {
			continue
		}
		if total := n + d; total > bestTotal || (total == bestTotal && total > 0 && n > bestName) {
			best, bestName, bestTotal = i, n, total
		}
	}
	return best, bestName
}

// minDescWords is how many words of a tool's description a question must
// share to name the tool without naming it ("which processes hold
// memory?" names gpu_processes; "what is 6*7?" names no tool).
const minDescWords = 2

// andSplit cuts a question where "and" (or "&") joins two requests.
var andSplit = regexp.MustCompile(`(?i)\s*(?:,\s*)?\b(?:and|plus|as well as)\b\s*|\s*&\s*`)

// chooseCalls picks the tool(s) a question asks for.
func chooseCalls(q string, tools []oaiTool) []forcedToolCall {
	var picked []int
	if parts := andSplit.Split(q, -1); len(parts) > 1 {
		seen := map[int]bool{}
		for _, p := range parts {
			if i, name := bestTool(p, tools); i >= 0 && name > 0 && !seen[i] {
				seen[i] = true
				picked = append(picked, i)
			}
		}
		if len(picked) < 2 {
			picked = nil
		}
		if len(picked) > maxScriptedCalls {
			picked = picked[:maxScriptedCalls]
		}
	}
	if picked == nil {
		i, _ := bestTool(q, tools)
		if i < 0 {
			return nil // no tool named: answered in prose
		}
		picked = []int{i}
	}
	out := make([]forcedToolCall, 0, len(picked))
	for _, i := range picked {
		t := tools[i]
		if !argumentsMappable(t, q) {
			continue // e.g. a shell tool, but nothing in q to run
		}
		out = append(out, forcedToolCall{Name: t.Function.Name, Arguments: questionArguments(t, q), Finish: "tool_calls"})
	}
	return out
}

// unquoteWhole strips quotes around the whole message: a client may quote
// the user's text (opencode does with `opencode run "…"`), and the whole
// question is not a quoted command to run.
func unquoteWhole(q string) string {
	s := strings.TrimSpace(q)
	open, size := utf8.DecodeRuneInString(s)
	end, endSize := utf8.DecodeLastRuneInString(s)
	closing := map[rune]rune{'"': '"', '\'': '\'', '`': '`', '“': '”', '‘': '’'}[open]
	if len(s) < size+endSize || closing == 0 || end != closing {
		return q
	}
	inner := s[size : len(s)-endSize]
	if strings.ContainsRune(inner, open) || strings.ContainsRune(inner, closing) {
		return q // more than one quoted part: keep them
	}
	return inner
}

// noToolAnswer is the prose reply to a question that names no tool the
// scripted model can call with arguments from the question.
func noToolAnswer(q string, tools []oaiTool) string {
	names := make([]string, 0, len(tools))
	for _, t := range tools {
		names = append(names, t.Function.Name)
	}
	return scriptedPrefix + "I am the demo's scripted model: I call a tool when the question names one I can fill from it " +
		"(a quoted command, an arithmetic expression, a name), and answer from its result. " +
		"Nothing in " + strconv.Quote(quote(q)) + " maps to one of the tools offered (" + strings.Join(names, ", ") + ")."
}

// isCommandName reports a parameter that a shell runs (opencode's bash
// tool has "command"): filled only from a quoted command or arithmetic.
func isCommandName(name string) bool {
	ln := strings.ToLower(name)
	return strings.Contains(ln, "command") || ln == "cmd" || ln == "script"
}

// argumentsMappable reports that every required command-like parameter
// of t gets a command from q; a shell is never handed prose to run.
func argumentsMappable(t oaiTool, q string) bool {
	s := parseObjectSchema(t.Function.Parameters)
	for _, r := range s.Required {
		if isCommandName(r) && commandFromQuestion(q) == "" {
			return false
		}
	}
	return true
}

// commandFromQuestion is the shell command q asks for: a quoted part as
// written, else its arithmetic as an awk program that prints the value
// ("what is 6*7? use bash" → awk 'BEGIN { print 6*7 }'), else "".
func commandFromQuestion(q string) string {
	if m := quotedRe.FindStringSubmatch(q); m != nil {
		return strings.TrimSpace(m[1])
	}
	best := ""
	for _, m := range mathRe.FindAllString(q, -1) {
		if len(m) > len(best) {
			best = m
		}
	}
	if best = strings.TrimSpace(best); best == "" {
		return ""
	}
	best = strings.NewReplacer("×", "*", "÷", "/", "−", "-", "**", "^").Replace(best)
	return "awk 'BEGIN { print " + best + " }'"
}

// hasExpressionParam reports a string parameter named like an expression.
func hasExpressionParam(t oaiTool) bool {
	for name := range parseObjectSchema(t.Function.Parameters).Properties {
		if isExpressionName(name) {
			return true
		}
	}
	return false
}

func isExpressionName(name string) bool {
	ln := strings.ToLower(name)
	return strings.Contains(ln, "expr") || strings.Contains(ln, "formula") || strings.Contains(ln, "math")
}

// propSchema is the part of a property's schema the scripted mode reads.
type propSchema struct {
	Type    json.RawMessage `json:"type"`
	Enum    []any           `json:"enum"`
	Const   any             `json:"const"`
	Default any             `json:"default"`
	Minimum *float64        `json:"minimum"`
	Maximum *float64        `json:"maximum"`
}

type objectSchema struct {
	Properties map[string]json.RawMessage `json:"properties"`
	Required   []string                   `json:"required"`
}

func parseObjectSchema(raw json.RawMessage) objectSchema {
	var s objectSchema
	if len(raw) > 0 {
		_ = json.Unmarshal(raw, &s)
	}
	return s
}

func (s objectSchema) prop(name string) propSchema {
	var p propSchema
	_ = json.Unmarshal(s.Properties[name], &p)
	return p
}

// typeOf is a property's first non-null type name.
func (p propSchema) typeOf() string {
	var t string
	if json.Unmarshal(p.Type, &t) == nil {
		return t
	}
	var ts []string
	if json.Unmarshal(p.Type, &ts) == nil {
		for _, x := range ts {
			if x != "null" {
				return x
			}
		}
	}
	if len(p.Enum) > 0 {
		if _, ok := p.Enum[0].(string); ok {
			return "string"
		}
	}
	return ""
}

var (
	quotedRe = regexp.MustCompile("[\"'`“‘]([^\"'`”’\n]{1,120})[\"'`”’]")
	mathRe   = regexp.MustCompile(`[-+(]*\s*[0-9.]+(?:\s*(?:[-+*/^×÷−]|\*\*)\s*[-+(]*\s*[0-9.]+\)*)+\)*`)
	numberRe = regexp.MustCompile(`-?\d+(?:\.\d+)?`)
)

// questionArguments fills the required properties (and an optional enum
// the question mentions) from the schema and the question.
func questionArguments(t oaiTool, q string) string {
	s := parseObjectSchema(t.Function.Parameters)
	args := map[string]any{}
	names := make([]string, 0, len(s.Properties))
	for name := range s.Properties {
		names = append(names, name)
	}
	sort.Strings(names)
	required := map[string]bool{}
	for _, r := range s.Required {
		required[r] = true
	}
	for _, name := range names {
		p := s.prop(name)
		if v, ok := mentionedEnum(p.Enum, q); ok {
			args[name] = v
		} else if required[name] {
			args[name] = valueFromQuestion(name, p, q, t)
		}
	}
	// Required names without a property schema still get a value.
	for _, r := range s.Required {
		if _, ok := args[r]; !ok {
			args[r] = valueFromQuestion(r, propSchema{}, q, t)
		}
	}
	return marshalArgs(args)
}

func marshalArgs(args map[string]any) string {
	b, err := json.Marshal(args)
	if err != nil {
		return "{}"
	}
	return string(b)
}

// mentionedEnum returns the enum value q names as a word, if any.
func mentionedEnum(enum []any, q string) (any, bool) {
	lq := " " + strings.Join(words(q), " ") + " "
	for _, e := range enum {
		s, ok := e.(string)
		if !ok || s == "" {
			continue
		}
		if strings.Contains(lq, " "+strings.Join(words(s), " ")+" ") {
			return e, true
		}
	}
	return nil, false
}

// valueFromQuestion builds one argument value.
func valueFromQuestion(name string, p propSchema, q string, t oaiTool) any {
	switch {
	case p.Const != nil:
		return p.Const
	case len(p.Enum) > 0:
		return p.Enum[0]
	}
	switch p.typeOf() {
	case "string":
		return stringFromQuestion(name, q, t)
	case "integer", "number":
		if m := numberRe.FindString(q); m != "" {
			if f, err := strconv.ParseFloat(m, 64); err == nil && (p.Minimum == nil || f >= *p.Minimum) && (p.Maximum == nil || f <= *p.Maximum) {
				if p.typeOf() == "integer" {
					return int64(f)
				}
				return f
			}
		}
		if p.Default != nil {
			return p.Default
		}
		if p.Minimum != nil {
			return *p.Minimum
		}
		return 0
	}
	if p.Default != nil {
		return p.Default
	}
	return zeroForType(p.Type)
}

// stringFromQuestion picks a quoted part, an arithmetic expression for an
// expression-like parameter, or a word of the question that is not the
// tool's own name: a capitalised one (a proper noun) first.
func stringFromQuestion(name, q string, t oaiTool) string {
	if isCommandName(name) {
		return commandFromQuestion(q)
	}
	if m := quotedRe.FindStringSubmatch(q); m != nil {
		return strings.TrimSpace(m[1])
	}
	if isExpressionName(name) {
		best := ""
		for _, m := range mathRe.FindAllString(q, -1) {
			if len(m) > len(best) {
				best = m
			}
		}
		if best != "" {
			return strings.TrimSpace(best)
		}
	}
	skip := map[string]bool{}
	for _, w := range words(t.Function.Name + " " + name) {
		skip[w] = true
	}
	var cands []string
	var proper string
	for i, f := range strings.Fields(q) {
		w := strings.TrimFunc(f, func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) })
		lw := strings.ToLower(w)
		if len(w) < 2 || stopwords[lw] || skip[lw] {
			continue
		}
		cands = append(cands, w)
		if r, _ := utf8.DecodeRuneInString(w); i > 0 && proper == "" && unicode.IsUpper(r) {
			proper = w
		}
	}
	switch {
	case proper != "":
		return proper
	case len(cands) > 0:
		return cands[len(cands)-1]
	}
	return ""
}

// listRe finds the values an error message offers ("valid: a, b",
// "one of 'x', 'y'", "known customers: Globex, Initech").
var listRe = regexp.MustCompile(`(?i)\b(?:did you mean|one of|valid(?:\s+\w+)?|known(?:\s+\w+)?|available(?:\s+\w+)?|allowed(?:\s+\w+)?|expected|choose from|try|use)\s*(?:are|is)?\s*[:=]?\s*([^.;\n]+)`)

// itemSplit separates the items of such a list.
var itemSplit = regexp.MustCompile(`\s*,\s*|\s+or\s+|\s+and\s+`)

// errorCandidates lists the values an error text suggests, in order.
func errorCandidates(errText string) []string {
	var out []string
	seen := map[string]bool{}
	add := func(s string) {
		s = strings.Trim(strings.TrimSpace(s), "\"'`“”‘’[](){}?!")
		if s != "" && !seen[s] && utf8.RuneCountInString(s) <= 120 {
			seen[s] = true
			out = append(out, s)
		}
	}
	for _, m := range listRe.FindAllStringSubmatch(errText, -1) {
		for _, item := range itemSplit.Split(m[1], -1) {
			add(item)
		}
	}
	for _, m := range quotedRe.FindAllStringSubmatch(errText, -1) {
		add(m[1])
	}
	return out
}

// correctedArguments repairs a failed call's arguments from the error text:
// an enum takes a value the error mentions (else its first value other than
// the failed one); a free string named in the error (or the only one) takes
// the first value the error offers; missing required properties are filled.
func correctedArguments(schema json.RawMessage, prevArgs, errText string) string {
	s := parseObjectSchema(schema)
	args := map[string]any{}
	if json.Unmarshal([]byte(prevArgs), &args) != nil || args == nil {
		args = map[string]any{}
	}
	lerr := strings.ToLower(errText)
	cands := errorCandidates(errText)
	stringProps := 0
	for name := range args {
		if _, ok := args[name].(string); ok {
			stringProps++
		}
	}
	names := make([]string, 0, len(s.Properties))
	for name := range s.Properties {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		p := s.prop(name)
		cur, present := args[name]
		if len(p.Enum) > 0 {
			if !present && !slices.Contains(s.Required, name) {
				continue
			}
			args[name] = enumFix(p.Enum, cur, lerr)
			continue
		}
		str, isStr := cur.(string)
		if !present || !isStr || !(strings.Contains(lerr, strings.ToLower(name)) || stringProps == 1) {
			continue
		}
		if fixed, ok := fixLookalike(str, cands); ok {
			args[name] = fixed
			continue
		}
		for _, c := range cands {
			if c != str && !strings.EqualFold(c, name) {
				args[name] = c
				break
			}
		}
	}
	for _, r := range s.Required {
		if _, ok := args[r]; !ok {
			args[r] = valueFromQuestion(r, s.prop(r), "", oaiTool{})
		}
	}
	return marshalArgs(args)
}

// enumFix picks the enum value the error text mentions, else the first one
// that differs from the failed value.
func enumFix(enum []any, cur any, lerr string) any {
	curS := fmt.Sprint(cur)
	for _, e := range enum {
		s := fmt.Sprint(e)
		if s != curS && s != "" && strings.Contains(lerr, strings.ToLower(s)) {
			return e
		}
	}
	for _, e := range enum {
		if fmt.Sprint(e) != curS {
			return e
		}
	}
	return enum[0]
}

// lookalikes are the characters people type for an operator ("6 x 7",
// "10 : 2"); a model that reads "unexpected 'x'" fixes them in place.
var lookalikes = map[string]string{"x": "*", "X": "*", ":": "/"}

// fixLookalike replaces a token the error quotes from inside the failed
// argument with the operator it stands for, where it stands between
// numbers or blanks (so the x of "max" is left alone). ok false: no such
// token.
func fixLookalike(arg string, cands []string) (string, bool) {
	for _, c := range cands {
		op, known := lookalikes[c]
		if !known {
			continue
		}
		var b strings.Builder
		changed := false
		for i := 0; i < len(arg); i++ {
			if arg[i:i+1] == c && operandEdge(arg, i-1) && operandEdge(arg, i+1) {
				b.WriteString(op)
				changed = true
				continue
			}
			b.WriteByte(arg[i])
		}
		if changed {
			return b.String(), true
		}
	}
	return "", false
}

// operandEdge reports whether arg[i] is a digit, blank, bracket or the
// string's edge: where an operator may stand.
func operandEdge(arg string, i int) bool {
	if i < 0 || i >= len(arg) {
		return true
	}
	c := arg[i]
	return c == ' ' || c == '(' || c == ')' || c == '.' || (c >= '0' && c <= '9')
}
