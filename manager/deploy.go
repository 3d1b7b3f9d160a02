package manager

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"time"

	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/discord"
	"github.com/sm-supervisor/sm/generation"
	"github.com/sm-supervisor/sm/ipc"
)

// deploy is the DEPLOY op: it is decided on the loop, which answers at once
// with the deploy id; progress is in Status.
func (m *Manager) deploy(c *conn, f *ipc.Frame) {
	if c.proc != nil {
		c.replyErr(f.ID, ipc.CodeForbidden, "DEPLOY is for client connections")
		return
	}
	// Reading the file and asking Discord (up to 30s) are I/O: done off the
	// loop, and off this connection's reader, whose other requests go on.
	m.connWG.Add(1) // the reader holds the count above zero: Run's Wait sees this one
	go func() {
		defer m.connWG.Done()
		m.prepareDeploy(c, f)
	}()
}

// prepareDeploy reads the config and asks Discord, then has the loop start
// the deploy and answers the DEPLOY.
func (m *Manager) prepareDeploy(c *conn, f *ipc.Frame) {
	ev := evDeploy{f: f}
	ev.cfg, ev.err = m.loadDeployConfig()
	if ev.cfg != nil && m.fetchGateway != nil && m.cfg.Discord.HasToken() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		gw, err := m.fetchGateway(ctx)
		cancel()
		switch {
		case err == nil:
			ev.gw = &gw
			if ev.cfg.Topology.Auto {
				ev.cfg.Topology.TotalShards = gw.TotalShards()
			}
		case ev.cfg.Topology.Auto:
			ev.cfg, ev.err = nil, ipc.Errorf(ipc.CodeUnavailable, "total_shards = \"auto\": asking Discord: %v", err)
		default:
			m.log.Warn("could not refresh /gateway/bot for the deploy", "err", err)
		}
	} else if ev.cfg != nil && ev.cfg.Topology.Auto {
		ev.cfg, ev.err = nil, ipc.Errorf(ipc.CodeBadConfig, "total_shards = \"auto\" needs a Discord token configured when the manager started")
	}
	r, err := ask(m, context.Background(), func(res chan<- registerResult) event { ev.res = res; return ev })
	if err != nil {
		r.err = ipc.Errorf(ipc.CodeShuttingDown, "manager is shutting down")
	}
	if r.err != nil {
		c.send(ipc.ReplyError(f.ID, r.err))
		return
	}
	c.reply(f.ID, r.payload)
}

// deployEvent takes what prepareDeploy learnt and starts the deploy.
func (m *Manager) deployEvent(e evDeploy) registerResult {
	if e.gw != nil {
		m.observeGateway(*e.gw)
	}
	if e.err != nil {
		return registerResult{err: e.err}
	}
	if m.mesh != nil {
		return registerResult{err: errMeshDeploy}
	}
	return m.startDeploy(e.f, e.cfg)
}

// loadDeployConfig re-reads the config file as it is on disk now.
func (m *Manager) loadDeployConfig() (*config.Config, *ipc.Error) {
	if m.cfg.Path == "" {
		return nil, ipc.Errorf(ipc.CodeBadConfig, "the manager was not started from a config file")
	}
	cfg, err := config.Load(m.cfg.Path)
	if err == nil {
		err = CheckConfig(cfg)
	}
	if err != nil {
		return nil, ipc.Errorf(ipc.CodeBadConfig, "%v", err)
	}
	return cfg, nil
}

