package manager

import (
	"encoding/json"
	"errors"
	"time"

	"github.com/sm-supervisor/sm/ipc"
)

// The deploy handoff (docs/protocol.md): both generations' sessions of a
// shard receive the same dispatches from Discord, so a deploy's new process
// must know which of its buffered dispatches the old one already handled. The
// old process leaves that in its QUIESCED as "handoff", an object opaque to
// the manager; the manager keeps the latest per cluster and puts it, byte for
// byte, on the next ACTIVATE it sends to that cluster's next process.
//
// A QUIESCED and the exit that follows it reach the loop by different paths
// (the connection's reader, the pidfd waiter), so the exit may be seen first
// and the successor ACTIVATEd before the handoff is read. An ACTIVATE that
// follows a quiesced process therefore waits until that process's connection
// has been read to its end (at most the 1 s an exited process's connection
// is given: exitDrainWait).
//
// All of it is loop-owned; newHandoffs makes its maps.
type handoffs struct {
	// bySlot is the handoff waiting for each cluster's next ACTIVATE.
	bySlot map[*slot]json.RawMessage
	// active is each cluster's process last ACTIVATEd (or adopted as
	// activated): the one that handled dispatches, and whose QUIESCED may
	// carry a handoff. Dropped once its connection is read to its end.
	active map[*slot]*proc
	// after holds the ACTIVATEs waiting for a predecessor's connection:
	// predecessor → the process to activate.
	after map[*proc]*proc
}

// newHandoffs is the empty set, its maps made once.
func newHandoffs() handoffs {
	return handoffs{bySlot: map[*slot]json.RawMessage{}, active: map[*slot]*proc{}, after: map[*proc]*proc{}}
}

// keepHandoff keeps a QUIESCED's handoff h for the cluster's next ACTIVATE,
// if it comes from a process p that handled dispatches and was told to
// quiesce: no other process's handoff says anything about what was handled.
func (m *Manager) keepHandoff(p *proc, h json.RawMessage) {
	log := m.log.With("cluster", p.cluster, "generation", p.gen, "pid", p.pid())
	switch {
	case string(h) == "null":
		return // null counts as absent
	case len(h) > m.cfg.Limits.MaxHandoffBytes:
		log.Warn("ignoring a QUIESCED handoff larger than limits.max_handoff_bytes", "bytes", len(h), "limit", m.cfg.Limits.MaxHandoffBytes)
		return
	case h[0] != '{':
		log.Warn("ignoring a QUIESCED handoff that is not a JSON object")
		return
	case !p.sendClosed || !p.view().Activated:
		log.Debug("ignoring the handoff of a process not quiesced after ACTIVATE: it handled no dispatches to hand off")
		return
	case p.slot.retiredNow():
		// A re-clustering gave its shards to clusters of other ranges; an
		// opaque handoff cannot be split between them.
		log.Debug("ignoring the handoff of a process of a retired topology")
		return
	}
	for s := range m.handoff.bySlot {
		if s.retiredNow() {
			delete(m.handoff.bySlot, s) // re-clustered away before its ACTIVATE
		}
	}
	m.handoff.bySlot[p.slot] = h
	m.persist()
}

// activationWaits reports whether p's ACTIVATE must wait because the
// cluster's previous active process was quiesced and its connection is not
// yet read to its end: its handoff may still be on the way. activate runs
// again for p once it is (handoffDrained).
func (m *Manager) activationWaits(p *proc) bool {
	q := m.handoff.active[p.slot]
	if q == nil || q == p || !q.sendClosed || q.conn.Load() == nil {
		return false
	}
	if m.handoff.after[q] == p {
		return true // already waiting (a deploy may ask again)
	}
	m.handoff.after[q] = p
	m.log.Debug("ACTIVATE waits for the quiesced process's last frames", "cluster", p.cluster, "generation", p.gen, "pid", p.pid(), "after_pid", q.pid())
	return true
}

// sendActivate sends p its ACTIVATE (p is connected, or the frame is lost as
// any frame to a gone connection), with the cluster's handoff if there is
// one, and records p as the cluster's active process.
func (m *Manager) sendActivate(p *proc) {
	s := p.slot
	if c := p.conn.Load(); c != nil {
		h := m.handoff.bySlot[s]
		err := c.send(&ipc.Frame{Op: ipc.OpActivate, Handoff: h})
		if errors.Is(err, ipc.ErrFrameTooLarge) {
			// Possible only with a limits.max_frame_bytes lowered across a
			// manager restart: the process is activated without it.
			m.log.Warn("the handoff does not fit in an ACTIVATE under limits.max_frame_bytes: sent without it", "cluster", p.cluster, "bytes", len(h))
			err = c.send(&ipc.Frame{Op: ipc.OpActivate})
		}
		if err == nil && h != nil {
			delete(m.handoff.bySlot, s) // consumed once
		}
	}
	m.handoff.active[s] = p
}

// handoffDrained follows the end of q's connection, read to its last frame:
// q can leave no more handoff, and an ACTIVATE that waited for that goes out.
func (m *Manager) handoffDrained(q *proc) {
	if m.handoff.active[q.slot] == q {
		delete(m.handoff.active, q.slot)
	}
	p, ok := m.handoff.after[q]
	if !ok {
		return
	}
	delete(m.handoff.after, q)
	m.do(p.slot, p.slot.sup.Activate(time.Now(), p)) // checks p again: it may be stopping by now
}

// restoreHandoffs takes what the state file recorded: each cluster's waiting
// handoff, and which survivor was the active one.
func (m *Manager) restoreHandoffs(t *routeTable, saved map[int]string) {
	for id, h := range saved {
		if id >= 0 && id < len(t.slots) && h != "" {
			m.handoff.bySlot[t.slots[id]] = json.RawMessage(h)
		}
	}
	for _, p := range m.procs {
		if p.view().Activated && !p.slot.retired {
			m.handoff.active[p.slot] = p
		}
	}
}

// savedHandoffs is what the state file records of the waiting handoffs, by
// cluster of the table in force. Strings, not raw JSON, so that they come
// back byte for byte (the file is indented).
func (m *Manager) savedHandoffs(t *routeTable) map[int]string {
	var out map[int]string
	for _, s := range t.slots {
		if h, ok := m.handoff.bySlot[s]; ok {
			if out == nil {
				out = map[int]string{}
			}
			out[s.id] = string(h)
		}
	}
	return out
}
