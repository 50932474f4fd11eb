package config

import (
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"gpuhost/units"
)

// Lane is one GPU set that profiles are placed on, with those profiles. A
// box runs one backend per lane at a time; lanes on disjoint GPUs serve at
// once. The first lane is GPU 0's: the profiles without `gpus`, with
// `gpus: auto` or `gpus: [0]`. It keeps the configured unit names and
// state_dir, so a box whose profiles all run on GPU 0 is exactly the box it
// was before it had lanes.
type Lane struct {
	// Slot names the lane in unit names and state folders: "" for GPU 0's
	// lane, else "gpu" and the indices joined by '-' ("gpu1", "gpu0-1").
	Slot string
	// GPUs are the NVML indices of the lane (GPU 0's lane: [0]).
	GPUs []int
	// Profiles are the names of the profiles placed on the lane, sorted.
	Profiles []string
}

// Name is the lane as an operator reads it: "GPU 0", "GPU 0+1".
func (l Lane) Name() string {
	words := make([]string, len(l.GPUs))
	for i, g := range l.GPUs {
		words[i] = strconv.Itoa(g)
	}
	return "GPU " + strings.Join(words, "+")
}

// Shares reports whether l and o have a GPU in common: their backends
// then exclude each other.
func (l Lane) Shares(o Lane) bool {
	for _, g := range l.GPUs {
		if slices.Contains(o.GPUs, g) {
			return true
		}
	}
	return false
}

// laneInfo marks a Config made by LaneConfig: the lane it is for and the
// whole box's config.
type laneInfo struct {
	root *Config
	lane Lane
}

// laneKey is the GPU set a profile's lane is keyed by.
func laneKey(p *units.Profile) []int {
	if p.GPUs.Auto || !p.GPUs.Given {
		return []int{0}
	}
	idx := slices.Clone(p.GPUs.Indices)
	sort.Ints(idx)
	return slices.Compact(idx)
}

// slotOf names a GPU set's lane; [0] is the first lane's, "".
func slotOf(gpus []int) string {
	if len(gpus) == 1 && gpus[0] == 0 {
		return ""
	}
	words := make([]string, len(gpus))
	for i, g := range gpus {
		words[i] = strconv.Itoa(g)
	}
	return "gpu" + strings.Join(words, "-")
}

// Lanes lists the box's lanes: GPU 0's first (always, even without
// profiles), then the others in the order of their slot names. A config
// made by LaneConfig has its own lane only.
func (c *Config) Lanes() []Lane {
	if c.lane != nil {
		return []Lane{c.lane.lane}
	}
	bySlot := map[string]*Lane{"": {Slot: "", GPUs: []int{0}}}
	for name, p := range c.Profiles {
		if p == nil {
			continue
		}
		key := laneKey(p)
		slot := slotOf(key)
		l := bySlot[slot]
		if l == nil {
			l = &Lane{Slot: slot, GPUs: key}
			bySlot[slot] = l
		}
		l.Profiles = append(l.Profiles, name)
	}
	slots := make([]string, 0, len(bySlot))
	for s := range bySlot {
		slots = append(slots, s)
	}
	sort.Strings(slots) // "" sorts first
	out := make([]Lane, 0, len(slots))
	for _, s := range slots {
		l := bySlot[s]
		sort.Strings(l.Profiles)
		out = append(out, *l)
	}
	return out
}

// LaneOf returns the lane a profile is placed on.
func (c *Config) LaneOf(profile string) (Lane, bool) {
	for _, l := range c.Lanes() {
		if slices.Contains(l.Profiles, profile) {
			return l, true
		}
	}
	return Lane{}, false
}

// LaneUnit is a backend unit's name in a lane: the configured name in GPU
// 0's lane, else the slot appended ("gpuhost-vllm.service" in lane "gpu1"
// is "gpuhost-vllm-gpu1.service").
func LaneUnit(unit, slot string) string {
	if slot == "" {
		return unit
	}
	return strings.TrimSuffix(unit, ".service") + "-" + slot + ".service"
}

