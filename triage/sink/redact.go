package sink

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
)

// redact removes a token from s: raw, URL-escaped, and (for a Telegram
// token "123:secret") its secret half alone.
func redact(s, token string) string {
	if token == "" {
		return s
	}
	secrets := []string{token, url.PathEscape(token), url.QueryEscape(token)}
	if _, secret, ok := strings.Cut(token, ":"); ok && len(secret) >= 8 {
		secrets = append(secrets, secret)
	}
	for _, sec := range secrets {
		s = strings.ReplaceAll(s, sec, "<redacted>")
	}
	return s
}

// scrub returns err with the token removed from its text. errors.Is and
// errors.As still reach the sentinels and typed errors inside (context
// errors, slack.SlackErrorResponse, bot.ErrorForbidden); Unwrap is not
// offered, so the unredacted text cannot be printed through it.
func scrub(err error, token string) error {
	if err == nil {
		return nil
	}
	return &scrubbedError{msg: redact(err.Error(), token), inner: err}
}

type scrubbedError struct {
	msg   string
	inner error
}

func (e *scrubbedError) Error() string        { return e.msg }
func (e *scrubbedError) Is(target error) bool { return errors.Is(e.inner, target) }
func (e *scrubbedError) As(target any) bool   { return errors.As(e.inner, target) }

// waitRetry sleeps d before the one retry after a rate limit, unless ctx
// ends first or its deadline comes before the wait would be over: waiting
// for an answer that can no longer be used only delays the caller's error.
func waitRetry(ctx context.Context, d time.Duration) error {
	d = max(d, 0)
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d {
		return fmt.Errorf("rate limited: retry after %s is past the deadline", d)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return fmt.Errorf("rate limited: waiting %s to retry: %w", d, context.Cause(ctx))
	case <-t.C:
		return nil
	}
}