// startDeploy re-reads the config file as it is on disk now, plans the move
// to a new generation and starts it. An invalid file changes nothing.
func (m *Manager) startDeploy(f *ipc.Frame, cfg *config.Config) registerResult {
	if m.stopping.Load() {
		return registerResult{err: ipc.Errorf(ipc.CodeShuttingDown, "manager is shutting down")}
	}
	if m.dep != nil && !m.dep.Done() {
		return registerResult{err: ipc.Errorf(ipc.CodeDeployInProgress, "deploy %s is still running", m.dep.Status().ID)}
	}
	if c, ok := m.recycleRunning(); ok {
		return registerResult{err: ipc.Errorf(ipc.CodeDeployInProgress, "cluster %d is being recycled; retry once it is done (docs/deploys.md#recycling)", c)}
	}
	sp, err := specOf(cfg)
	if err != nil {
		return registerResult{err: ipc.Errorf(ipc.CodeBadConfig, "%v", err)}
	}
	table := m.table()
	gen := m.gen + 1
	maxPar := f.MaxParallel
	if maxPar == 0 {
		maxPar = 1
	}
	var resume bool
	switch f.Mode {
	case "", "overlap":
	case "resume":
		resume = true
	default:
		return registerResult{err: ipc.Errorf(ipc.CodeBadFrame, "mode %q: want \"overlap\" (the default) or \"resume\"", f.Mode)}
	}
	plan := generation.Plan{
		ID:             "deploy-" + strconv.FormatInt(gen, 10),
		Gen:            gen,
		From:           table.topo,
		To:             cfg.Topology.Generation(),
		Current:        m.genRoutes(table),
		Clusters:       f.Clusters,
		MaxParallel:    maxPar,
		ReadyTimeout:   cfg.Deploy.ReadyTimeout.Duration,
		QuiesceTimeout: cfg.Deploy.QuiesceTimeout.Duration,
		Resume:         resume,
	}
	d, err := generation.NewDeploy(plan, time.Now, actuator{m: m, resume: resume})
	if err != nil {
		return registerResult{err: ipc.Errorf(ipc.CodeBadFrame, "%v", err)}
	}
	m.specs[gen] = sp
	m.gen = gen
	m.dep = d
	m.next = nil
	m.log.Info("deploy started", "deploy", plan.ID, "generation", gen, "from", plan.From.String(), "to", plan.To.String(),
		"clusters", f.Clusters, "max_parallel", maxPar, "mode", modeName(resume))
	now := time.Now()
	for _, s := range table.slots {
		if d.Owns(s.id) {
			s.sup.Take(now)
		}
	}
	d.Start()
	m.depFed = true
	m.deployProgress()
	payload, _ := json.Marshal(map[string]any{
		"deploy_id":    plan.ID,
		"generation":   gen,
		"from":         plan.From,
		"to":           plan.To,
		"reclustering": plan.From != plan.To,
		"mode":         modeName(resume),
	})
	return registerResult{payload: payload}
}

// modeName is a deploy's mode as DEPLOY names it.
func modeName(resume bool) string {
	if resume {
		return "resume"
	}
	return "overlap"
}

// deployProgress logs a deploy's end once.
func (m *Manager) deployProgress() {
	if m.dep == nil || !m.dep.Done() || m.depLogged == m.dep {
		return
	}
	m.depLogged = m.dep
	// A cluster the deploy owned but had nothing to do for (one a shrinking
	// re-clustering that rolled back never touched) is supervised again.
	now := time.Now()
	for _, s := range m.table().slots {
		if s.sup.Owned() && !m.owned(s.id) {
			m.do(s, s.sup.Release(now))
		}
	}
	st := m.dep.Status()
	m.metrics.deploys.WithLabelValues(string(st.State)).Inc()
	m.metrics.deployDur.Observe(st.Finished.Sub(st.Started).Seconds())
	m.log.Info("deploy finished", "deploy", st.ID, "generation", st.Generation, "state", st.State, "reason", st.Reason,
		"took", st.Finished.Sub(st.Started).Round(time.Millisecond))
	m.pruneSpecs()
}

// pruneSpecs forgets the commands of generations nothing runs or may respawn
// any more, so that a manager deploying for months keeps a few, not one per
// deploy.
func (m *Manager) pruneSpecs() {
	used := m.usedGenerations()
	for g := range m.specs {
		if !used[g] {
			delete(m.specs, g)
		}
	}
}

// genRoutes is the routing table in the generation package's terms.
func (m *Manager) genRoutes(t *routeTable) *generation.Routes {
	refs := make([]generation.ProcRef, 0, len(t.procs))
	for _, p := range t.procs {
		if p != nil {
			refs = append(refs, p.ref())
		}
	}
	return generation.NewRoutes(t.topo).WithAll(refs)
}

// actuator carries out a deploy's decisions on the manager. Its methods run
// on the event loop (the deploy is fed only from there). resume: the deploy
// is a resume-handoff one, whose new processes are handed their shards'
// resume state.
type actuator struct {
	m      *Manager
	resume bool
}

// slotFor returns the slot a deploy means by cluster of topo: one of the
// table in force, or of the table a re-clustering is building, whose slots
// are the deploy's from the start.
func (a actuator) slotFor(cluster int, topo generation.Topology) *slot {
	m := a.m
	if t := m.table(); t.topo == topo {
		return t.slots[cluster]
	}
	if m.next == nil || m.next.topo != topo {
		m.next = newRouteTable(topo, m.gen, &m.rules)
		now := time.Now()
		for _, s := range m.next.slots {
			s.sup.Take(now)
		}
	}
	return m.next.slots[cluster]
}

