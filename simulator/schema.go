package simulator

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Structured output. A chat request with response_format json_schema gets a
// JSON document that is valid against the schema, the way vLLM's guided
// decoding (and Ollama's format) constrain a real model. The document is
// generated deterministically from the schema and the request's user
// messages: clients that parse and check model output (the triage worker)
// get realistic, varied but reproducible verdicts, and a mail-triage-like
// schema (contactType, importance, isRealConversation, reasoning) gets
// values that follow a few keywords, with a reasoning that says it is the
// simulator's verdict. Supported keywords: type (also as a list), const, enum,
// properties, required, additionalProperties, minProperties, items,
// prefixItems, minItems, maxItems, minLength, maxLength, format (date-time,
// date, time, email, uri, uuid), minimum, maximum, exclusiveMinimum,
// exclusiveMaximum, multipleOf, $ref into the same document ($defs,
// definitions), anyOf/oneOf (first branch), allOf (merged). pattern,
// contains and conditionals are not honoured (best effort).

const (
	// maxSchemaDepth bounds nesting while reading a schema and while
	// generating from it ($ref cycles end here).
	maxSchemaDepth = 64
	// maxGenNodes bounds how many values one reply may contain, so a schema
	// asking for a billion items cannot exhaust the simulator.
	maxGenNodes = 20000
	// maxGenText bounds the characters of all generated strings together
	// (a minLength beyond what is left is not met).
	maxGenText = 1 << 20
)

// responseFormat is a decoded response_format that asks for JSON.
type responseFormat struct {
	kind   string // "json_object" or "json_schema"
	schema any    // ordered schema document (json_schema only)
	strict bool
}

// decodeResponseFormat reads response_format. It returns nil for none, for
// "text", and for forms the flavour ignores (vLLM's structural_tag, Ollama's
// unknown types); an error is the flavour's 400.
func decodeResponseFormat(raw json.RawMessage, f Flavor) (*responseFormat, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	vllm := f == FlavorVLLM
	var rf struct {
		Type       string          `json:"type"`
		JSONSchema json.RawMessage `json:"json_schema"`
	}
	if err := json.Unmarshal(raw, &rf); err != nil {
		if vllm {
			return nil, badRequest("response_format: Input should be a valid dictionary or object to extract fields from")
		}
		return nil, badRequest("invalid response_format: %v", err)
	}
	switch rf.Type {
	case "text", "structural_tag":
		return nil, nil
	case "json_object":
		return &responseFormat{kind: rf.Type}, nil
	case "json_schema":
	default:
		if vllm {
			return nil, badRequest("response_format.type: Input should be 'text', 'json_object', 'json_schema' or 'structural_tag', got %q", rf.Type)
		}
		return nil, nil // Ollama ignores a type it does not know
	}
	js := bytes.TrimSpace(rf.JSONSchema)
	if len(js) == 0 || string(js) == "null" {
		if vllm {
			return nil, badRequest("response_format.json_schema: Field required when type is 'json_schema'")
		}
		return nil, nil
	}
	var spec struct {
		Schema json.RawMessage `json:"schema"`
		Strict *bool           `json:"strict"`
	}
	if err := json.Unmarshal(js, &spec); err != nil {
		if vllm {
			return nil, badRequest("response_format.json_schema: Input should be a valid dictionary or object to extract fields from")
		}
		return nil, badRequest("invalid response_format.json_schema: %v", err)
	}
	sch := bytes.TrimSpace(spec.Schema)
	if len(sch) == 0 || string(sch) == "null" {
		if vllm {
			return nil, badRequest("response_format.json_schema.schema: Field required")
		}
		return nil, nil
	}
	if sch[0] != '{' {
		if vllm {
			return nil, badRequest("response_format.json_schema.schema: Input should be a valid dictionary")
		}
		return nil, badRequest("invalid format: %q; expected \"json\" or a valid JSON Schema", string(sch))
	}
	doc, err := decodeOrdered(sch)
	if err != nil {
		return nil, badRequest("response_format.json_schema.schema: %v", err)
	}
	return &responseFormat{kind: rf.Type, schema: doc, strict: spec.Strict != nil && *spec.Strict}, nil
}

