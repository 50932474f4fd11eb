package calc

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Limits on one expression. They exist so that a model (or whoever feeds
// it) cannot make the parser do unbounded work: the length bounds the
// tokens, the depth bounds the recursion.
const (
	// MaxLength is the longest expression accepted, in characters.
	MaxLength = 1000
	// MaxDepth is the deepest nesting of parentheses, unary signs, powers
	// and function calls accepted.
	MaxDepth = 100
)

// Error is an evaluation failure at a position, so that the model can see
// exactly which character to fix. Pos counts characters from 1; 0 means the
// error concerns the whole expression.
type Error struct {
	Pos  int
	Msg  string
	Hint string // what is allowed instead, for syntax errors
}

func (e *Error) Error() string {
	s := e.Msg
	if e.Pos > 0 {
		s = fmt.Sprintf("%s at %d", s, e.Pos)
	}
	if e.Hint != "" {
		s += ": " + e.Hint
	}
	return s
}

// allowedHint ends syntax errors: a model that tried something else learns
// in one round trip what it may write.
const allowedHint = "only numbers, + - * / ^ (also × ÷ −), parentheses, the functions sqrt abs round floor ceil min max ln log10 exp and the constants pi e are allowed"

type tokKind int

const (
	tokEOF tokKind = iota
	tokNum
	tokIdent
	tokOp  // one of + - * / ^ ( ) ,
	tokBad // a character outside the grammar; lexing stops there
)

type token struct {
	kind tokKind
	op   rune    // tokOp: normalised operator
	num  float64 // tokNum
	text string  // as written, for messages
	pos  int     // 1-based character position
}

// lex splits s into tokens. It works on runes so that positions are the
// ones a person counts and the Unicode operators are single tokens.
func lex(s string) ([]token, error) {
	rs := []rune(s)
	var toks []token
	for i := 0; i < len(rs); {
		r := rs[i]
		pos := i + 1
		switch {
		case unicode.IsSpace(r):
			i++
		case r >= '0' && r <= '9' || r == '.':
			j := i
			digits := 0
			for j < len(rs) && rs[j] >= '0' && rs[j] <= '9' {
				j++
				digits++
			}
			if j < len(rs) && rs[j] == '.' {
				j++
				for j < len(rs) && rs[j] >= '0' && rs[j] <= '9' {
					j++
					digits++
				}
			}
			if digits == 0 { // a lone '.', as in "process.exit"
				toks = append(toks, token{kind: tokBad, text: ".", pos: pos})
				i = len(rs)
				continue
			}
			// An exponent only when digits follow, so "2e" stays 2 then the
			// constant e (and is then rejected as a missing operator).
			if j < len(rs) && (rs[j] == 'e' || rs[j] == 'E') {
				k := j + 1
				if k < len(rs) && (rs[k] == '+' || rs[k] == '-') {
					k++
				}
				if k < len(rs) && rs[k] >= '0' && rs[k] <= '9' {
					for k < len(rs) && rs[k] >= '0' && rs[k] <= '9' {
						k++
					}
					j = k
				}
			}
			text := string(rs[i:j])
			f, err := strconv.ParseFloat(text, 64)
			if err != nil {
				if errors.Is(err, strconv.ErrRange) {
					return nil, &Error{Pos: pos, Msg: fmt.Sprintf("number %s is out of range", text)}
				}
				return nil, &Error{Pos: pos, Msg: fmt.Sprintf("malformed number %q", text)}
			}
			toks = append(toks, token{kind: tokNum, num: f, text: text, pos: pos})
			i = j
		case r < utf8.RuneSelf && (unicode.IsLetter(r) || r == '_'):
			j := i
			for j < len(rs) && rs[j] < utf8.RuneSelf && (unicode.IsLetter(rs[j]) || unicode.IsDigit(rs[j]) || rs[j] == '_') {
				j++
			}
			toks = append(toks, token{kind: tokIdent, text: string(rs[i:j]), pos: pos})
			i = j
		default:
			op, ok := operator(r)
			if !ok {
				// Reported by the parser when it gets there, so that
				// "process.exit()" is blamed on the unknown name first.
				toks = append(toks, token{kind: tokBad, text: string(r), pos: pos})
				i = len(rs)
				continue
			}
			toks = append(toks, token{kind: tokOp, op: op, text: string(r), pos: pos})
			i++
		}
	}
	toks = append(toks, token{kind: tokEOF, text: "end of expression", pos: len(rs) + 1})
	return toks, nil
}

// operator normalises the accepted operator spellings.
func operator(r rune) (rune, bool) {
	switch r {
	case '+', '-', '*', '/', '^', '(', ')', ',':
		return r, true
	case '×', '·':
		return '*', true
	case '÷':
		return '/', true
	case '−': // U+2212 MINUS SIGN
		return '-', true
	}
	return 0, false
}

func quoteRune(r rune) string {
	if unicode.IsPrint(r) {
		return "'" + string(r) + "'"
	}
	return fmt.Sprintf("%U", r)
}

func describe(t token) string {
	switch t.kind {
	case tokEOF:
		return "end of expression"
	case tokNum, tokIdent:
		return "'" + t.text + "'"
	}
	return quoteRune([]rune(t.text)[0])
}

// Evaluate computes an arithmetic expression. It never executes anything:
// the input is tokenised and parsed by recursive descent with precedence
// climbing (+ - lowest, then * /, then unary minus, then right-associative
// ^), and every intermediate result must be a finite number.
func Evaluate(expr string) (float64, error) {
	if !utf8.ValidString(expr) {
		return 0, &Error{Msg: "expression is not valid UTF-8 text"}
	}
	if n := utf8.RuneCountInString(expr); n > MaxLength {
		return 0, &Error{Msg: fmt.Sprintf("expression is %d characters long; at most %d are accepted", n, MaxLength)}
	}
	if strings.TrimSpace(expr) == "" {
		return 0, &Error{Msg: "expression is empty; write an arithmetic expression such as (2 + 3) * 4"}
	}
	toks, err := lex(expr)
	if err != nil {
		return 0, err
	}
	p := &parser{toks: toks}
	v, err := p.expr(0)
	if err != nil {
		return 0, err
	}
	if t := p.peek(); t.kind != tokEOF {
		return 0, &Error{Pos: t.pos, Msg: "unexpected " + describe(t), Hint: allowedHint}
	}
	if v == 0 {
		v = 0 // normalise -0
	}
	return v, nil
}

type parser struct {
	toks  []token
	i     int
	depth int
}

func (p *parser) peek() token { return p.toks[p.i] }

func (p *parser) next() token {
	t := p.toks[p.i]
	if t.kind != tokEOF {
		p.i++
	}
	return t
}

// binary operator precedences; ^ is handled in power because it binds
// tighter than unary minus on its left (-2^2 = -4) and is right-associative.
func precedence(t token) int {
	if t.kind != tokOp {
		return 0
	}
	switch t.op {
	case '+', '-':
		return 1
	case '*', '/':
		return 2
	}
	return 0
}

// expr parses operands joined by binary operators of at least minPrec
// (precedence climbing; all of + - * / are left-associative).
func (p *parser) expr(minPrec int) (float64, error) {
	lhs, err := p.unary()
	if err != nil {
		return 0, err
	}
	for {
		t := p.peek()
		prec := precedence(t)
		if prec == 0 || prec < minPrec {
			return lhs, nil
		}
		p.next()
		rhs, err := p.expr(prec + 1)
		if err != nil {
			return 0, err
		}
		lhs, err = apply(t, lhs, rhs)
		if err != nil {
			return 0, err
		}
	}
}

func apply(t token, a, b float64) (float64, error) {
	var v float64
	switch t.op {
	case '+':
		v = a + b
	case '-':
		v = a - b
	case '*':
		v = a * b
	case '/':
		if b == 0 {
			return 0, &Error{Pos: t.pos, Msg: "division by zero"}
		}
		v = a / b
	case '^':
		v = math.Pow(a, b)
	}
	return finite(v, t.pos, "'"+t.text+"'")
}

func finite(v float64, pos int, what string) (float64, error) {
	if math.IsNaN(v) {
		return 0, &Error{Pos: pos, Msg: fmt.Sprintf("%s gives no real number", what)}
	}
	if math.IsInf(v, 0) {
		return 0, &Error{Pos: pos, Msg: fmt.Sprintf("%s gives an infinite or too large result", what)}
	}
	return v, nil
}

// enter counts nesting so that "((((…" or "----…1" cannot exhaust the stack.
func (p *parser) enter(t token) error {
	p.depth++
	if p.depth > MaxDepth {
		return &Error{Pos: t.pos, Msg: fmt.Sprintf("expression is nested more than %d levels deep", MaxDepth)}
	}
	return nil
}

func (p *parser) unary() (float64, error) {
	t := p.peek()
	if err := p.enter(t); err != nil {
		return 0, err
	}
	defer func() { p.depth-- }()
	if t.kind == tokOp && (t.op == '-' || t.op == '+') {
		p.next()
		v, err := p.unary()
		if err != nil {
			return 0, err
		}
		if t.op == '-' {
			return -v, nil
		}
		return v, nil
	}
	return p.power()
}

// power is primary ('^' unary)?: the exponent may carry its own sign
// (2^-1) and recursing through unary makes ^ right-associative.
func (p *parser) power() (float64, error) {
	base, err := p.primary()
	if err != nil {
		return 0, err
	}
	t := p.peek()
	if t.kind != tokOp || t.op != '^' {
		return base, nil
	}
	p.next()
	exp, err := p.unary()
	if err != nil {
		return 0, err
	}
	return apply(t, base, exp)
}

func (p *parser) primary() (float64, error) {
	t := p.next()
	switch t.kind {
	case tokNum:
		return t.num, nil
	case tokIdent:
		name := strings.ToLower(t.text)
		if f, ok := functions[name]; ok {
			return p.call(t, name, f)
		}
		if c, ok := constants[name]; ok {
			return c, nil
		}
		return 0, &Error{Pos: t.pos, Msg: fmt.Sprintf("unknown name '%s'", t.text), Hint: allowedHint}
	case tokOp:
		if t.op == '(' {
			v, err := p.expr(0)
			if err != nil {
				return 0, err
			}
			if c := p.next(); c.kind != tokOp || c.op != ')' {
				return 0, &Error{Pos: c.pos, Msg: fmt.Sprintf("expected ')' to close the '(' at %d, found %s", t.pos, describe(c))}
			}
			return v, nil
		}
	case tokEOF:
		return 0, &Error{Pos: t.pos, Msg: "expression ends where a number was expected"}
	case tokBad:
		return 0, &Error{Pos: t.pos, Msg: "unexpected " + describe(t), Hint: allowedHint}
	}
	return 0, &Error{Pos: t.pos, Msg: fmt.Sprintf("unexpected %s where a number was expected", describe(t))}
}

// function is one built-in: its argument count range and its body.
type function struct {
	minArgs, maxArgs int // maxArgs < 0: unlimited
	fn               func(args []float64) (float64, error)
}

var constants = map[string]float64{"pi": math.Pi, "e": math.E}

var functions = map[string]function{
	"sqrt": {1, 1, func(a []float64) (float64, error) {
		return domain(a[0] >= 0, math.Sqrt(a[0]), "sqrt of a negative number")
	}},
	"abs":   {1, 1, func(a []float64) (float64, error) { return math.Abs(a[0]), nil }},
	"floor": {1, 1, func(a []float64) (float64, error) { return math.Floor(a[0]), nil }},
	"ceil":  {1, 1, func(a []float64) (float64, error) { return math.Ceil(a[0]), nil }},
	"ln": {1, 1, func(a []float64) (float64, error) {
		return domain(a[0] > 0, math.Log(a[0]), "ln of a number that is not positive")
	}},
	"log10": {1, 1, func(a []float64) (float64, error) {
		return domain(a[0] > 0, math.Log10(a[0]), "log10 of a number that is not positive")
	}},
	"exp":   {1, 1, func(a []float64) (float64, error) { return math.Exp(a[0]), nil }},
	"round": {1, 2, roundFn},
	"min": {1, -1, func(a []float64) (float64, error) {
		m := a[0]
		for _, v := range a[1:] {
			m = math.Min(m, v)
		}
		return m, nil
	}},
	"max": {1, -1, func(a []float64) (float64, error) {
		m := a[0]
		for _, v := range a[1:] {
			m = math.Max(m, v)
		}
		return m, nil
	}},
}

func domain(ok bool, v float64, msg string) (float64, error) {
	if !ok {
		return 0, errors.New(msg)
	}
	return v, nil
}

// roundFn rounds half away from zero, optionally to n decimal places
// (0 ≤ n ≤ 15, an integer), because "round to cents" is the common ask.
func roundFn(a []float64) (float64, error) {
	if len(a) == 1 {
		return math.Round(a[0]), nil
	}
	n := a[1]
	if n != math.Trunc(n) || n < 0 || n > 15 {
		return 0, fmt.Errorf("round's second argument (decimal places) must be a whole number from 0 to 15, got %s", format(n))
	}
	scaled := a[0] * math.Pow(10, n)
	if math.IsInf(scaled, 0) {
		return a[0], nil // too large to have decimals worth rounding
	}
	return math.Round(scaled) / math.Pow(10, n), nil
}

func (p *parser) call(name token, lower string, f function) (float64, error) {
	if err := p.enter(name); err != nil {
		return 0, err
	}
	defer func() { p.depth-- }()
	if o := p.next(); o.kind != tokOp || o.op != '(' {
		return 0, &Error{Pos: o.pos, Msg: fmt.Sprintf("expected '(' after function %s, found %s", lower, describe(o))}
	}
	var args []float64
	if c := p.peek(); c.kind == tokOp && c.op == ')' {
		p.next()
	} else {
		for {
			v, err := p.expr(0)
			if err != nil {
				return 0, err
			}
			args = append(args, v)
			c := p.next()
			if c.kind == tokOp && c.op == ')' {
				break
			}
			if c.kind != tokOp || c.op != ',' {
				return 0, &Error{Pos: c.pos, Msg: fmt.Sprintf("expected ',' or ')' in the call of %s, found %s", lower, describe(c))}
			}
		}
	}
	if len(args) < f.minArgs || (f.maxArgs >= 0 && len(args) > f.maxArgs) {
		return 0, &Error{Pos: name.pos, Msg: fmt.Sprintf("%s takes %s, got %d", lower, arity(f), len(args))}
	}
	v, err := f.fn(args)
	if err != nil {
		return 0, &Error{Pos: name.pos, Msg: err.Error()}
	}
	return finite(v, name.pos, lower)
}

func arity(f function) string {
	switch {
	case f.maxArgs < 0:
		return fmt.Sprintf("at least %d argument(s)", f.minArgs)
	case f.minArgs == f.maxArgs && f.minArgs == 1:
		return "exactly 1 argument"
	case f.minArgs == f.maxArgs:
		return fmt.Sprintf("exactly %d arguments", f.minArgs)
	}
	return fmt.Sprintf("%d to %d arguments", f.minArgs, f.maxArgs)
}

// format renders a result the shortest way that reads back to the same
// float64.
func format(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
