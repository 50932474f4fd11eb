package triage

import (
	"fmt"
	"strings"

	"gpuhost/triage/mail"
)

// ruleResult is which override fired, if any.
type ruleResult struct {
	Importance int
	Rule       string // "" = none fired
	Internal   bool   // the sender is internal (no CRM lookup)
}

// applyRules decides what code can decide about a mail's importance. A
// priority mailbox wins over an internal sender (see the package comment).
func (r Rules) apply(m *mail.Message) ruleResult {
	var out ruleResult
	if d := r.internalDomain(m.From.Addr); d != "" {
		out = ruleResult{Importance: 1, Rule: "internal sender (" + d + ")", Internal: true}
	}
	if addr, header := r.priorityMatch(m); addr != "" {
		out.Importance = 10
		out.Rule = fmt.Sprintf("priority mailbox %s (%s)", addr, header)
	}
	return out
}

// priorityMatch returns the first priority mailbox the mail is addressed to,
// and the header it was found in.
func (r Rules) priorityMatch(m *mail.Message) (addr, header string) {
	if len(r.PriorityMailboxes) == 0 {
		return "", ""
	}
	want := map[string]bool{}
	for _, p := range r.PriorityMailboxes {
		want[normAddr(p)] = true
	}
	check := func(h string, addrs []string) (string, string) {
		for _, a := range addrs {
			if n := normAddr(a); want[n] {
				return n, h
			}
		}
		return "", ""
	}
	lists := []struct {
		header string
		addrs  []string
	}{
		{"To", addrsOf(m.To)},
		{"Cc", addrsOf(m.Cc)},
		{"Delivered-To", m.DeliveredTo},
		{"X-Original-To", m.XOriginalTo},
	}
	for _, l := range lists {
		if a, h := check(l.header, l.addrs); a != "" {
			return a, h
		}
	}
	return "", ""
}

// internalDomain returns the configured domain the sender belongs to
// (exactly or as a subdomain), or "".
func (r Rules) internalDomain(from string) string {
	_, domain, ok := strings.Cut(normAddr(from), "@")
	if !ok || domain == "" {
		return ""
	}
	for _, d := range r.InternalDomains {
		d = strings.ToLower(strings.Trim(strings.TrimSpace(d), "."))
		if d == "" {
			continue
		}
		if domain == d || strings.HasSuffix(domain, "."+d) {
			return d
		}
	}
	return ""
}

func addrsOf(as []mail.Address) []string {
	out := make([]string, 0, len(as))
	for _, a := range as {
		out = append(out, a.Addr)
	}
	return out
}

// normAddr lower-cases an address and drops angle brackets and blanks, so
// "<Boss@Example.com >" from a Delivered-To header matches the config's
// boss@example.com.
func normAddr(a string) string {
	return strings.ToLower(strings.Trim(strings.TrimSpace(a), "<> \t"))
}
