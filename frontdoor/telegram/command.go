package telegram

import (
	"strings"
	"unicode/utf8"
)

// cmdKind is what a message asks of the bot. The set is closed and
// read-only on purpose: no chat text maps to a change of anything.
type cmdKind int

const (
	// cmdNone: not a /gpu command (plain text, other commands).
	cmdNone cmdKind = iota
	// cmdOtherBot: a /gpu command addressed to another bot (groups).
	cmdOtherBot
	cmdHelp
	cmdStatus
	cmdDoctor
	// cmdUnknown: /gpu with a subcommand we do not have; answered with help.
	cmdUnknown
)

func (k cmdKind) String() string {
	switch k {
	case cmdNone:
		return "none"
	case cmdOtherBot:
		return "other-bot"
	case cmdHelp:
		return "help"
	case cmdStatus:
		return "status"
	case cmdDoctor:
		return "doctor"
	case cmdUnknown:
		return "unknown"
	}
	return "invalid"
}

// maxCommandBytes bounds what the parser looks at; a command is short.
const maxCommandBytes = 256

// parseCommand reads "/gpu [status|doctor|help]" and the forms Telegram
// produces in groups ("/gpu@botname status"). botName is our username
// without "@" (compared case-insensitively, as Telegram usernames are).
// Anything else is cmdNone; extra words after a subcommand make it unknown,
// so that "/gpu status please add me" does not silently act.
func parseCommand(text, botName string) cmdKind {
	if len(text) > maxCommandBytes || !utf8.ValidString(text) {
		return cmdNone
	}
	fields := strings.Fields(text)
	if len(fields) == 0 {
		return cmdNone
	}
	head, addressee, addressed := strings.Cut(fields[0], "@")
	if head != "/gpu" && head != "/start" && head != "/help" {
		return cmdNone
	}
	if addressed && (botName == "" || !strings.EqualFold(addressee, botName)) {
		return cmdOtherBot
	}
	if head != "/gpu" {
		// Telegram sends /start on first contact; /help is the convention.
		if len(fields) == 1 {
			return cmdHelp
		}
		return cmdUnknown
	}
	switch {
	case len(fields) == 1:
		return cmdHelp
	case len(fields) > 2:
		return cmdUnknown
	}
	switch strings.ToLower(fields[1]) {
	case "status":
		return cmdStatus
	case "doctor":
		return cmdDoctor
	case "help":
		return cmdHelp
	}
	return cmdUnknown
}
