package manager

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sm-supervisor/sm/discord"
	"github.com/sm-supervisor/sm/generation"
	"github.com/sm-supervisor/sm/supervise"
)

// The loop's side of supervision. What to do about a cluster's processes is
// decided by its supervise.Cluster (slot.sup), which the loop feeds the
// events it sees and whose actions it carries out here (do). Nothing in this
// package decides when a process is hung, respawned or routed.

// slot is one cluster of the topology: its shard range, its generation (the
// code version it runs) and its supervision.
type slot struct {
	id          int
	first, last int
	topo        generation.Topology

	// Loop-owned.
	gen        int64                     // the generation its processes run; a respawn keeps it
	sup        *supervise.Cluster[*proc] // its supervision
	dirty      bool                      // its state changed since the feed last heard
	restartTmr *time.Timer               // the respawn sup armed, if any

	mu      sync.Mutex // guards the fields that follow (lock order: see Manager)
	waiting []*pending // requests that arrived while the cluster had no routed process
	retired bool       // replaced by a re-clustering: requests go to the new table
	// remote: in a mesh, this host does not hold the cluster's lease, and
	// requests for it are answered unavailable (written under mu).
	remote atomic.Bool
	// fenced: in a mesh, the agent's watchdog killed its processes (a Stop
	// not confirmed in time); it is not spawned again until the loop hears
	// the lease is held again (meshfence.go).
	fenced atomic.Bool
}

func newSlot(topo generation.Topology, id int, gen int64, rules *supervise.Rules) *slot {
	first, last := topo.Range(id)
	return &slot{id: id, first: first, last: last, topo: topo, gen: gen, sup: supervise.NewCluster[*proc](rules)}
}

// retiredNow reads retired under the lock.
func (s *slot) retiredNow() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.retired
}

// waitingLiveLocked counts queued requests not yet completed; it drops
// completed ones so the bound counts only what really waits.
func (s *slot) waitingLiveLocked() int {
	live := s.waiting[:0]
	for _, p := range s.waiting {
		if !p.done.Load() {
			live = append(live, p)
		}
	}
	clear(s.waiting[len(live):])
	s.waiting = live
	return len(live)
}

// proc is one spawned (or adopted) cluster process: how to reach it and what
// it said. Where it is in its life is its slot's supervision's (state).
type proc struct {
	seq       uint64
	cluster   int
	slot      *slot
	gen       int64
	tokenHash string // sha256 of its SM_TOKEN: all the state file keeps
	startTime uint64 // kernel start time: pid + start time name it for good
	// reason is why it was spawned, for the identify budget: a first start, a
	// restart after a death (what a crash loop spends), or a deploy.
	reason discord.Reason
	// resumes: a resume-handoff deploy spawned it once its predecessor was
	// gone, to RESUME that one's sessions (its REGISTER reply carries them).
	resumes bool
	process supervise.Process

	conn atomic.Pointer[conn] // set while registered; read by the hot path
	dead atomic.Bool          // exited, disconnected or stopped: never route to it
	// frames counts the frames the reader got from the process: a process
	// busy answering a flood is alive even if its heartbeat is queued behind
	// its replies. The loop notes on each tick whether the count moved
	// (framesSeen), which spares the reader a clock read per frame.
	frames atomic.Uint64
	// beats is what its heartbeats left for the loop (heartbeat.go).
	beats beatBox

	sendMu     sync.RWMutex // held (read) by every send to the process, (write) by QUIESCE
	sendClosed bool         // guarded by sendMu: QUIESCE sent, requests go elsewhere

	// Loop-owned.
	framesSeen uint64          // frames as of the last tick
	beat       json.RawMessage // last heartbeat payload, passed through unread
	// identWaiting holds the shards with an IDENTIFY waiting in the gate.
	identWaiting map[int]bool
}

// usable reports whether requests may be sent to p now.
func (p *proc) usable() bool { return p != nil && !p.dead.Load() && p.conn.Load() != nil }

func (p *proc) pid() int { return p.process.PID() }

func (p *proc) ref() generation.ProcRef {
	return generation.ProcRef{Cluster: p.cluster, Generation: p.gen, Seq: p.seq}
}

// view is what p's supervision knows of it (loop only).
func (p *proc) view() supervise.ProcView {
	v, _ := p.slot.sup.Proc(p)
	return v
}

// state is where p is in its life (loop only).
func (p *proc) state() supervise.State { return p.view().State }

// isCurrent reports whether p is its cluster's supervised process.
func (p *proc) isCurrent() bool { return p.slot.sup.IsCurrent(p) }

