package manager

import (
	"encoding/json"
	"errors"
	"time"

	"github.com/sm-supervisor/sm/generation"
	"github.com/sm-supervisor/sm/ipc"
)

// errNotConnected means a process has no live connection to the manager.
var errNotConnected = errors.New("process is not connected")

// quiesce sends p QUIESCE, as its supervision decided (it was unrouted
// first). Every later send sees sendClosed and goes elsewhere (see "The
// send lock and QUIESCE" in docs/architecture.md).
func (m *Manager) quiesce(p *proc) {
	c := p.conn.Load()
	p.sendMu.Lock()
	p.sendClosed = true
	err := errNotConnected
	if c != nil {
		err = c.send(&ipc.Frame{Op: ipc.OpQuiesce})
	}
	p.sendMu.Unlock()
	if err != nil {
		m.do(p.slot, p.slot.sup.QuiesceFailed(time.Now(), p))
		return
	}
	m.log.Info("quiesce sent", "cluster", p.cluster, "generation", p.gen, "pid", p.pid())
}

// quiesced handles p's QUIESCED: its resume state, and the news for a deploy.
func (m *Manager) quiesced(p *proc, resume json.RawMessage) {
	m.drainBeat(p) // its last heartbeats' resume state first
	m.takeResume(p, resume, time.Now())
	m.meshResumeBehind(p) // now: the host that takes the cluster over reads it
	if !p.slot.sup.Quiesced(time.Now(), p) {
		return
	}
	m.log.Info("cluster quiesced", "cluster", p.cluster, "generation", p.gen, "pid", p.pid())
	m.deploys(func(d *generation.Deploy) { d.Quiesced(p.ref()) })
}