func (a actuator) Spawn(cluster int, gen int64, topo generation.Topology) (generation.ProcRef, error) {
	m := a.m
	s := a.slotFor(cluster, topo)
	// A process of this cluster that is not serving yet (restarting after a
	// crash) is superseded: the deploy's process replaces it.
	m.do(s, s.sup.DeploySpawning(time.Now()))
	p, err := m.spawn(s, gen, discord.ReasonDeploy)
	if err != nil {
		// The deploy's reason goes to the public feed: the detail only to the
		// DEBUG log.
		m.logSpawnFailure(s, gen, err)
		return generation.ProcRef{}, errors.New(publicSpawnFailure(err))
	}
	p.resumes = a.resume // before its REGISTER, which the loop answers after this
	m.do(s, s.sup.DeploySpawned(time.Now(), p))
	return p.ref(), nil
}

// Route publishes the deploy's routing changes, cluster by cluster through
// each one's supervision, or, for a new topology, as one switch.
func (a actuator) Route(update func(*generation.Routes) *generation.Routes) {
	m := a.m
	cur := m.table()
	next := update(m.genRoutes(cur))
	if next.Topology != cur.topo {
		a.switchTable(next)
		return
	}
	now := time.Now()
	for c, was := range cur.procs {
		ref, ok := next.Routed(c)
		var p *proc
		switch {
		case !ok:
		case was != nil && was.seq == ref.Seq:
			p = was // unchanged (it may be exiting, and gone from m.procs)
		default:
			p = m.procs[ref.Seq]
		}
		if p != was {
			s := cur.slots[c]
			m.do(s, s.sup.DeployRouted(now, p, p != nil))
		}
	}
}

// switchTable is the re-clustering switch: the whole table, with the new
// topology and slots, is published at once. Requests that waited in old slots
// are routed again by their targets under the new topology.
func (a actuator) switchTable(next *generation.Routes) {
	m := a.m
	old := m.table()
	nt := m.next
	if nt == nil || nt.topo != next.Topology {
		m.log.Error("re-clustering switch to a table that was never built", "topology", next.Topology.String())
		return
	}
	procs := make([]*proc, len(nt.slots))
	for c := range procs {
		if ref, ok := next.Routed(c); ok {
			procs[c] = m.procs[ref.Seq]
		}
	}
	now := time.Now()
	for _, s := range old.slots {
		// A cluster of the old topology that was restarting has a process
		// nobody routes: the new topology replaces it.
		m.do(s, s.sup.Retire(now))
	}
	for _, s := range old.slots {
		s.mu.Lock()
	}
	m.routes.Store(&routeTable{topo: nt.topo, procs: procs, slots: nt.slots})
	var waiting []*pending
	for _, s := range old.slots {
		s.retired = true
		waiting = append(waiting, s.waiting...)
		s.waiting = nil
		s.mu.Unlock()
	}
	for c, s := range nt.slots {
		if procs[c] != nil {
			s.sup.Switched(now, procs[c])
		}
	}
	m.next = nil
	m.log.Info("routing switched to the new topology", "topology", nt.topo.String())
	m.feed.publish(m.snapshotEvent(EventTopology))
	for _, p := range waiting {
		if !p.done.Load() {
			m.redispatch(p)
		}
	}
}

// procOf is the live process ref names, if any.
func (a actuator) procOf(ref generation.ProcRef) *proc { return a.m.procs[ref.Seq] }

func (a actuator) Quiesce(ref generation.ProcRef) {
	if p := a.procOf(ref); p != nil {
		a.m.do(p.slot, p.slot.sup.Quiesce(time.Now(), p))
	}
}

func (a actuator) Stop(ref generation.ProcRef) {
	if p := a.procOf(ref); p != nil {
		a.m.do(p.slot, p.slot.sup.Stop(time.Now(), p, "deploy"))
	}
}

func (a actuator) Activate(ref generation.ProcRef) {
	if p := a.procOf(ref); p != nil {
		a.m.do(p.slot, p.slot.sup.Activate(time.Now(), p))
	}
}

// Release hands a cluster back to supervision: its routed process becomes
// the supervised one; with none, the cluster is respawned at its generation.
func (a actuator) Release(cluster int) {
	m := a.m
	t := m.table()
	if cluster < 0 || cluster >= len(t.slots) {
		return
	}
	s := t.slots[cluster]
	if p := t.procs[cluster]; p != nil {
		s.gen = p.gen
	}
	m.do(s, s.sup.Release(time.Now()))
}
