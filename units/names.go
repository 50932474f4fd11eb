package units

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// ClientText checks a model name that gpuhost writes into a coding agent's
// config file (opencode.json, Claude Code's settings, Codex's config.toml):
// opencode expands {env:…} and {file:…} in every string of its file, and
// shells and systemd expand $, so a name holding '{', '}', '$' or a control
// character could make a client read a file or an environment variable
// into its model id. Such names are refused at config load and left out
// when a daemon reports them.
func ClientText(v string) error {
	if !utf8.ValidString(v) {
		return fmt.Errorf("%q is not valid UTF-8", v)
	}
	for _, r := range v {
		switch {
		case unicode.IsControl(r):
			return fmt.Errorf("%q contains the control character %U", v, r)
		case r == '{' || r == '}' || r == '$':
			return fmt.Errorf("%q contains %q, which coding agents expand in their config files (opencode's {env:…} and {file:…}); model names are written there", v, r)
		}
	}
	return nil
}

// literalArg checks an extra_args element for characters that look like an
// expansion that never happens: the words reach vLLM as they are written,
// through the EnvironmentFile and `$GPUHOST_ARGS` (systemd does not expand
// '$' or '%' specifiers inside a variable's value, and there is no shell).
// "$HOME", "%n", "`cmd`" or "a;b" would reach vLLM literally, which is
// never what the operator meant.
func literalArg(v string) error {
	if i := strings.IndexAny(v, "$`%;"); i >= 0 {
		return fmt.Errorf("%q contains %q: extra_args reach vLLM word for word, with no shell and no systemd expansion of $VAR, %%-specifiers, `…` or ';'; write the value itself", v, v[i])
	}
	return nil
}

// VLLMToolCallParsers are the names vLLM registers for --tool-call-parser
// (vllm/tool_parsers/__init__.py, and the older
// vllm/entrypoints/openai/tool_parsers/ of the 0.10–0.11 releases). A
// parser from a plugin (--tool-parser-plugin in extra_args) may have any
// other plain name.
var VLLMToolCallParsers = []string{
	"apertus", "cohere_command3", "cohere_command4", "deepseek_v3", "deepseek_v31",
	"deepseek_v32", "deepseek_v4", "ernie45", "functiongemma", "gemma4", "gigachat3",
	"glm45", "glm47", "granite", "granite-20b-fc", "granite4", "hermes", "hunyuan_a13b",
	"hy_v3", "inkling", "internlm", "jamba", "kimi_k2", "kimi_k3", "lfm2", "llama3_json",
	"llama4_json", "llama4_pythonic", "longcat", "mimo", "minicpm5", "minimax", "minimax_m2",
	"minimax_m3", "mistral", "olmo3", "openai", "phi4_mini_json", "poolside_v1", "pythonic",
	"qwen3_coder", "qwen3_xml", "seed_oss", "solar_open2", "step3", "step3p5",
	"step_deepresearch", "xlam",
}

var pluginParserRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// toolCallParser checks vllm.tool_call_parser: one of vLLM's names, or,
// when extra_args load a --tool-parser-plugin, a plain name.
func toolCallParser(v string, extra []string) error {
	if slices.Contains(VLLMToolCallParsers, v) {
		return nil
	}
	plugin := slices.ContainsFunc(extra, func(a string) bool {
		return a == "--tool-parser-plugin" || strings.HasPrefix(a, "--tool-parser-plugin=")
	})
	if plugin && pluginParserRE.MatchString(v) {
		return nil
	}
	if plugin {
		return fmt.Errorf("%q is not a plain parser name (letters, digits, '_', '.', '-')", v)
	}
	return fmt.Errorf("%q is not one of vLLM's tool call parsers (%s); a parser from a plugin needs --tool-parser-plugin in extra_args", v, strings.Join(VLLMToolCallParsers, ", "))
}
