package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"gpuhost/agent"
)

// askExitNotAnswered is the exit status of `gpuhost ask` when the loop
// ended without an answer (step cap, budget, deadline, model error, busy),
// so scripts can tell "answered" from "gave up" without parsing text.
const askExitNotAnswered = 1

func newAskCmd() *cobra.Command {
	var asJSON bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   `ask "QUESTION"`,
		Short: "Ask the box's agent; prints every step (model, tool calls, results, errors) as it happens",
		Long: `Sends the question to the daemon's agent loop (POST /api/ask) and prints its
timeline live: each model request, tool call (with arguments) and tool result
(with latency; ✗ marks a failed call), then the answer and why the loop stopped.
With --json every event is one JSON line. Exit status 0 when the agent answered,
1 when it stopped without an answer (step cap, token budget, deadline, model
error, too many questions running), 2 when the daemon could not be asked.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			question := strings.Join(args, " ")
			if strings.TrimSpace(question) == "" {
				return fmt.Errorf("ask: the question is empty")
			}
			c, err := apiClient(cmd)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			out := cmd.OutOrStdout()
			var last agent.Event
			show := func(e agent.Event) error {
				last = e
				if asJSON {
					line, err := json.Marshal(e)
					if err != nil {
						return fmt.Errorf("encode event %d: %w", e.Seq, err)
					}
					_, err = out.Write(append(line, '\n'))
					return err
				}
				_, err := fmt.Fprintln(out, formatAskEvent(e))
				return err
			}
			err = c.Ask(ctx, question, func(stream io.Reader) error { return agent.ReadEvents(stream, show) })
			if err != nil {
				return err
			}
			if last.Reason != agent.StopAnswer {
				return exitError{askExitNotAnswered}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print each event as one JSON line")
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Minute, "give up waiting for the daemon after this long")
	urlFlag(cmd)
	return cmd
}

// formatAskEvent renders one timeline entry as one line (the answer may
// span several): step, kind, tool, arguments, latency, ✗ for a failed
// call.
func formatAskEvent(e agent.Event) string {
	step := "      "
	if e.Step > 0 {
		step = fmt.Sprintf("step %d", e.Step)
	}
	switch e.Kind {
	case agent.EventStart:
		line := "? " + oneLine(e.Text, 200)
		if len(e.Tools) > 0 {
			line += fmt.Sprintf("  [%d tools: %s]", len(e.Tools), oneLine(strings.Join(e.Tools, ", "), 200))
		}
		return line
	case agent.EventModel:
		line := fmt.Sprintf("%s  model        %d+%d tokens", step, e.PromptTokens, e.CompletionTokens)
		if e.LatencyMS > 0 {
			line += fmt.Sprintf("  %s", askMS(e.LatencyMS))
		}
		if e.Model != "" {
			line += "  " + oneLine(e.Model, 60)
		}
		return line
	case agent.EventToolCall:
		return fmt.Sprintf("%s  call         %s %s", step, oneLine(e.Tool, 80), oneLine(e.Arguments, 200))
	case agent.EventToolResult:
		mark := "✓"
		if e.IsError {
			mark = "✗"
		}
		line := fmt.Sprintf("%s  result     %s %s  %s", step, mark, oneLine(e.Tool, 80), askMS(e.LatencyMS))
		if e.IsError {
			line += "  FAILED"
		}
		if e.Result != "" {
			line += "  " + oneLine(e.Result, 160)
		}
		return line
	case agent.EventAnswer:
		return "\n" + strings.TrimSpace(noControls(strings.ToValidUTF8(e.Text, "\uFFFD"), true)) + "\n"
	case agent.EventStop:
		line := "stopped: " + oneLine(e.Reason, 40)
		if e.Text != "" {
			line += " — " + oneLine(e.Text, 300)
		}
		return line
	}
	return fmt.Sprintf("%s  %s", step, oneLine(e.Kind, 40))
}

func askMS(ms float64) string {
	switch {
	case ms <= 0:
		return "–"
	case ms < 10:
		return fmt.Sprintf("%.1f ms", ms)
	case ms < 10000:
		return fmt.Sprintf("%.0f ms", ms)
	}
	return fmt.Sprintf("%.1f s", ms/1000)
}

// oneLine flattens s to one line of at most n runes, so a tool's output
// cannot forge timeline lines or flood the terminal.
func oneLine(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.Join(strings.FieldsFunc(s, func(r rune) bool { return r == '\n' || r == '\r' || r == '\t' }), " ")
	s = noControls(s, false)
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n]) + "…"
}

// noControls drops control characters (terminal escape sequences among
// them), keeping newlines and tabs when multiline.
func noControls(s string, multiline bool) string {
	return strings.Map(func(r rune) rune {
		if multiline && (r == '\n' || r == '\t') {
			return r
		}
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r <= 0x9f) {
			return -1
		}
		return r
	}, s)
}
