package telegram

import (
	"fmt"
	"math"
	"strings"
	"time"
	"unicode/utf16"
	"unicode/utf8"

	"gpuhost/api"
	"gpuhost/units"
)

// maxMessageUnits is Telegram's limit on a message's text, counted in
// UTF-16 code units; longer texts are refused with 400 "message is too long".
const maxMessageUnits = 4096

// helpText lists what the bot does. It also says that access is managed on
// the machine, because a paired user's "add my colleague" cannot work.
const helpText = `gpuhost bot — read-only commands:
/gpu status — GPU memory, utilisation, temperature, power, active profile, endpoint health, last switch
/gpu doctor — failing and warning checks of gpuhost doctor
/gpu help — this text
/ask <question> — the box's own model answers, using read-only tools (when the agent is enabled)

Notifications: switch done or failed, backend unit failed, doctor turned red.
Access is managed on the machine only: gpuhost pair list | approve CODE | revoke ID.`

// pairingText is all a sender who is not allowlisted ever gets: the code and
// how the operator approves it. Nothing about the machine.
func pairingText(code string, ttl time.Duration) string {
	return fmt.Sprintf("This bot is private. To get access, ask the operator of this machine to run:\n\n"+
		"gpuhost pair approve %s\n\nThe code expires in %s.", code, humanDuration(ttl))
}

// reminderText repeats a live code once.
func reminderText(code string, left time.Duration) string {
	return fmt.Sprintf("Your pairing code is still %s (expires in %s). Ask the operator of this machine to run:\n\n"+
		"gpuhost pair approve %s", code, humanDuration(left), code)
}

// health is the outcome of probing the active backend's endpoint.
type health struct {
	Checked bool
	OK      bool
	URL     string
	Detail  string // "200 in 12 ms" or the error
}

// memBar renders used/total as ten cells, e.g. "▓▓▓▓▓▓▓░░░".
func memBar(used, total uint64) string {
	const cells = 10
	n := 0
	if total > 0 {
		n = int(math.Round(float64(used) / float64(total) * cells))
		n = min(max(n, 0), cells)
	}
	return strings.Repeat("▓", n) + strings.Repeat("░", cells-n)
}

func gib(mib uint64) string { return fmt.Sprintf("%.1f", float64(mib)/1024) }

// formatStatus is the one compact /gpu status message.
func formatStatus(st api.Status, h health, now time.Time) string {
	var b strings.Builder
	s := st.State
	switch s.Phase {
	case api.PhaseActive:
		fmt.Fprintf(&b, "🟢 %s", s.Profile)
		if p, ok := profileInfo(st, s.Profile); ok {
			fmt.Fprintf(&b, " · %s · %s", p.Backend, st.ActiveServedName())
		} else if s.Backend != "" {
			fmt.Fprintf(&b, " · %s", s.Backend)
		}
	case api.PhaseSwitching:
		fmt.Fprintf(&b, "🔄 switching to %s", s.Target)
		if s.Step != "" {
			fmt.Fprintf(&b, " (step %s)", s.Step)
		}
	case api.PhaseFailed:
		fmt.Fprintf(&b, "🔴 failed: %s", clip(s.Error, 300))
	default:
		b.WriteString("⚪ idle: no backend running")
	}
	b.WriteString("\n")
	// Several GPU sets (lanes) serve at once: the line above is GPU 0's
	// lane, these say what serves on each.
	for _, l := range s.Lanes {
		fmt.Fprintf(&b, "%s %s\n", laneIcon(l), clip(api.LaneLine(l), 300))
	}

	switch {
	case st.GPU == nil:
		fmt.Fprintf(&b, "GPU: unavailable (%s)\n", clip(st.GPUError, 200))
	default:
		d, ok := st.GPU.Device0()
		if !ok {
			b.WriteString("GPU: none reported\n")
			break
		}
		b.WriteString(d.Name)
		if st.GPU.Backend == "sim" {
			b.WriteString(" (simulated)")
		}
		b.WriteString("\n")
		fmt.Fprintf(&b, "%s %s/%s GiB\n", memBar(d.MemoryUsedMiB, d.MemoryTotalMiB), gib(d.MemoryUsedMiB), gib(d.MemoryTotalMiB))
		fact := func(key, v string) string {
			if _, bad := d.FactErrors[key]; bad {
				return "n/a"
			}
			return v
		}
		power := fmt.Sprintf("%.0f W", d.PowerW)
		if d.PowerLimitW > 0 {
			power = fmt.Sprintf("%.0f/%.0f W", d.PowerW, d.PowerLimitW)
		}
		fmt.Fprintf(&b, "util %s · %s · %s\n",
			fact("utilization_gpu", fmt.Sprintf("%d%%", d.UtilizationGPU)),
			fact("temperature_c", fmt.Sprintf("%d°C", d.TemperatureC)),
			fact("power_w", power))
		if len(st.GPU.Devices) > 1 {
			// Several cards: one line each, with who holds memory on it.
			for _, g := range st.GPUs {
				fmt.Fprintf(&b, "%s\n", clip(g.Line(), 300))
			}
		}
	}

	switch {
	case !h.Checked:
		b.WriteString("endpoint: — (no active backend)\n")
	case h.OK:
		fmt.Fprintf(&b, "endpoint: ✅ %s %s\n", h.URL, h.Detail)
	default:
		fmt.Fprintf(&b, "endpoint: ❌ %s %s\n", h.URL, clip(h.Detail, 200))
	}

	if ls := st.LastSwitch; ls != nil {
		when := humanAge(now.Sub(ls.StartedAt.Add(time.Duration(ls.DurationMS * float64(time.Millisecond)))))
		if ls.OK {
			fmt.Fprintf(&b, "last switch: ✅ %s in %s, %s", ls.Profile, humanDuration(time.Duration(ls.DurationMS*float64(time.Millisecond))), when)
		} else {
			fmt.Fprintf(&b, "last switch: ❌ %s, %s: %s", ls.Profile, when, clip(ls.Error, 300))
		}
	} else {
		b.WriteString("last switch: none since start")
	}
	return truncate(b.String())
}

