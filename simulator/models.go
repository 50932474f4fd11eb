package simulator

import (
	"context"
	"log/slog"
	"math"
	"os"
	"sync"
	"time"

	"gpuhost/nvml"
)

// modelManager is the Ollama flavour's scheduler for model residency. One
// model is resident at a time (the reference box's 24 GB card holds one of
// the models gpuhost serves): a request for another model waits until the
// resident one has no requests in flight, unloads it and loads its own. A
// model stays loaded for keep_alive after its last request (0 unloads at
// once, negative keeps it forever). The simulated VRAM claim is written when a
// load begins and removed on unload, so the simulated GPU sees what Ollama's
// runner would allocate.
type modelManager struct {
	loadTime time.Duration
	vramMiB  int
	simDir   string
	pid      int
	log      *slog.Logger
	ctx      context.Context // server lifetime; ends loads on shutdown
	wg       sync.WaitGroup  // running loads

	mu             sync.Mutex
	changed        chan struct{} // closed and replaced on every state change
	loaded         string        // resident model tag, "" if none
	loading        string        // model being loaded, "" if none
	active         int           // requests using the resident model
	keepAlive      time.Duration // the latest request's keep_alive
	expiresAt      time.Time
	unloadWhenIdle bool
	epoch          uint64 // invalidates expiry timers
	timer          *time.Timer
	closed         bool
}

func newModelManager(ctx context.Context, opts Options) *modelManager {
	return &modelManager{
		loadTime:  opts.LoadTime,
		vramMiB:   opts.VRAMMiB,
		simDir:    opts.SimDir,
		pid:       os.Getpid(),
		log:       opts.Logger,
		ctx:       ctx,
		changed:   make(chan struct{}),
		keepAlive: opts.KeepAlive,
	}
}

// broadcastLocked wakes every waiter; callers hold mu.
func (m *modelManager) broadcastLocked() {
	close(m.changed)
	m.changed = make(chan struct{})
}

// wait blocks until the state changes or ctx ends; it releases mu while
// waiting and holds it again on return.
func (m *modelManager) waitLocked(ctx context.Context) error {
	ch := m.changed
	m.mu.Unlock()
	defer m.mu.Lock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-m.ctx.Done():
		return m.ctx.Err()
	}
}

// acquire makes tag the resident model and counts the caller as using it;
// it returns how long the caller waited for a load (Ollama's load_duration).
// Every successful acquire must be paired with release.
func (m *modelManager) acquire(ctx context.Context, tag string) (time.Duration, error) {
	start := time.Now()
	waited := false
	m.mu.Lock()
	defer m.mu.Unlock()
	for {
		if m.closed {
			return time.Since(start), context.Canceled
		}
		switch {
		case m.loaded == tag && m.loading == "":
			m.active++
			m.epoch++ // cancels a pending expiry
			m.unloadWhenIdle = false
			if !waited {
				return 0, nil
			}
			return time.Since(start), nil
		case m.loading != "":
		case m.loaded != "" && m.active > 0:
			// Another model is busy; wait for its requests to finish.
		default:
			if m.loaded != "" {
				m.unloadLocked("evicted for " + tag)
			}
			m.startLoadLocked(tag)
		}
		waited = true
		if err := m.waitLocked(ctx); err != nil {
			return time.Since(start), err
		}
	}
}

// startLoadLocked claims VRAM and loads tag in the background, so a load
// finishes even if the request that started it goes away (as Ollama's does).
func (m *modelManager) startLoadLocked(tag string) {
	m.loading = tag
	m.writeClaimLocked(tag)
	m.log.Info("loading model", "model", tag, "vram_mib", m.vramMiB, "load_time", m.loadTime)
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		err := sleepCtx(m.ctx, m.loadTime)
		m.mu.Lock()
		defer m.mu.Unlock()
		m.loading = ""
		if err != nil || m.closed {
			m.removeClaimLocked()
		} else {
			m.loaded = tag
			m.log.Info("model loaded", "model", tag)
			// Unload even if the requester vanished before using it.
			m.scheduleExpiryLocked(m.keepAlive)
		}
		m.broadcastLocked()
	}()
}

