package manager

import (
	"encoding/json"
	"sync"
	"time"

	"github.com/sm-supervisor/sm/ipc"
)

// Heartbeats are the manager's steadiest load: every cluster, every interval
// (512 a second at 512 clusters). Waking the event loop for each cost more
// than the heartbeat's own work (docs/performance.md), so a heartbeat is taken
// in two halves. The connection's goroutine stamps it into the process's
// beatBox; the loop takes the box's contents (drainBeat) on its tick — before
// it judges silence — and before anything that reads them (STATUS, QUIESCED,
// a disconnect, an exit). The reader wakes the loop at once only when a
// heartbeat needs a decision now: the process is not yet steady (its first
// ready heartbeat routes it; a crash-looping slot waits for its recovery),
// watchers want every heartbeat as an event, or resume reports pile up.

// maxPendingResume is how many resume reports a process's box holds before
// its reader wakes the loop to record them.
const maxPendingResume = 4

// beatBox is what a process's heartbeats left for the loop since it last
// looked. Written by the process's connection goroutine, read by the loop.
type beatBox struct {
	mu      sync.Mutex
	n       int // heartbeats since the loop last looked
	at      time.Time
	ready   bool
	payload json.RawMessage
	resume  []json.RawMessage // in arrival order: each report counts
	// steady is set by the loop once nothing a heartbeat says needs it
	// woken: the process is ready and its slot not in a crash loop.
	steady bool
}

// heartbeat is the reader's half of a HEARTBEAT from p.
func (m *Manager) heartbeat(p *proc, f *ipc.Frame, now time.Time) {
	b := &p.beats
	b.mu.Lock()
	b.n++
	b.at, b.payload = now, f.Payload
	b.ready = f.Ready != nil && *f.Ready
	if len(f.Resume) > 0 {
		b.resume = append(b.resume, f.Resume)
	}
	wake := !b.steady || len(b.resume) >= maxPendingResume
	b.mu.Unlock()
	if wake || m.feed.count() > 0 {
		m.post(evHeartbeat{p: p})
	}
}

// evHeartbeat asks the loop to take p's heartbeats now.
type evHeartbeat struct{ p *proc }

func (e evHeartbeat) apply(m *Manager) { m.drainBeat(e.p) }

// drainBeats takes every process's heartbeats.
func (m *Manager) drainBeats() {
	for _, p := range m.procs {
		m.drainBeat(p)
	}
}

// drainBeat is the loop's half of p's heartbeats since it last looked: the
// last one's time, payload and readiness, and every resume report in order.
func (m *Manager) drainBeat(p *proc) {
	b := &p.beats
	b.mu.Lock()
	n, at, ready, payload, resume := b.n, b.at, b.ready, b.payload, b.resume
	b.n, b.resume = 0, nil
	b.mu.Unlock()
	if n == 0 || p.state >= procStopping {
		return
	}
	p.lastBeat = at
	p.beat = payload
	for _, r := range resume {
		m.takeResume(p, r, at)
	}
	m.publishHeartbeat(p, ready, payload, at)
	if ready && p.state == procRegistered {
		p.state = procReady
		p.readyAt = at
		m.touch(p.slot)
		m.log.Info("cluster ready", "cluster", p.cluster, "generation", p.gen, "pid", p.pid(), "after", at.Sub(p.spawned).Round(time.Millisecond))
		m.becameReady(p)
		if m.dep != nil {
			m.dep.Ready(p.ref())
			m.depFed = true
		}
	}
	s := p.slot
	if p.state == procReady && s.current == p && m.policy.Recovered(&s.hist, p.spawned, at) {
		m.touch(s)
		m.log.Info("cluster left crash loop", "cluster", p.cluster, "generation", p.gen)
	}
	steady := p.state == procReady && !(s.current == p && s.hist.CrashLoop)
	b.mu.Lock()
	b.steady = steady
	b.mu.Unlock()
}
