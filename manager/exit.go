package manager

import (
	"context"
	"errors"
	"time"

	"github.com/sm-supervisor/sm/generation"
	"github.com/sm-supervisor/sm/supervise"
)

// How processes leave: a lost connection, a stop, the kernel's confirmed
// exit, and the restart its supervision then schedules.

// disconnected handles the end of cluster connection c: a process that
// loses it without exiting can no longer serve, and its supervision stops
// it unless its exit follows at once.
func (m *Manager) disconnected(p *proc, c *conn) {
	if p.conn.Load() != c {
		return
	}
	m.drainBeat(p) // what it said before it went
	p.conn.Store(nil)
	p.dead.Store(true)
	s := p.slot
	m.do(s, s.sup.Disconnected(time.Now(), p))
	m.failProcPending(p)
	m.cancelIdentifies(p)
	m.handoffDrained(p) // its last frames are read: an ACTIVATE may go out
	if held, ok := m.exitHeld[p]; ok {
		delete(m.exitHeld, p)
		for _, d := range held {
			d.Exited(p.ref())
		}
		m.depFed = true
	}
}

// stop ends p, as its supervision decided: what it said last is taken while
// it is still routed, then it is unrouted, its requests fail, and it gets
// SIGTERM, grace, SIGKILL (a fence: SIGKILL at once). Its confirmed exit
// arrives as evExit.
func (m *Manager) stop(p *proc, a supervise.Action[*proc]) {
	if t := p.beats.take(); t.n > 0 {
		m.recordBeats(p, t) // its resume reports still count
	}
	m.unroute(p)
	m.logStop(p, a)
	grace := m.cfg.Restart.StopGrace.Duration
	if a.Kill {
		grace = 0 // a fence: SIGKILL at once, within the lease's margin
	}
	m.stopWG.Add(1)
	go func() {
		defer m.stopWG.Done()
		// Bounded even for a process stuck in the kernel: its exit event still
		// arrives whenever the kernel lets it go.
		ctx, cancel := context.WithTimeout(context.Background(), grace+stopConfirmWait)
		defer cancel()
		if err := supervise.Stop(ctx, p.process, grace); err != nil {
			m.log.Error("stop failed", "cluster", p.cluster, "pid", p.pid(), "err", err)
		}
	}()
}

// stopConfirmWait is how long after SIGKILL a stop waits for the kernel.
const stopConfirmWait = 10 * time.Second

// unroute takes a process that can no longer serve out of the routing table
// and fails the requests it held.
func (m *Manager) unroute(p *proc) {
	p.dead.Store(true)
	if m.routedNow(p) {
		m.setRoute(p.slot, nil)
	}
	m.failProcPending(p)
}

// exitDrainWait bounds how long the connection of an exited process may take
// to deliver what the process wrote before it died.
const exitDrainWait = time.Second

var errProcessExited = errors.New("cluster process exited")

// exited handles the kernel's confirmation that p exited. The deploy hears
// of it first, then p's supervision, which may respawn the cluster.
func (m *Manager) exited(p *proc) {
	m.drainBeat(p) // what it said before it died
	expected := !p.state().Before(supervise.StateQuiescing)
	delete(m.procs, p.seq)
	m.liveProcs.Add(-1)
	m.cancelIdentifies(p)
	p.dead.Store(true)
	if c := p.conn.Load(); c != nil {
		// Its last replies may still sit unread in the socket: the reader
		// drains them, reaches EOF, and its disconnect fails what is left.
		// A descendant holding the socket open must not stall that forever.
		time.AfterFunc(exitDrainWait, func() { c.c.Abort(errProcessExited) })
	} else {
		m.failProcPending(p)
	}
	status := p.process.ExitStatus()
	m.log.Info("cluster exited", "cluster", p.cluster, "generation", p.gen, "pid", p.pid(), "status", status, "expected", expected)
	// A resume-handoff deploy spawns the successor at this exit, and the
	// successor's REGISTER gets the sessions' resume state: such a deploy
	// hears of it once p's connection is read to its end, its QUIESCED's
	// resume state taken (at most exitDrainWait later; disconnected).
	connected := p.conn.Load() != nil
	m.deploys(func(d *generation.Deploy) {
		if connected && d.Resume() && !d.Done() {
			m.exitHeld[p] = append(m.exitHeld[p], d)
			return
		}
		d.Exited(p.ref())
	})
	s := p.slot
	m.do(s, s.sup.Exited(time.Now(), p, status))
	m.fenceDone(s)
}
