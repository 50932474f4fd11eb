package sink

import (
	"errors"
	"time"

	"github.com/go-telegram/bot"
	"github.com/slack-go/slack"
)

// RetryAfter is how long the service behind a sink asked to be left alone,
// read from an error its Post or Posted returned (Slack's or Telegram's
// 429 with Retry-After, after the sink's own one retry); 0 when the error
// carries no such request. The worker keeps it across polls.
func RetryAfter(err error) time.Duration {
	var rl *slack.RateLimitedError
	if errors.As(err, &rl) {
		return max(rl.RetryAfter, 0)
	}
	var tm *bot.TooManyRequestsError
	if errors.As(err, &tm) {
		return max(time.Duration(tm.RetryAfter)*time.Second, 0)
	}
	return 0
}
