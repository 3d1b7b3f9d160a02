package manager

import "time"

// restore rebuilds the manager from the state file a previous manager left:
// the topology and generations in force then (a topology change in the config
// since then needs a DEPLOY), and every recorded process still alive, adopted
// and awaited until state.adopt_window ends. It returns whether anything was
// adopted. It runs before the loop starts.
func (m *Manager) restore() bool {
	st, err := m.loadState()
	if err != nil {
		m.log.Error("ignoring state file; surviving clusters will be refused and replaced", "err", err)
		return false
	}
	if st == nil {
		return false
	}
	m.restarted = true
	t := newRouteTable(st.Topology, st.Generation)
	for i, s := range t.slots {
		s.gen = st.SlotGens[i]
	}
	m.routes.Store(t)
	m.gen = st.Generation
	// What each generation runs is what it ran: a command edited in the
	// config since then reaches the clusters only through a DEPLOY.
	for g, sp := range st.Specs {
		m.specs[g] = spec{argv: sp.Argv, env: sp.Env, dir: sp.Dir}
	}
	if cfgTopo := m.cfg.Topology.Generation(); cfgTopo != st.Topology {
		m.log.Warn("config topology differs from the running one; a DEPLOY applies it",
			"running", st.Topology.String(), "config", cfgTopo.String())
	}
	adopted := 0
	now := time.Now()
	for _, sp := range st.Procs {
		process, err := adoptable(sp)
		if err != nil {
			// Gone, or not a cluster at all (pid 1, or no group leader):
			// either way it is never signalled.
			m.log.Info("recorded cluster process is gone", "cluster", sp.Cluster, "generation", sp.Generation, "pid", sp.PID, "err", err)
			continue
		}
		p := &proc{
			seq: m.procSeq.Add(1), cluster: sp.Cluster, gen: sp.Generation, tokenHash: sp.TokenHash,
			startTime: sp.StartTime, process: process, spawned: now, lastBeat: now,
			activated: sp.Activated, adopted: true,
			// The reason its spawner gave it: a first start still connecting
			// its shards is still a first start (docs/discord.md).
			reason: reasonOfStart(sp.Start),
		}
		if sp.Topology == st.Topology && sp.Cluster < len(t.slots) && t.slots[sp.Cluster].first == sp.ShardFirst {
			p.slot = t.slots[sp.Cluster]
		} else {
			// A process of a topology no longer (or not yet) in force: a
			// re-clustering deploy was cut short. It gets a slot of its own
			// so it can register and be quiesced.
			p.slot = &slot{id: sp.Cluster, first: sp.ShardFirst, last: sp.ShardLast, topo: sp.Topology, gen: sp.Generation, retired: true}
		}
		m.procs[p.seq] = p
		m.liveProcs.Add(1)
		m.watchExit(p)
		adopted++
		m.log.Info("awaiting surviving cluster", "cluster", sp.Cluster, "generation", sp.Generation, "pid", sp.PID, "routed", sp.Routed)
		if sp.Routed && !p.slot.retired {
			p.wasRouted = true
		}
	}
	// Which survivor is each cluster's: the one routed when the manager died
	// (during a deploy, the new generation once switched); failing that, an
	// unrouted one (starting or restarting then). Every other is stale and
	// is quiesced once it reconnects.
	for _, pass := range []bool{true, false} {
		for _, p := range m.procs {
			if p.wasRouted == pass && !p.slot.retired && p.slot.current == nil {
				p.slot.current = p
			}
		}
	}
	for _, p := range m.procs {
		p.stale = p.slot.current != p
	}
	m.restoreHandoffs(t, st.Handoffs)
	if adopted > 0 {
		window := m.cfg.State.AdoptWindow.Duration
		m.log.Info("re-adopting surviving clusters", "processes", adopted, "adopt_window", window)
		time.AfterFunc(window, func() { m.post(evAdoptDone{}) })
		m.adopting = true
	}
	return adopted > 0
}

// evRegistered follows a cluster's REGISTER reply: what an adopted process
// needs once it is back on a connection.
type evRegistered struct{ p *proc }

func (e evRegistered) apply(m *Manager) {
	p := e.p
	if !p.adopted || p.state >= procQuiescing {
		return
	}
	switch {
	case p.stale:
		m.log.Warn("quiescing a surviving process that is no longer a cluster's", "cluster", p.cluster, "generation", p.gen, "pid", p.pid())
		m.quiesce(p)
	case p.wasRouted && p.slot.current == p:
		// Routing as it was: the process was serving when the manager died.
		p.state = procReady
		m.setRoute(p.slot, p)
		m.log.Info("cluster re-adopted", "cluster", p.cluster, "generation", p.gen, "pid", p.pid(),
			"after", time.Since(m.started).Round(time.Millisecond))
	}
}

// evAdoptDone ends the adopt window: survivors that did not come back are
// stopped, and every cluster without a process is spawned.
type evAdoptDone struct{}

func (evAdoptDone) apply(m *Manager) {
	m.adopting = false
	for _, p := range m.procs {
		if p.adopted && p.conn.Load() == nil && p.state < procStopping {
			m.log.Warn("surviving process did not reconnect within the adopt window; stopping it", "cluster", p.cluster, "pid", p.pid())
			m.stop(p, "not re-adopted")
		}
	}
	for _, s := range m.table().slots {
		if s.current == nil || s.current.state >= procStopping {
			m.respawn(s)
		}
	}
}

// othersAlive reports whether another process of p's cluster still runs:
// then p must not be ACTIVATEd yet (never two active processes for a cluster).
func (m *Manager) othersAlive(p *proc) bool {
	for _, q := range m.procs {
		if q != p && q.slot == p.slot && q.state != procExited {
			return true
		}
	}
	return false
}

// maybeActivate ACTIVATEs a cluster's routed process once it is the only one
// left (after a stale survivor exited). Deploys activate their own.
func (m *Manager) maybeActivate(s *slot) {
	p := s.current
	if m.deployOwns(s) || p == nil || p.activated || p.state != procReady || !m.routedNow(p) || m.othersAlive(p) {
		return
	}
	m.activate(p)
}

// watchExit posts p's confirmed exit to the loop.
func (m *Manager) watchExit(p *proc) {
	go func() {
		<-p.process.Exited()
		m.post(evExit{p: p})
	}()
}
