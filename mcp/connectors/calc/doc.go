// Package calc is the MCP calculator connector: one tool, calc_evaluate,
// backed by a hand-written tokenizer and recursive-descent parser
// (precedence climbing). It exists so that a model can do exact arithmetic
// without any path to code execution: there is no eval, no variables and
// no statements, so "1 + 1; process.exit()" is a syntax error with its
// position. Length (MaxLength) and nesting (MaxDepth) are capped, and
// division by zero, NaN and infinite results are errors.
//
// Enable it with an empty section in gpuhost.yaml (it has no settings):
//
//	mcp:
//	  connectors:
//	    calc: {}
package calc
