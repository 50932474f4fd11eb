package telegram

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestParseCommand(t *testing.T) {
	tests := []struct {
		text string
		want cmdKind
	}{
		{"/gpu status", cmdStatus},
		{"/gpu   status  ", cmdStatus},
		{"/gpu STATUS", cmdStatus},
		{"/gpu doctor", cmdDoctor},
		{"/gpu help", cmdHelp},
		{"/gpu", cmdHelp},
		{"/start", cmdHelp},
		{"/help", cmdHelp},
		{"/gpu@gpuhost_test_bot status", cmdStatus},
		{"/gpu@GPUHOST_TEST_BOT doctor", cmdDoctor},
		{"/gpu@otherbot status", cmdOtherBot},
		{"/gpu@ status", cmdOtherBot},
		{"/start@otherbot", cmdOtherBot},
		{"/gpu status@gpuhost_test_bot", cmdUnknown}, // not a Telegram form
		{"/gpu status please", cmdUnknown},
		{"/gpu switch coder", cmdUnknown},
		{"/gpu allow 999", cmdUnknown},
		{"/gpu approve ABCDEFGH", cmdUnknown},
		{"/start ABCDEFGH", cmdUnknown},
		{"/gpustatus", cmdNone},
		{"/pair approve ABCDEFGH", cmdNone},
		{"gpu status", cmdNone},
		{" /gpu status", cmdStatus},
		{"add user 999 to the allowlist", cmdNone},
		{"", cmdNone},
		{"   ", cmdNone},
		{"/gpu \xff", cmdNone},
		{"/gpu status " + strings.Repeat("x", maxCommandBytes), cmdNone},
		{"/GPU status", cmdNone},
	}
	for _, tc := range tests {
		if got := parseCommand(tc.text, testBotName); got != tc.want {
			t.Errorf("parseCommand(%q) = %v, want %v", clip(tc.text, 60), got, tc.want)
		}
	}
	// Before getMe answered, an addressed command is never taken as ours.
	if got := parseCommand("/gpu@gpuhost_test_bot status", ""); got != cmdOtherBot {
		t.Errorf("with no bot name, addressed command = %v", got)
	}
}

func FuzzParseCommand(f *testing.F) {
	for _, s := range []string{"/gpu status", "/gpu@gpuhost_test_bot doctor", "/gpu@x", "/start", "/gpu \xff", "@@/gpu", "/gpu@gpuhost_test_bot@x status"} {
		f.Add(s, testBotName)
	}
	f.Fuzz(func(t *testing.T, text, name string) {
		got := parseCommand(text, name)
		if got < cmdNone || got > cmdUnknown {
			t.Fatalf("parseCommand(%q) = %d, out of range", text, got)
		}
		if got != parseCommand(text, name) {
			t.Fatal("not deterministic")
		}
		fields := strings.Fields(text)
		// Only texts starting with one of our commands are commands at all.
		if got != cmdNone {
			if len(fields) == 0 || !(strings.HasPrefix(fields[0], "/gpu") || strings.HasPrefix(fields[0], "/start") || strings.HasPrefix(fields[0], "/help")) {
				t.Fatalf("parseCommand(%q) = %v for a non-command", text, got)
			}
			if !utf8.ValidString(text) || len(text) > maxCommandBytes {
				t.Fatalf("parseCommand accepted invalid or long text %q", text)
			}
		}
		// Status and doctor need exactly two words, the second one of ours.
		if got == cmdStatus || got == cmdDoctor {
			sub := strings.ToLower(fields[1])
			if len(fields) != 2 || (sub != "status" && sub != "doctor") {
				t.Fatalf("parseCommand(%q) = %v", text, got)
			}
		}
	})
}
