package manager

import (
	"encoding/json"
	"sync"
	"time"

	"github.com/sm-supervisor/sm/ipc"
	"github.com/sm-supervisor/sm/supervise"
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

// drainBeats takes every process's heartbeats.
func (m *Manager) drainBeats() {
	for _, p := range m.procs {
		m.drainBeat(p)
	}
}

// drainBeat is the loop's half of p's heartbeats since it last looked: the
// last one's time, payload and readiness, and every resume report in order.
// A process being stopped is not heard any more.
func (m *Manager) drainBeat(p *proc) {
	t := p.beats.take()
	if t.n == 0 || !p.state().Before(supervise.StateStopping) {
		return
	}
	m.recordBeats(p, t)
	s := p.slot
	m.do(s, s.sup.Heartbeat(t.at, p, t.sawReady))
	p.beats.setSteady(s.sup.Steady(p))
}

// recordBeats keeps what p's heartbeats said: the last payload, the resume
// reports, and, for the feed, the last heartbeat.
func (m *Manager) recordBeats(p *proc, t beats) {
	p.beat = t.payload
	for _, r := range t.resume {
		m.takeResume(p, r, t.at)
	}
	m.publishHeartbeat(p, t.ready, t.payload, t.at)
}

// checkHeartbeats has every cluster's supervision judge its processes'
// silence: a hung process is killed and replaced. Frames read since the last
// tick count as a sign of life.
func (m *Manager) checkHeartbeats(now time.Time) {
	slots := make(map[*slot]bool, len(m.procs))
	for _, p := range m.procs {
		if n := p.frames.Load(); n != p.framesSeen {
			p.framesSeen = n
			p.slot.sup.Alive(now, p)
		}
		slots[p.slot] = true
	}
	for s := range slots {
		m.do(s, s.sup.Tick(now))
	}
}