// do carries out, in order, what s's supervision asked for in answer to one
// event. Carrying out a spawn or a QUIESCE can feed it the outcome, whose
// actions are carried out there and then.
func (m *Manager) do(s *slot, acts []supervise.Action[*proc]) {
	for _, a := range acts {
		p := a.Proc
		switch a.Kind {
		case supervise.ActSpawn:
			m.respawn(s, a.Restart)
		case supervise.ActStop:
			m.stop(p, a)
		case supervise.ActQuiesce:
			m.quiesce(p)
		case supervise.ActRoute:
			m.setRoute(s, p)
			if a.Why != "" { // routed again as it was before the manager restarted
				m.log.Info("cluster re-adopted", "cluster", p.cluster, "generation", p.gen, "pid", p.pid(),
					"after", time.Since(m.started).Round(time.Millisecond))
			}
		case supervise.ActUnroute:
			if m.routedNow(p) {
				m.setRoute(s, nil)
			}
		case supervise.ActActivate:
			m.activate(p)
		case supervise.ActArm:
			m.armTimer(s, a)
		case supervise.ActDisarm:
			if s.restartTmr != nil {
				s.restartTmr.Stop()
				s.restartTmr = nil
			}
		case supervise.ActReady:
			m.log.Info("cluster ready", "cluster", p.cluster, "generation", p.gen, "pid", p.pid(),
				"after", time.Since(p.view().Spawned).Round(time.Millisecond))
			m.deploys(func(d *generation.Deploy) { d.Ready(p.ref()) })
		case supervise.ActRecovered:
			m.log.Info("cluster left crash loop", "cluster", p.cluster, "generation", p.gen)
		case supervise.ActChanged:
			m.touch(s)
		}
	}
}

// armTimer starts the timer whose Due a asks for.
func (m *Manager) armTimer(s *slot, a supervise.Action[*proc]) {
	ev := evTimer{s: s, timer: a.Timer, p: a.Proc}
	fire := func() { m.post(ev) }
	if a.Timer != supervise.TimerRestart {
		time.AfterFunc(time.Until(a.At), fire)
		return
	}
	if a.CrashLoop {
		m.log.Error("cluster in crash loop; retrying at the backoff ceiling", "cluster", s.id, "generation", s.gen,
			"restarts_in_period", a.Restarts, "delay", a.Delay.Round(time.Millisecond))
	} else {
		m.log.Info("cluster restart scheduled", "cluster", s.id, "generation", s.gen, "delay", a.Delay.Round(time.Millisecond))
	}
	if s.restartTmr != nil {
		s.restartTmr.Stop()
	}
	s.restartTmr = time.AfterFunc(time.Until(a.At), fire)
}

// timerDue hands a timer that came due to its cluster's supervision.
func (m *Manager) timerDue(s *slot, t supervise.Timer, p *proc) {
	if t == supervise.TimerRestart {
		s.restartTmr = nil
	}
	acts := s.sup.Due(time.Now(), t, p)
	if t == supervise.TimerRestart {
		for _, a := range acts {
			if a.Kind == supervise.ActSpawn {
				m.metrics.restarts.Inc()
			}
		}
	}
	m.do(s, acts)
}

// setRoute publishes a routing table with s routed to p (nil: none) and,
// if p can serve, hands it the requests that waited.
func (m *Manager) setRoute(s *slot, p *proc) {
	s.mu.Lock()
	if s.retired {
		s.mu.Unlock()
		return
	}
	m.routes.Store(m.table().with(s.id, p))
	if p != nil {
		s.gen = p.gen // the code version serving it: what a respawn runs
	}
	m.touch(s)
	m.persist()
	var waiting []*pending
	if p.usable() {
		waiting = s.waiting
		s.waiting = nil
	}
	s.mu.Unlock()
	for _, w := range waiting {
		if !w.done.Load() {
			m.send(p, w)
		}
	}
}

// routedNow reports whether the table in force routes to p.
func (m *Manager) routedNow(p *proc) bool {
	t := m.table()
	return p.cluster < len(t.slots) && t.slots[p.cluster] == p.slot && t.procs[p.cluster] == p
}

// activate sends p ACTIVATE, as its supervision decided, unless it must
// wait for a quiesced predecessor's handoff (handoff.go), which then asks
// again.
func (m *Manager) activate(p *proc) {
	if m.activationWaits(p) {
		m.do(p.slot, p.slot.sup.ActivationWaits(time.Now(), p))
		return
	}
	m.sendActivate(p) // with the cluster's handoff, if one waits
	m.persist()
	m.log.Info("cluster activated", "cluster", p.cluster, "generation", p.gen, "pid", p.pid())
}

// logStop logs why supervision stops p: at warn when it judged p faulty.
func (m *Manager) logStop(p *proc, a supervise.Action[*proc]) {
	level := slog.LevelInfo
	args := []any{"cluster", p.cluster, "generation", p.gen, "pid", p.pid(), "reason", a.Why}
	if a.Fault {
		level = slog.LevelWarn
	}
	if a.Silent > 0 {
		args = append(args, "silent", a.Silent.Round(time.Millisecond))
	}
	m.log.Log(context.Background(), level, "stopping cluster", args...)
}
