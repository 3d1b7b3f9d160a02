package manager

import (
	"time"

	"github.com/sm-supervisor/sm/mesh"
	"github.com/sm-supervisor/sm/supervise"
)

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
	if m.mesh != nil && st.MeshHost == m.mesh.agent.Me.Host && st.MeshBoot != "" {
		m.mesh.prev = mesh.Holder{Host: st.MeshHost, Boot: st.MeshBoot}
	}
	t := newRouteTable(st.Topology, st.Generation, &m.rules)
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
			startTime: sp.StartTime, process: process,
			// The reason its spawner gave it: a first start still connecting
			// its shards is still a first start (docs/discord.md).
			reason: reasonOfStart(sp.Start),
		}
		if sp.Topology == st.Topology && sp.Cluster < len(t.slots) && t.slots[sp.Cluster].first == sp.ShardFirst {
			p.slot = t.slots[sp.Cluster]
		} else {
			// A process of a topology no longer (or not yet) in force: a
			// re-clustering deploy was cut short. It gets a slot of its own,
			// retired, so it can register and be quiesced.
			p.slot = &slot{id: sp.Cluster, first: sp.ShardFirst, last: sp.ShardLast, topo: sp.Topology, gen: sp.Generation,
				retired: true, sup: supervise.NewCluster[*proc](&m.rules)}
			p.slot.sup.Retire(now)
		}
		// Which survivor is each cluster's is its supervision's choice: the
		// one routed when the manager died (during a deploy, the new
		// generation once switched); failing that, an unrouted one
		// (starting or restarting then). Every other is quiesced once it
		// reconnects.
		p.slot.sup.Adopted(now, p, sp.Routed, sp.Activated)
		m.procs[p.seq] = p
		m.liveProcs.Add(1)
		m.watchExit(p)
		adopted++
		m.log.Info("awaiting surviving cluster", "cluster", sp.Cluster, "generation", sp.Generation, "pid", sp.PID, "routed", sp.Routed)
	}
	m.restoreHandoffs(t, st.Handoffs)
	if adopted > 0 {
		window := m.cfg.State.AdoptWindow.Duration
		m.log.Info("re-adopting surviving clusters", "processes", adopted, "adopt_window", window)
		for _, s := range m.supervised() {
			s.sup.Adopting(now)
		}
		time.AfterFunc(window, func() { m.post(evAdoptDone{}) })
	}
	return adopted > 0
}

// adoptDone ends the adopt window: survivors that did not come back are
// stopped, and every cluster without a process is spawned.
func (m *Manager) adoptDone() {
	now := time.Now()
	for _, s := range m.supervised() {
		m.do(s, s.sup.AdoptDone(now))
	}
}
