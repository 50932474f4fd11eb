package panel

import (
	"cmp"
	"slices"
	"strconv"
	"strings"

	"gpuhost/api"
	"gpuhost/nvml"
	"gpuhost/units"
)

// gpuSet is where a profile runs, as the panel groups and labels it: the
// profiles page has one group of Switch buttons per set, the Activity page
// a column and a filter.
type gpuSet struct {
	// Key is the set in a URL and a data attribute: "0", "0,1", "auto".
	Key string
	// Label is the set in words: "GPU 0", "GPU 0+1", "auto".
	Label   string
	Indices []int
	Auto    bool
}

// autoSetKey is the key (and the ?gpus= value) of `gpus: auto`.
const autoSetKey = "auto"

// setOf is the GPU set of a configured profile; unset is GPU 0, as the
// switch places it.
func setOf(p *units.Profile) gpuSet {
	if p.GPUs.Auto {
		return gpuSet{Key: autoSetKey, Label: "auto", Auto: true}
	}
	idx := p.GPUs.Resolved()
	words := make([]string, len(idx))
	for i, d := range idx {
		words[i] = strconv.Itoa(d)
	}
	return gpuSet{Key: strings.Join(words, ","), Label: "GPU " + strings.Join(words, "+"), Indices: idx}
}

// compareSets orders sets as the profiles page shows them: single GPUs by
// index, then larger sets, then auto.
func compareSets(a, b gpuSet) int {
	if a.Auto != b.Auto {
		if a.Auto {
			return 1
		}
		return -1
	}
	if c := cmp.Compare(len(a.Indices), len(b.Indices)); c != 0 {
		return c
	}
	return slices.Compare(a.Indices, b.Indices)
}

// profileSets are the configured profiles' GPU sets by profile name.
func (p *Panel) profileSets() map[string]gpuSet {
	out := make(map[string]gpuSet, len(p.daemon.Profiles))
	for name, prof := range p.daemon.Profiles {
		if prof != nil {
			out[name] = setOf(prof)
		}
	}
	return out
}

