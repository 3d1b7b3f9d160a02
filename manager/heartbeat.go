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
	mu    sync.Mutex
	n     int // heartbeats since the loop last looked
	at    time.Time
	ready bool // the last heartbeat's
	// sawReady latches a ready heartbeat until the loop takes it: ready
	// latches (protocol.md), even if a later heartbeat says false.
	sawReady bool
	payload  json.RawMessage
	resume   []json.RawMessage // in arrival order: each report counts
	// steady is set by the loop once nothing a heartbeat says needs it
	// woken: the process is ready and its slot not in a crash loop.
	steady bool
}

// heartbeat is the reader's half of a HEARTBEAT from p.
func (m *Manager) heartbeat(p *proc, f *ipc.Frame, now time.Time) {
	if p.beats.stamp(f, now) || m.feed.count() > 0 {
		m.post(evHeartbeat{p: p})
	}
}

// stamp records a heartbeat and reports whether the loop must take it now.
func (b *beatBox) stamp(f *ipc.Frame, now time.Time) (wake bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.n++
	b.at, b.payload = now, f.Payload
	b.ready = f.Ready != nil && *f.Ready
	b.sawReady = b.sawReady || b.ready
	if len(f.Resume) > 0 {
		b.resume = append(b.resume, f.Resume)
	}
	return !b.steady || len(b.resume) >= maxPendingResume
}

// beats is what take hands the loop: the heartbeats since it last looked.
type beats struct {
	n        int // how many; 0: nothing to do
	at       time.Time
	ready    bool // the last one's
	sawReady bool // any of them
	payload  json.RawMessage
	resume   []json.RawMessage
}

// take empties the box.
func (b *beatBox) take() beats {
	b.mu.Lock()
	defer b.mu.Unlock()
	t := beats{n: b.n, at: b.at, ready: b.ready, sawReady: b.sawReady, payload: b.payload, resume: b.resume}
	b.n, b.resume, b.sawReady = 0, nil, false
	return t
}

// setSteady records whether the loop needs waking for p's heartbeats.
func (b *beatBox) setSteady(steady bool) {
	b.mu.Lock()
	b.steady = steady
	b.mu.Unlock()
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
	t := p.beats.take()
	if t.n == 0 || p.state >= procStopping {
		return
	}
	at := t.at
	p.lastBeat = at
	p.beat = t.payload
	for _, r := range t.resume {
		m.takeResume(p, r, at)
	}
	m.publishHeartbeat(p, t.ready, t.payload, at)
	if t.sawReady && p.state == procRegistered {
		p.state = procReady
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
	p.beats.setSteady(p.state == procReady && !(s.current == p && s.hist.CrashLoop))
}