// release ends one request's use of the resident model and applies its
// keep_alive.
func (m *modelManager) release(keepAlive time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.active > 0 {
		m.active--
	}
	m.keepAlive = keepAlive
	if m.active == 0 && m.loaded != "" {
		if keepAlive == 0 || m.unloadWhenIdle {
			m.unloadLocked("keep_alive expired")
		} else {
			m.scheduleExpiryLocked(keepAlive)
		}
	}
	m.broadcastLocked()
}

// load makes tag resident without a request using it (an empty prompt), and
// applies keepAlive; it returns the load duration.
func (m *modelManager) load(ctx context.Context, tag string, keepAlive time.Duration) (time.Duration, error) {
	d, err := m.acquire(ctx, tag)
	if err != nil {
		return d, err
	}
	m.release(keepAlive)
	return d, nil
}

// unload drops tag now if idle, or once its running requests finish
// (keep_alive 0 with an empty prompt).
func (m *modelManager) unload(ctx context.Context, tag string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for m.loading == tag {
		if err := m.waitLocked(ctx); err != nil {
			return err
		}
	}
	if m.loaded != tag {
		return nil
	}
	if m.active > 0 {
		m.unloadWhenIdle = true
		return nil
	}
	m.unloadLocked("requested")
	m.broadcastLocked()
	return nil
}

func (m *modelManager) scheduleExpiryLocked(d time.Duration) {
	m.epoch++
	if m.timer != nil {
		m.timer.Stop()
		m.timer = nil
	}
	if d < 0 {
		m.expiresAt = time.Now().Add(time.Duration(math.MaxInt64))
		return
	}
	m.expiresAt = time.Now().Add(d)
	ep := m.epoch
	m.timer = time.AfterFunc(d, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.epoch == ep && m.active == 0 && m.loaded != "" && !m.closed {
			m.unloadLocked("keep_alive expired")
			m.broadcastLocked()
		}
	})
}

func (m *modelManager) unloadLocked(reason string) {
	m.log.Info("unloading model", "model", m.loaded, "reason", reason)
	m.loaded = ""
	m.unloadWhenIdle = false
	m.epoch++
	if m.timer != nil {
		m.timer.Stop()
		m.timer = nil
	}
	m.removeClaimLocked()
}

func (m *modelManager) writeClaimLocked(tag string) {
	if m.simDir == "" {
		return
	}
	c := nvml.Claim{PID: m.pid, MiB: uint64(max(m.vramMiB, 0)), Name: "ollama " + tag, GPUs: visibleSimGPUs()}
	if err := nvml.WriteClaim(m.simDir, c); err != nil {
		m.log.Error("claim simulated VRAM", "model", tag, "dir", m.simDir, "err", err)
	}
}

func (m *modelManager) removeClaimLocked() {
	if m.simDir == "" {
		return
	}
	if err := nvml.RemoveClaim(m.simDir, m.pid); err != nil {
		m.log.Error("release simulated VRAM", "dir", m.simDir, "err", err)
	}
}

// resident describes the loaded model for /api/ps.
type resident struct {
	tag       string
	expiresAt time.Time
}

func (m *modelManager) snapshot() (resident, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.loaded == "" {
		return resident{}, false
	}
	exp := m.expiresAt
	if m.active > 0 {
		if m.keepAlive < 0 {
			exp = time.Now().Add(time.Duration(math.MaxInt64))
		} else {
			exp = time.Now().Add(m.keepAlive)
		}
	}
	return resident{tag: m.loaded, expiresAt: exp}, true
}

// close ends loads, unloads the resident model and removes the claim.
func (m *modelManager) close() {
	m.mu.Lock()
	m.closed = true
	if m.loaded != "" {
		m.unloadLocked("shutdown")
	}
	m.broadcastLocked()
	m.mu.Unlock()
	m.wg.Wait() // a load in flight sees ctx done and removes its claim
	m.mu.Lock()
	m.removeClaimLocked()
	m.mu.Unlock()
}