// distinctSets are the GPU sets the profiles use, in compareSets order.
func distinctSets(sets map[string]gpuSet) []gpuSet {
	var out []gpuSet
	for _, s := range sets {
		if !slices.ContainsFunc(out, func(o gpuSet) bool { return o.Key == s.Key }) {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, compareSets)
	return out
}

// profileGroup is one GPU set's profiles on the profiles page.
type profileGroup struct {
	Set  gpuSet
	Rows []profileRow
}

// groupRows puts the profile rows under their GPU sets, keeping the rows'
// order within a set. A profile the panel has no config for (none in
// practice) counts as GPU 0's, where the switch would put it.
func groupRows(rows []profileRow, sets map[string]gpuSet) []profileGroup {
	var groups []profileGroup
	for _, r := range rows {
		s, ok := sets[r.Name]
		if !ok {
			s = setOf(&units.Profile{})
		}
		i := slices.IndexFunc(groups, func(g profileGroup) bool { return g.Set.Key == s.Key })
		if i < 0 {
			groups = append(groups, profileGroup{Set: s})
			i = len(groups) - 1
		}
		groups[i].Rows = append(groups[i].Rows, r)
	}
	slices.SortStableFunc(groups, func(a, b profileGroup) int { return compareSets(a.Set, b.Set) })
	return groups
}

// laneView is one GPU on the dashboard: the card's facts (Device), who
// holds memory on it and the profiles placed there.
type laneView struct {
	Index     int
	ShortUUID string
	UUID      string
	Device    nvml.Device
	// Holders are who holds memory, in words: "llama (gpuhost-ollama.service) 6200 MiB".
	Holders []string
	// Profiles are the profiles placed on this GPU by the config (auto
	// ones are not: they go where they fit at the switch).
	Profiles []string
	// First is the lane of GPU 0, whose gauges /live keeps current
	// through the data-live attributes (as on a one-GPU box).
	First bool
	// Serving are the lanes (GPU sets) this GPU belongs to, with what
	// each serves now; empty on a box of one lane.
	Serving []laneServing
}

// lanes are the dashboard's GPU lanes: one per device the snapshot
// reports, with the holders and placements of /api/status's gpus.
func lanes(st api.Status) []laneView {
	if st.GPU == nil {
		return nil
	}
	byIndex := map[int]api.GPUStatus{}
	for _, g := range st.GPUs {
		byIndex[g.Index] = g
	}
	var out []laneView
	for _, d := range st.GPU.Devices {
		l := laneView{Index: d.Index, ShortUUID: api.ShortUUID(d.UUID), UUID: d.UUID, Device: d, First: len(out) == 0,
			Serving: servingOn(st.State, d.Index)}
		if g, ok := byIndex[d.Index]; ok {
			l.Holders = holderWords(g.Holders)
			l.Profiles = g.Profiles
		}
		out = append(out, l)
	}
	return out
}

// holderWords words each process holding memory on a GPU, as
// api.GPUStatus.Line does.
func holderWords(hs []api.GPUHolder) []string {
	var out []string
	for _, h := range hs {
		who := "pid " + strconv.Itoa(h.PID) + " " + h.Name + " (not gpuhost's)"
		if h.Unit != "" {
			who = h.Unit
			if h.Profile != "" {
				who = h.Profile + " (" + h.Unit + ")"
			}
		}
		out = append(out, who+" "+strconv.FormatUint(h.UsedMiB, 10)+" MiB")
	}
	return out
}

// laneGPUs are the GPUs of the lane a profile switches in: GPU 0's for a
// profile without gpus or with auto (as config.Lanes places them), else
// its set in index order. A switch to it stops the profiles of every lane
// sharing one of these GPUs, and its VRAM-release step reports the first.
func laneGPUs(p *units.Profile) []int {
	if p == nil || p.GPUs.Auto || !p.GPUs.Given || len(p.GPUs.Indices) == 0 {
		return []int{0}
	}
	idx := slices.Clone(p.GPUs.Indices)
	slices.Sort(idx)
	return slices.Compact(idx)
}

// gpuKey is a GPU list as a data attribute: "0", "0,1".
func gpuKey(idx []int) string {
	words := make([]string, len(idx))
	for i, d := range idx {
		words[i] = strconv.Itoa(d)
	}
	return strings.Join(words, ",")
}

// switchRunning reports whether the switch id runs now on any lane of st.
func switchRunning(st api.State, id string) bool {
	if id == "" {
		return false
	}
	if st.SwitchID == id {
		return true
	}
	return slices.ContainsFunc(st.Lanes, func(l api.State) bool { return l.SwitchID == id })
}

// runningSwitch is the id of a switch under way: GPU 0's lane's, else the
// first other lane's; "" when none runs.
func runningSwitch(st api.State) string {
	if st.Phase == api.PhaseSwitching && st.SwitchID != "" {
		return st.SwitchID
	}
	for _, l := range st.Lanes {
		if l.Phase == api.PhaseSwitching && l.SwitchID != "" {
			return l.SwitchID
		}
	}
	return ""
}

// laneServing is one lane on a GPU's card: what it serves now.
type laneServing struct {
	// Lane names the lane ("GPU 0+1"); Line is api.LaneLine's words.
	Lane string
	Line string
	// Class colours the line: active, switching, idle, failed (its wanted
	// profile does not serve).
	Class string
	// SwitchID is the switch under way on the lane, whose progress the
	// card links to; "" when none runs.
	SwitchID string
}

// servingOn are the lanes that include GPU index, the GPU's own lane
// first, then the larger sets (as the profiles page orders them): a GPU
// of a tensor-parallel set shows its single-GPU lane and the set's. None
// on a box of one lane.
func servingOn(st api.State, index int) []laneServing {
	var on []api.State
	for _, l := range st.Lanes {
		if slices.Contains(l.GPUs, index) {
			on = append(on, l)
		}
	}
	slices.SortStableFunc(on, func(a, b api.State) int {
		return compareSets(gpuSet{Indices: a.GPUs}, gpuSet{Indices: b.GPUs})
	})
	var out []laneServing
	for _, l := range on {
		class := string(l.Phase)
		if l.NotServing != "" {
			class = string(api.PhaseFailed)
		}
		ls := laneServing{Lane: l.Lane, Line: api.LaneLine(l), Class: class}
		if l.Phase == api.PhaseSwitching {
			ls.SwitchID = l.SwitchID
		}
		out = append(out, ls)
	}
	return out
}
