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
		if ev := r.internalEvidence(m, d); ev != "" {
			out = ruleResult{Importance: 1, Rule: "internal sender (" + d + "; " + ev + ")", Internal: true}
		}
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

// internalEvidence says why a From in the internal domain d can be
// believed, or "" when it cannot: a multi-address From never; with
// TrustFromHeader the header alone; otherwise the topmost
// Authentication-Results of the configured authserv-id must show dmarc
// (header.from), dkim (header.d) or spf (smtp.mailfrom) passing for d or a
// subdomain of it. Only the topmost such header counts: the receiving
// server adds its own on top, and anything below may come from the sender.
func (r Rules) internalEvidence(m *mail.Message, d string) string {
	if m.FromCount > 1 {
		return ""
	}
	if r.TrustFromHeader {
		return "From header only, trust_from_header is on"
	}
	id := strings.ToLower(strings.TrimSpace(r.AuthservID))
	if id == "" {
		return ""
	}
	for _, ar := range m.AuthResults {
		head, rest, _ := strings.Cut(stripComments(ar), ";")
		fields := strings.Fields(head)
		if len(fields) == 0 || strings.ToLower(fields[0]) != id {
			continue
		}
		for _, res := range strings.Split(rest, ";") {
			if ev := passFor(res, d); ev != "" {
				return ev + " per " + id
			}
		}
		return "" // the topmost header of our server decides
	}
	return ""
}

// passFor reads one resinfo ("dkim=pass header.d=example.com") and returns
// it, shortened to method, result and the property that names the domain,
// when it passes for d or a subdomain; else "".
func passFor(res, d string) string {
	fields := strings.Fields(strings.ToLower(res))
	if len(fields) == 0 {
		return ""
	}
	method, result, _ := strings.Cut(fields[0], "=")
	if result != "pass" {
		return ""
	}
	want := map[string]string{"dmarc": "header.from", "dkim": "header.d", "spf": "smtp.mailfrom"}[method]
	if want == "" {
		return ""
	}
	for _, f := range fields[1:] {
		prop, val, ok := strings.Cut(f, "=")
		if !ok || prop != want {
			continue
		}
		dom := val
		if _, after, ok := strings.Cut(val, "@"); ok {
			dom = after
		}
		dom = strings.Trim(dom, `"<>.`)
		if dom == d || strings.HasSuffix(dom, "."+d) {
			return method + "=pass " + prop + "=" + dom
		}
	}
	return ""
}

// stripComments removes RFC 5322 comments "(...)" (nested) outside quotes.
func stripComments(s string) string {
	var b strings.Builder
	depth, inQuote := 0, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' && depth == 0:
			inQuote = !inQuote
		case c == '(' && !inQuote:
			depth++
			continue
		case c == ')' && !inQuote && depth > 0:
			depth--
			continue
		}
		if depth == 0 {
			b.WriteByte(c)
		}
	}
	return b.String()
}
