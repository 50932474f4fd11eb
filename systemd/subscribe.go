package systemd

import (
	"context"
	"errors"
	"fmt"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
)

// UnitEvent is a unit's state at one moment, from a systemd signal.
type UnitEvent struct {
	Unit        string    `json:"unit"`
	ActiveState string    `json:"active_state"`
	SubState    string    `json:"sub_state"`
	At          time.Time `json:"at"`
}

const (
	unitInterface     = "org.freedesktop.systemd1.Unit"
	propertiesChanged = "org.freedesktop.DBus.Properties.PropertiesChanged"
	unitPathPrefix    = "/org/freedesktop/systemd1/unit/"
	// eventBuffer absorbs bursts (a switch moves two units through four
	// states each) while the consumer is busy.
	eventBuffer = 64
)

// unitObjectPath is the D-Bus object of a unit, which exists (systemd loads
// the unit on demand) whether or not the unit is loaded now.
func unitObjectPath(unit string) godbus.ObjectPath {
	return godbus.ObjectPath(unitPathPrefix + sddbus.PathBusEscape(unit))
}

// Subscribe reports the named units' state changes as systemd signals them
// (no polling). The first event per unit is its state at subscription time;
// after that an event comes whenever ActiveState or SubState changes. Events
// of one unit arrive in order; treat each as "the unit's state now", as a
// reconciler does. The channel closes when ctx ends or the connection to
// systemd is lost.
func (m *Manager) Subscribe(ctx context.Context, units ...string) (<-chan UnitEvent, error) {
	if len(units) == 0 {
		return nil, errors.New("subscribe to unit changes: no units named")
	}
	byPath := make(map[godbus.ObjectPath]string, len(units))
	for _, u := range units {
		if err := checkUnitName(u); err != nil {
			return nil, fmt.Errorf("subscribe to changes of unit %q: %w", u, err)
		}
		byPath[unitObjectPath(u)] = u
	}
	wrap := func(err error) error {
		return fmt.Errorf("subscribe to changes of units %v via %s: %w", units, m.where, err)
	}

	signals := make(chan *godbus.Signal, eventBuffer)
	m.sig.Signal(signals)
	var matches [][]godbus.MatchOption
	cleanup := func() {
		m.sig.RemoveSignal(signals)
		if len(matches) > 0 {
			ctx, cancel := context.WithTimeout(context.Background(), CallTimeout)
			defer cancel()
			for _, opts := range matches {
				_ = m.sig.RemoveMatchSignalContext(ctx, opts...)
			}
		}
	}
	if m.bus {
		// On the bus, signals need a match rule, and systemd emits unit
		// changes only while a client is subscribed.
		callCtx, cancel := context.WithTimeout(ctx, CallTimeout)
		defer cancel()
		for path := range byPath {
			opts := []godbus.MatchOption{
				godbus.WithMatchObjectPath(path),
				godbus.WithMatchInterface("org.freedesktop.DBus.Properties"),
				godbus.WithMatchMember("PropertiesChanged"),
			}
			if err := m.sig.AddMatchSignalContext(callCtx, opts...); err != nil {
				cleanup()
				return nil, wrap(fmt.Errorf("add match rule for %s: %w", path, err))
			}
			matches = append(matches, opts)
		}
		if err := m.subscribeManager(callCtx); err != nil {
			cleanup()
			return nil, wrap(err)
		}
	}

	// The current state, read after the signal channel is registered, so no
	// change falls between the snapshot and the first signal.
	last := make(map[string]UnitEvent, len(units))
	var initial []UnitEvent
	for _, u := range units {
		st, err := m.Unit(ctx, u)
		if err != nil {
			cleanup()
			return nil, wrap(err)
		}
		ev := UnitEvent{Unit: u, ActiveState: st.ActiveState, SubState: st.SubState, At: time.Now()}
		last[u] = ev
		initial = append(initial, ev)
	}

	out := make(chan UnitEvent, eventBuffer+len(units))
	for _, ev := range initial {
		out <- ev
	}
	go func() {
		defer close(out)
		defer cleanup()
		for {
			select {
			case <-ctx.Done():
				return
			case sig, ok := <-signals:
				if !ok {
					return // connection closed
				}
				unit, ok := byPath[sig.Path]
				if !ok {
					continue
				}
				ev, ok := unitEventFromSignal(unit, sig, last[unit])
				if !ok {
					continue
				}
				last[unit] = ev
				select {
				case out <- ev:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out, nil
}

// subscribeManager asks systemd (once per Manager) to emit unit signals on
// the bus.
func (m *Manager) subscribeManager(ctx context.Context) error {
	m.subscribeMu.Lock()
	defer m.subscribeMu.Unlock()
	if m.subscribed {
		return nil
	}
	obj := m.sig.Object("org.freedesktop.systemd1", "/org/freedesktop/systemd1")
	if err := obj.CallWithContext(ctx, "org.freedesktop.systemd1.Manager.Subscribe", 0).Store(); err != nil {
		return fmt.Errorf("call Manager.Subscribe: %w", err)
	}
	m.subscribed = true
	return nil
}

// unitEventFromSignal turns a PropertiesChanged signal of the Unit interface
// into an event, if it changes ActiveState or SubState compared to prev.
// Anything malformed is ignored: signals come from outside.
func unitEventFromSignal(unit string, sig *godbus.Signal, prev UnitEvent) (UnitEvent, bool) {
	if sig == nil || sig.Name != propertiesChanged || len(sig.Body) < 2 {
		return UnitEvent{}, false
	}
	if iface, _ := sig.Body[0].(string); iface != unitInterface {
		return UnitEvent{}, false
	}
	changed, ok := sig.Body[1].(map[string]godbus.Variant)
	if !ok {
		return UnitEvent{}, false
	}
	ev := UnitEvent{Unit: unit, ActiveState: prev.ActiveState, SubState: prev.SubState, At: time.Now()}
	seen := false
	if v, ok := changed["ActiveState"]; ok {
		if s, ok := v.Value().(string); ok {
			ev.ActiveState, seen = s, true
		}
	}
	if v, ok := changed["SubState"]; ok {
		if s, ok := v.Value().(string); ok {
			ev.SubState, seen = s, true
		}
	}
	if !seen || (ev.ActiveState == prev.ActiveState && ev.SubState == prev.SubState) {
		return UnitEvent{}, false
	}
	return ev, true
}