// jsonObject is a JSON object that keeps its key order, so a generated reply
// lists properties in the schema's order, as a constrained model writes them.
type jsonObject struct {
	keys []string
	vals map[string]any
}

func newJSONObject() *jsonObject { return &jsonObject{vals: map[string]any{}} }

func (o *jsonObject) get(k string) (any, bool) {
	if o == nil {
		return nil, false
	}
	v, ok := o.vals[k]
	return v, ok
}

func (o *jsonObject) set(k string, v any) {
	if _, ok := o.vals[k]; !ok {
		o.keys = append(o.keys, k)
	}
	o.vals[k] = v
}

func (o *jsonObject) del(k string) {
	if _, ok := o.vals[k]; !ok {
		return
	}
	delete(o.vals, k)
	for i, key := range o.keys {
		if key == k {
			o.keys = append(o.keys[:i:i], o.keys[i+1:]...)
			break
		}
	}
}

// MarshalJSON writes the object with its keys in order.
func (o *jsonObject) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, k := range o.keys {
		if i > 0 {
			b.WriteByte(',')
		}
		kb, err := json.Marshal(k)
		if err != nil {
			return nil, err
		}
		vb, err := json.Marshal(o.vals[k])
		if err != nil {
			return nil, err
		}
		b.Write(kb)
		b.WriteByte(':')
		b.Write(vb)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// decodeOrdered decodes one JSON value with objects as *jsonObject and
// numbers as json.Number.
func decodeOrdered(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := readOrdered(dec, 0)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err == nil {
		return nil, errors.New("unexpected data after the schema")
	}
	return v, nil
}

func readOrdered(dec *json.Decoder, depth int) (any, error) {
	if depth > maxSchemaDepth {
		return nil, fmt.Errorf("nested deeper than %d levels", maxSchemaDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	d, ok := tok.(json.Delim)
	if !ok {
		return tok, nil // string, json.Number, bool or nil
	}
	switch d {
	case '{':
		obj := newJSONObject()
		for dec.More() {
			kt, err := dec.Token()
			if err != nil {
				return nil, fmt.Errorf("invalid JSON: %w", err)
			}
			key, _ := kt.(string)
			v, err := readOrdered(dec, depth+1)
			if err != nil {
				return nil, err
			}
			obj.set(key, v)
		}
		if _, err := dec.Token(); err != nil {
			return nil, fmt.Errorf("invalid JSON: %w", err)
		}
		return obj, nil
	case '[':
		arr := []any{}
		for dec.More() {
			v, err := readOrdered(dec, depth+1)
			if err != nil {
				return nil, err
			}
			arr = append(arr, v)
		}
		if _, err := dec.Token(); err != nil {
			return nil, fmt.Errorf("invalid JSON: %w", err)
		}
		return arr, nil
	}
	return nil, fmt.Errorf("invalid JSON: unexpected %v", d)
}

// verdict is what a few keywords in the user messages say about a mail; the
// generator turns it into the triage fields' values.
type verdict struct {
	keyword string // the keyword that matched, "" for none
	class   string // "promotional", "customer", "lead" or "" (no keyword)
}

// verdictKeywords are checked in order; promotional words come first because
// newsletters often say "order" or "offer" too.
var verdictKeywords = []struct{ word, class string }{
	{"unsubscribe", "promotional"}, {"newsletter", "promotional"}, {"abmelden", "promotional"},
	{"abbestellen", "promotional"}, {"webinar", "promotional"},
	{"urgent", "customer"}, {"dringend", "customer"}, {"invoice", "customer"}, {"rechnung", "customer"},
	{"order", "customer"}, {"bestellung", "customer"}, {"customer", "customer"}, {"kunde", "customer"},
	{"offer", "lead"}, {"quote", "lead"}, {"angebot", "lead"}, {"anfrage", "lead"},
}

// verdictOf looks for the keywords as words (or their plural) in text.
func verdictOf(text string) verdict {
	words := map[string]bool{}
	for _, w := range strings.FieldsFunc(strings.ToLower(text), func(r rune) bool {
		return !unicode.IsLetter(r) && !unicode.IsDigit(r)
	}) {
		words[w] = true
	}
	for _, k := range verdictKeywords {
		if words[k.word] || words[k.word+"s"] {
			return verdict{keyword: k.word, class: k.class}
		}
	}
	return verdict{}
}

// reasoning is the honest explanation of a simulated verdict.
func (v verdict) reasoning() string {
	switch v.class {
	case "promotional":
		return fmt.Sprintf("Simulator verdict, not a model: the mail mentions %q, so it is treated as promotional bulk mail of low importance.", v.keyword)
	case "customer":
		return fmt.Sprintf("Simulator verdict, not a model: the mail mentions %q, so it is treated as a customer conversation of high importance.", v.keyword)
	case "lead":
		return fmt.Sprintf("Simulator verdict, not a model: the mail mentions %q, so it is treated as a sales lead of high importance.", v.keyword)
	}
	return "Simulator verdict, not a model: no triage keyword found, so the values are picked from a hash of the message."
}

// generator builds one schema-valid document.
type generator struct {
	root    any
	seed    uint64
	strict  bool
	verdict verdict
	budget  int // values left to generate
	text    int // string characters left to generate
}

// generateDocument returns a JSON document valid against schema (best
// effort for the keywords listed at the top of this file), seeded by text.
func generateDocument(schema any, strict bool, text string) ([]byte, any) {
	h := fnv.New64a()
	_, _ = h.Write([]byte(text))
	g := &generator{root: schema, seed: h.Sum64(), strict: strict, verdict: verdictOf(text), budget: maxGenNodes, text: maxGenText}
	v := g.value(schema, "", "", 0)
	out, err := json.Marshal(v)
	if err != nil { // only our own value types get here
		return []byte("{}"), newJSONObject()
	}
	return out, v
}

// pick returns a number in [0, n) that depends on the seed and path.
func (g *generator) pick(path string, n int) int {
	if n <= 1 {
		return 0
	}
	h := fnv.New64a()
	var b [8]byte
	for i := range b {
		b[i] = byte(g.seed >> (8 * i))
	}
	_, _ = h.Write(b[:])
	_, _ = h.Write([]byte(path))
	return int(h.Sum64() % uint64(n))
}

func (g *generator) value(s any, name, path string, depth int) any {
	if depth > maxSchemaDepth || g.budget <= 0 {
		return nil
	}
	g.budget--
	obj, ok := s.(*jsonObject)
	if !ok {
		if b, isBool := s.(bool); isBool && b {
			return "simulated"
		}
		return nil // false schema (nothing is valid) or not a schema
	}
	if ref, ok := obj.get("$ref"); ok {
		if r, ok := ref.(string); ok {
			if target := g.resolve(r); target != nil {
				return g.value(target, name, path, depth+1)
			}
		}
	}
	if c, ok := obj.get("const"); ok {
		return c
	}
	if e, ok := obj.get("enum"); ok {
		if list, ok := e.([]any); ok && len(list) > 0 {
			return g.enum(list, name, path)
		}
	}
	for _, k := range []string{"anyOf", "oneOf"} {
		if br, ok := obj.get(k); ok {
			if list, ok := br.([]any); ok && len(list) > 0 {
				return g.value(mergeSchemas(withoutKey(obj, k), list[:1], g), name, path, depth+1)
			}
		}
	}
	if all, ok := obj.get("allOf"); ok {
		if list, ok := all.([]any); ok && len(list) > 0 {
			return g.value(mergeSchemas(withoutKey(obj, "allOf"), list, g), name, path, depth+1)
		}
	}
	switch schemaType(obj) {
	case "null":
		return nil
	case "boolean":
		return g.boolean(name, path)
	case "integer":
		return g.integer(obj, name, path)
	case "number":
		return g.number(obj, name, path)
	case "array":
		return g.array(obj, name, path, depth)
	case "object":
		return g.object(obj, path, depth)
	default:
		return g.str(obj, name, path)
	}
}

// resolve follows a $ref inside the request's own schema ("#", "#/$defs/x",
// "#/definitions/x", any JSON pointer); other references are not fetched.
func (g *generator) resolve(ref string) any {
	if !strings.HasPrefix(ref, "#") {
		return nil
	}
	cur := g.root
	ptr := strings.TrimPrefix(ref, "#")
	if ptr == "" {
		return cur
	}
	if !strings.HasPrefix(ptr, "/") {
		return nil
	}
	for _, tok := range strings.Split(ptr[1:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch c := cur.(type) {
		case *jsonObject:
			v, ok := c.get(tok)
			if !ok {
				return nil
			}
			cur = v
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(c) {
				return nil
			}
			cur = c[i]
		default:
			return nil
		}
	}
	return cur
}

func withoutKey(o *jsonObject, key string) *jsonObject {
	out := newJSONObject()
	for _, k := range o.keys {
		if k != key {
			out.set(k, o.vals[k])
		}
	}
	return out
}

// mergeSchemas folds subschemas into base: properties and required are
// united, other keywords of later schemas win unless base set them.
func mergeSchemas(base *jsonObject, subs []any, g *generator) *jsonObject {
	out := withoutKey(base, "")
	// A subschema that is a $ref contributes its target (one level; a
	// $ref in the target is followed later by value, depth-bounded).
	var expanded []*jsonObject
	for _, sub := range subs {
		so, ok := sub.(*jsonObject)
		if !ok {
			continue
		}
		if ref, ok := so.vals["$ref"].(string); ok {
			if t, ok := g.resolve(ref).(*jsonObject); ok {
				expanded = append(expanded, withoutKey(so, "$ref"), t)
				continue
			}
		}
		expanded = append(expanded, so)
	}
	for _, so := range expanded {
		for _, k := range so.keys {
			v := so.vals[k]
			switch k {
			case "properties":
				props, _ := out.vals["properties"].(*jsonObject)
				merged := newJSONObject()
				if props != nil {
					for _, pk := range props.keys {
						merged.set(pk, props.vals[pk])
					}
				}
				if sp, ok := v.(*jsonObject); ok {
					for _, pk := range sp.keys {
						if _, exists := merged.get(pk); !exists {
							merged.set(pk, sp.vals[pk])
						}
					}
				}
				out.set("properties", merged)
			case "required":
				req, _ := out.vals["required"].([]any)
				if sr, ok := v.([]any); ok {
					req = append(append([]any{}, req...), sr...)
				}
				out.set("required", req)
			default:
				if _, exists := out.get(k); !exists {
					out.set(k, v)
				}
			}
		}
	}
	return out
}

// schemaType is the type to generate: the schema's own (the first non-null
// one of a list, "null" when that is all) or one inferred from its keywords.
func schemaType(o *jsonObject) string {
	if t, ok := o.get("type"); ok {
		switch tt := t.(type) {
		case string:
			return tt
		case []any:
			for _, x := range tt {
				if s, ok := x.(string); ok && s != "null" {
					return s
				}
			}
			if len(tt) > 0 {
				return "null"
			}
		}
	}
	has := func(keys ...string) bool {
		for _, k := range keys {
			if _, ok := o.get(k); ok {
				return true
			}
		}
		return false
	}
	switch {
	case has("properties", "required", "additionalProperties", "minProperties", "patternProperties"):
		return "object"
	case has("items", "prefixItems", "minItems", "maxItems", "uniqueItems"):
		return "array"
	case has("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"):
		return "number"
	}
	return "string"
}

func (g *generator) enum(list []any, name, path string) any {
	if isContactTypeName(name) && g.verdict.class != "" {
		for _, v := range list {
			if s, ok := v.(string); ok && s == g.verdict.class {
				return v
			}
		}
	}
	return list[g.pick(path, len(list))]
}

func normName(name string) string {
	return strings.ReplaceAll(strings.ReplaceAll(strings.ToLower(name), "_", ""), "-", "")
}

func isContactTypeName(name string) bool {
	n := normName(name)
	return n == "contacttype" || n == "category" || n == "class"
}

func (g *generator) boolean(name, path string) bool {
	if n := normName(name); n == "isrealconversation" || n == "realconversation" {
		switch g.verdict.class {
		case "promotional":
			return false
		case "customer", "lead":
			return true
		}
	}
	return g.pick(path, 2) == 1
}

// numField reads a numeric keyword (json.Number in a decoded schema).
func numField(o *jsonObject, key string) (float64, bool) {
	v, ok := o.get(key)
	if !ok {
		return 0, false
	}
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	f, err := n.Float64()
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, false
	}
	return f, true
}

// bounds returns the inclusive-or-exclusive range of a numeric schema
// (draft 2020-12 numeric exclusives and draft-4 boolean ones).
func bounds(o *jsonObject) (lo, hi float64, loEx, hiEx bool) {
	lo, hi = math.Inf(-1), math.Inf(1)
	if m, ok := numField(o, "minimum"); ok {
		lo = m
		if b, ok := o.vals["exclusiveMinimum"].(bool); ok && b {
			loEx = true
		}
	}
	if m, ok := numField(o, "exclusiveMinimum"); ok && m >= lo {
		lo, loEx = m, true
	}
	if m, ok := numField(o, "maximum"); ok {
		hi = m
		if b, ok := o.vals["exclusiveMaximum"].(bool); ok && b {
			hiEx = true
		}
	}
	if m, ok := numField(o, "exclusiveMaximum"); ok && m <= hi {
		hi, hiEx = m, true
	}
	return lo, hi, loEx, hiEx
}

// intRange is the integer range of a schema, defaulting open sides to a
// span of 100 and keeping values exact in float64.
func intRange(o *jsonObject) (lo, hi int64) {
	flo, fhi, loEx, hiEx := bounds(o)
	const limit = 1 << 50
	l, h := math.Ceil(flo), math.Floor(fhi)
	if loEx && l == flo {
		l++
	}
	if hiEx && h == fhi {
		h--
	}
	switch {
	case math.IsInf(l, -1) && math.IsInf(h, 1):
		l, h = 0, 100
	case math.IsInf(l, -1):
		l = h - 100
	case math.IsInf(h, 1):
		h = l + 100
	}
	l = math.Max(math.Min(l, limit), -limit)
	h = math.Max(math.Min(h, limit), -limit)
	return int64(l), int64(h)
}

// importanceShare places a verdict on a 0..1 scale of importance.
func (g *generator) importanceShare(path string) float64 {
	switch g.verdict.class {
	case "promotional":
		return []float64{0, 0.1}[g.pick(path, 2)]
	case "customer":
		return []float64{0.7, 0.8, 0.9}[g.pick(path, 3)]
	case "lead":
		return []float64{0.6, 0.7, 0.8}[g.pick(path, 3)]
	}
	return []float64{0.2, 0.3, 0.4, 0.5}[g.pick(path, 4)]
}

func (g *generator) integer(o *jsonObject, name, path string) json.Number {
	lo, hi := intRange(o)
	if lo > hi {
		return json.Number(strconv.FormatInt(lo, 10))
	}
	step := int64(1)
	if m, ok := numField(o, "multipleOf"); ok && m >= 1 && m == math.Trunc(m) && m < 1<<50 {
		step = int64(m)
	}
	first := ceilDiv(lo, step) * step
	last := floorDiv(hi, step) * step
	if first > last {
		return json.Number(strconv.FormatInt(first, 10))
	}
	n := (last-first)/step + 1
	var k int64
	switch nn := normName(name); {
	case nn == "importance" || nn == "priority" || nn == "urgency":
		k = int64(math.Round(g.importanceShare(path) * float64(n-1)))
	case n > 1<<30:
		k = int64(g.pick(path, 1<<30))
	default:
		k = int64(g.pick(path, int(n)))
	}
	return json.Number(strconv.FormatInt(first+k*step, 10))
}

func ceilDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a > 0 {
		q++
	}
	return q
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

func (g *generator) number(o *jsonObject, name, path string) json.Number {
	flo, fhi, loEx, _ := bounds(o)
	m, hasMul := numField(o, "multipleOf")
	if hasMul && m <= 0 {
		hasMul = false
	}
	// An integer in range is the simplest valid number, also for multipleOf
	// 0.5, 0.1, 0.01 …; otherwise the first multiple or the midpoint.
	if !hasMul || m == math.Trunc(m) || isUnitFraction(m) {
		if lo, hi := intRange(o); lo <= hi {
			return g.integer(o, name, path)
		}
	}
	if math.IsInf(flo, -1) {
		flo = fhi - 100
	}
	if math.IsInf(fhi, 1) {
		fhi = flo + 100
	}
	if hasMul {
		first := math.Ceil(flo/m) * m
		if loEx && first <= flo {
			first += m
		}
		return json.Number(formatMultiple(first, m))
	}
	return json.Number(strconv.FormatFloat((flo+fhi)/2, 'g', -1, 64))
}

// isUnitFraction reports whether every integer is a multiple of m (1/m is a
// whole number).
func isUnitFraction(m float64) bool {
	if m <= 0 || m > 1 {
		return false
	}
	inv := 1 / m
	return math.Abs(inv-math.Round(inv)) < 1e-9
}

// formatMultiple writes v with as many decimals as m has, so 0.07 stays 0.07
// and not 0.07000000000000001.
func formatMultiple(v, m float64) string {
	ms := strconv.FormatFloat(m, 'f', -1, 64)
	dec := 0
	if i := strings.IndexByte(ms, '.'); i >= 0 {
		dec = len(ms) - i - 1
	}
	return strconv.FormatFloat(v, 'f', dec, 64)
}

func intField(o *jsonObject, key string) (int, bool) {
	f, ok := numField(o, key)
	if !ok || f < 0 {
		return 0, false
	}
	if f > math.MaxInt32 {
		return math.MaxInt32, true
	}
	return int(f), true
}

func (g *generator) array(o *jsonObject, name, path string, depth int) []any {
	n := 1
	if mn, ok := intField(o, "minItems"); ok {
		n = mn
	}
	if mx, ok := intField(o, "maxItems"); ok && n > mx {
		n = mx
	}
	prefix, _ := o.vals["prefixItems"].([]any)
	items, hasItems := o.get("items")
	if tuple, ok := items.([]any); ok { // draft-7 tuple form
		prefix, hasItems = tuple, false
		items = nil
		if add, ok := o.get("additionalItems"); ok {
			items, hasItems = add, true
		}
	}
	if b, ok := items.(bool); ok && !b {
		hasItems = false
		n = min(n, len(prefix))
	}
	out := []any{}
	for i := 0; i < n && g.budget > 0; i++ {
		p := fmt.Sprintf("%s/%d", path, i)
		switch {
		case i < len(prefix):
			out = append(out, g.value(prefix[i], name, p, depth+1))
		case hasItems:
			out = append(out, g.value(items, name, p, depth+1))
		default:
			out = append(out, g.value(true, name, p, depth+1))
		}
	}
	return out
}

func (g *generator) object(o *jsonObject, path string, depth int) *jsonObject {
	out := newJSONObject()
	props, _ := o.vals["properties"].(*jsonObject)
	want := map[string]bool{}
	reqList, _ := o.vals["required"].([]any)
	for _, r := range reqList {
		if s, ok := r.(string); ok {
			want[s] = true
		}
	}
	if props != nil {
		for _, k := range props.keys {
			if g.strict || want[k] {
				out.set(k, g.value(props.vals[k], k, path+"/"+k, depth+1))
			}
		}
	}
	addl, hasAddl := o.get("additionalProperties")
	if !hasAddl || addl == nil {
		addl = true
	}
	for _, r := range reqList {
		k, ok := r.(string)
		if !ok {
			continue
		}
		if _, done := out.get(k); !done {
			out.set(k, g.value(addl, k, path+"/"+k, depth+1))
		}
	}
	if mn, ok := intField(o, "minProperties"); ok {
		if props != nil {
			for _, k := range props.keys {
				if len(out.keys) >= mn {
					break
				}
				if _, done := out.get(k); !done {
					out.set(k, g.value(props.vals[k], k, path+"/"+k, depth+1))
				}
			}
		}
		if b, ok := addl.(bool); !ok || b {
			for i := 0; len(out.keys) < mn && g.budget > 0; i++ {
				k := fmt.Sprintf("extra%d", i)
				out.set(k, g.value(addl, k, path+"/"+k, depth+1))
			}
		}
	}
	return out
}

func (g *generator) str(o *jsonObject, name, path string) string {
	var s string
	format, _ := o.vals["format"].(string)
	switch format {
	case "date-time":
		s = "2025-01-15T09:30:00Z"
	case "date":
		s = "2025-01-15"
	case "time":
		s = "09:30:00Z"
	case "email":
		s = "someone@example.com"
	case "uri", "url":
		s = "https://example.com/"
	case "uuid":
		h := fnv.New128a()
		_, _ = fmt.Fprintf(h, "%d%s", g.seed, path)
		b := h.Sum(nil)
		s = fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
	default:
		switch n := normName(name); n {
		case "reasoning", "reason", "explanation", "rationale", "summary":
			s = g.verdict.reasoning()
		case "":
			s = "simulated text"
		default:
			s = "simulated " + name
		}
	}
	s = fitLength(s, o, g.text)
	g.text = max(0, g.text-utf8.RuneCountInString(s))
	return s
}

// fitLength pads or cuts s (in code points, as JSON Schema counts) to the
// schema's minLength and maxLength, padding to at most left characters.
func fitLength(s string, o *jsonObject, left int) string {
	mn, hasMin := intField(o, "minLength")
	mx, hasMax := intField(o, "maxLength")
	mn = min(mn, left)
	n := utf8.RuneCountInString(s)
	if hasMax && n > mx {
		r := []rune(s)
		s = string(r[:mx])
		n = mx
	}
	if hasMin && n < mn {
		s += strings.Repeat(".", mn-n)
	}
	return s
}

// violate turns a valid document into one the schema rejects, for
// --schema-fault invalid: a bounded number pushed past its maximum (an
// importance of 42 on a 1–10 scale), else a value outside an enum, else a
// missing required property, else the wrong type.
func violate(schema any, doc any) []byte {
	o, _ := schema.(*jsonObject)
	d, isObj := doc.(*jsonObject)
	if o != nil && isObj {
		props, _ := o.vals["properties"].(*jsonObject)
		if props != nil {
			for _, k := range props.keys {
				p, _ := props.vals[k].(*jsonObject)
				if p == nil {
					continue
				}
				if _, in := d.get(k); !in {
					continue
				}
				if mx, ok := numField(p, "maximum"); ok {
					d.set(k, json.Number(strconv.FormatFloat(mx+32, 'f', -1, 64)))
					return mustMarshal(d)
				}
			}
			for _, k := range props.keys {
				p, _ := props.vals[k].(*jsonObject)
				if _, ok := p.get("enum"); ok {
					d.set(k, "not-one-of-the-allowed-values")
					return mustMarshal(d)
				}
			}
		}
		if req, _ := o.vals["required"].([]any); len(req) > 0 {
			if k, ok := req[0].(string); ok {
				d.del(k)
				return mustMarshal(d)
			}
		}
	}
	if o != nil && schemaType(o) != "array" {
		return []byte(`["simulated","wrong","type"]`)
	}
	return []byte(`{"simulated":"wrong type"}`)
}

func mustMarshal(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		return []byte(`{"simulated":"unencodable"}`)
	}
	return b
}