// laneIcon is a lane's phase at a glance, as the headline's: red while
// its wanted profile does not serve.
func laneIcon(l api.State) string {
	switch {
	case l.NotServing != "" || l.Phase == api.PhaseFailed:
		return "🔴"
	case l.Phase == api.PhaseActive:
		return "🟢"
	case l.Phase == api.PhaseSwitching:
		return "🔄"
	}
	return "⚪"
}

func profileInfo(st api.Status, name string) (api.ProfileInfo, bool) {
	for _, p := range st.Profiles {
		if p.Name == name {
			return p, true
		}
	}
	return api.ProfileInfo{}, false
}

// formatDoctor lists failing and warning checks only, or says all green.
func formatDoctor(rep api.DoctorReport) string {
	var fails, warns []api.DoctorCheck
	for _, c := range rep.Checks {
		switch c.Severity {
		case units.SeverityFail:
			fails = append(fails, c)
		case units.SeverityWarn:
			warns = append(warns, c)
		}
	}
	if len(fails) == 0 && len(warns) == 0 {
		return fmt.Sprintf("✅ doctor: all green (%d checks)", len(rep.Checks))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "doctor: %d failing, %d warning (of %d checks)\n", len(fails), len(warns), len(rep.Checks))
	write := func(icon string, cs []api.DoctorCheck) {
		for _, c := range cs {
			fmt.Fprintf(&b, "\n%s %s", icon, c.ID)
			if c.Profile != "" {
				fmt.Fprintf(&b, " [%s]", c.Profile)
			}
			fmt.Fprintf(&b, ": %s", clip(c.Message, 500))
			if c.Fix != "" {
				fmt.Fprintf(&b, "\n   fix: %s", clip(c.Fix, 300))
			}
		}
	}
	write("❌", fails)
	write("⚠️", warns)
	return truncate(b.String())
}

// clip shortens one field to n runes.
func clip(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n]) + "…"
}

const truncNote = "\n… (truncated; run gpuhost status or gpuhost doctor on the machine for the rest)"

// truncate keeps a message within Telegram's limit, cutting at a rune.
func truncate(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	if utf16Len(s) <= maxMessageUnits {
		return s
	}
	limit := maxMessageUnits - utf16Len(truncNote)
	n := 0
	for i, r := range s {
		w := utf16.RuneLen(r)
		if w < 0 {
			w = 1
		}
		if n+w > limit {
			return s[:i] + truncNote
		}
		n += w
	}
	return s
}

func utf16Len(s string) int {
	n := 0
	for _, r := range s {
		if w := utf16.RuneLen(r); w > 0 {
			n += w
		} else {
			n++
		}
	}
	return n
}

// humanDuration is "850 ms", "12.3 s", "4 min", "2 h".
func humanDuration(d time.Duration) string {
	switch {
	case d < time.Second:
		return fmt.Sprintf("%d ms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.1f s", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%d min", int(d.Round(time.Minute).Minutes()))
	default:
		return fmt.Sprintf("%.1f h", d.Hours())
	}
}

// humanAge is "just now", "5 min ago", "3 h ago", "2 d ago".
func humanAge(d time.Duration) string {
	switch {
	case d < time.Minute:
		return "just now"
	case d < time.Hour:
		return fmt.Sprintf("%d min ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%d h ago", int(d.Hours()))
	default:
		return fmt.Sprintf("%d d ago", int(d.Hours()/24))
	}
}
