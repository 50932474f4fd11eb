package sink

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/go-telegram/bot"
	"github.com/slack-go/slack"
)

func TestRetryAfter(t *testing.T) {
	for _, tt := range []struct {
		name string
		err  error
		want time.Duration
	}{
		{"nil", nil, 0},
		{"other error", errors.New("slack: 503"), 0},
		{"slack 429", fmt.Errorf("post: %w", &slack.RateLimitedError{RetryAfter: 3 * time.Second}), 3 * time.Second},
		{"slack 429 behind the token scrubber", scrub(fmt.Errorf("post: %w", &slack.RateLimitedError{RetryAfter: 2 * time.Second}), "xoxb-secret"), 2 * time.Second},
		{"telegram 429", fmt.Errorf("chat 1: %w", &bot.TooManyRequestsError{Message: "Too Many Requests", RetryAfter: 7}), 7 * time.Second},
		{"negative", &bot.TooManyRequestsError{RetryAfter: -1}, 0},
		{"deadline while waiting", fmt.Errorf("%w (%w)", &slack.RateLimitedError{RetryAfter: time.Minute}, context.DeadlineExceeded), time.Minute},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := RetryAfter(tt.err); got != tt.want {
				t.Errorf("RetryAfter = %v, want %v", got, tt.want)
			}
		})
	}
}