// LaneConfig is the config one lane's switch engine runs with: the lane's
// profiles only, its backend units (LaneUnit) and, beyond GPU 0's lane, a
// state folder of its own below state_dir (lanes/<slot>) for its last
// wanted profile, standby records and environment files. GPU 0's lane of a
// box with one lane is c itself.
func (c *Config) LaneConfig(l Lane) *Config {
	if c.lane != nil {
		return c
	}
	if l.Slot == "" && len(c.Lanes()) == 1 {
		return c
	}
	lc := *c
	lc.lane = &laneInfo{root: c, lane: l}
	lc.Profiles = make(map[string]*units.Profile, len(l.Profiles))
	for _, name := range l.Profiles {
		lc.Profiles[name] = c.Profiles[name]
	}
	if l.Slot != "" {
		lc.StateDir = filepath.Join(c.StateDir, "lanes", l.Slot)
		lc.Backends.VLLM.Unit = LaneUnit(c.Backends.VLLM.Unit, l.Slot)
		lc.Backends.Ollama.Unit = LaneUnit(c.Backends.Ollama.Unit, l.Slot)
	}
	if !slices.Contains(l.Profiles, lc.DefaultProfile) {
		lc.DefaultProfile = ""
	}
	return &lc
}

// Root is the whole box's config: c itself, or the config LaneConfig made
// c from.
func (c *Config) Root() *Config {
	if c.lane != nil {
		return c.lane.root
	}
	return c
}

// UsesBackend reports whether the config has a unit of backend b: GPU 0's
// lane always has both (the names a box had before lanes); another lane
// only those its profiles run on.
func (c *Config) UsesBackend(b units.Backend) bool {
	if c.lane == nil || c.lane.lane.Slot == "" {
		return true
	}
	for _, p := range c.Profiles {
		if p != nil && p.Backend == b {
			return true
		}
	}
	return false
}

// lanesValidate checks what several lanes add: a profile placed by `auto`
// could land on another lane's GPU, so auto needs a box of one lane; an
// adopted unit is the operator's one unit, so it serves GPU 0's lane only;
// and profiles of different lanes may run at once, so they need ports of
// their own.
func (c *Config) lanesValidate(add func(key, format string, args ...any)) {
	lanes := c.Lanes()
	if len(lanes) < 2 {
		return
	}
	var names []string
	for _, l := range lanes[1:] {
		names = append(names, fmt.Sprintf("%s (%s)", l.Name(), strings.Join(l.Profiles, ", ")))
	}
	for _, name := range c.ProfileNames() {
		if p := c.Profiles[name]; p != nil && p.GPUs.Auto {
			add("profiles."+name+".gpus", "auto places a profile at switch time, which only a box whose profiles share GPU 0 allows; profiles also run on %s: name this profile's GPUs", strings.Join(names, ", "))
		}
	}
	for _, b := range []struct {
		key string
		cfg BackendConfig
		be  units.Backend
	}{{"backends.vllm.adopt", c.Backends.VLLM, units.VLLM}, {"backends.ollama.adopt", c.Backends.Ollama, units.Ollama}} {
		if !b.cfg.Adopt {
			continue
		}
		for _, l := range lanes[1:] {
			if c.LaneConfig(l).UsesBackend(b.be) {
				add(b.key, "an adopted unit runs on GPU 0's lane only, and %s profiles are placed on %s; render gpuhost's units (adopt: false) or place them on GPU 0", b.be, l.Name())
			}
		}
	}
	owner := map[int]string{}
	for _, l := range lanes {
		for _, name := range l.Profiles {
			p := c.Profiles[name]
			if p.Port <= 0 {
				continue
			}
			if prev, ok := owner[p.Port]; ok && prev != l.Slot {
				add("profiles."+name+".port", "port %d is used on %s and on another lane; profiles on different GPUs serve at once and need ports of their own", p.Port, l.Name())
				continue
			}
			owner[p.Port] = l.Slot
		}
	}
}
