package calc

import (
	"context"
	"fmt"
	"gpuhost/mcp/connector"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
)

func init() { connector.Register("calc", func() connector.Connector { return &builder{} }) }

// config is the calc section; it has no settings, but decoding it still
// rejects a misspelt key instead of silently ignoring it.
type config struct{}

type builder struct{}

// Result is what calc_evaluate returns: the expression as given and the
// number, plus the number as text so that a model does not have to trust a
// JSON float rendering.
type Result struct {
	Expression string  `json:"expression"`
	Result     float64 `json:"result"`
	Text       string  `json:"text"`
}

// Build returns the single calc_evaluate tool.
func (c *builder) Build(env connector.Env) ([]connector.Tool, error) {
	var cfg config
	if err := connector.DecodeConfig(env, &cfg); err != nil {
		return nil, err
	}
	def := mcpgo.NewTool("calc_evaluate",
		mcpgo.WithDescription("Evaluate an arithmetic expression exactly as a calculator would (it is parsed, never executed as code). "+
			"Supports + - * / ^ (also × ÷ −), parentheses, unary minus, decimals and 1e3 notation, "+
			"functions sqrt abs round(x[,digits]) floor ceil min max ln log10 exp, constants pi and e. "+
			"Use it instead of doing arithmetic in your head."),
		mcpgo.WithReadOnlyHintAnnotation(true),
		mcpgo.WithDestructiveHintAnnotation(false),
		mcpgo.WithIdempotentHintAnnotation(true),
		mcpgo.WithOpenWorldHintAnnotation(false),
		mcpgo.WithSchemaAdditionalProperties(false),
		mcpgo.WithString("expression", mcpgo.Required(), mcpgo.MaxLength(MaxLength),
			mcpgo.Description("The expression, e.g. (17.5 * 3 - 2) / 4 or sqrt(2)^2 or round(100 / 7, 2)")),
	)
	return []connector.Tool{{Def: def, Handler: evaluate}}, nil
}

func evaluate(_ context.Context, args connector.Args) (any, error) {
	expr := args.String("expression")
	v, err := Evaluate(expr)
	if err != nil {
		return nil, fmt.Errorf("cannot evaluate the expression: %w", err)
	}
	return Result{Expression: expr, Result: v, Text: format(v)}, nil
}
