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
	ev := evDeploy{f: f, res: make(chan registerResult, 1)}
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
	res := ev.res
	m.post(ev)
	var r registerResult
	select {
	case r = <-res:
	case <-m.done:
		r.err = ipc.Errorf(ipc.CodeShuttingDown, "manager is shutting down")
	}
	if r.err != nil {
		c.send(ipc.ReplyError(f.ID, r.err))
		return
	}
	c.reply(f.ID, r.payload)
}

type evDeploy struct {
	f   *ipc.Frame
	cfg *config.Config
	err *ipc.Error
	gw  *discord.GatewayBot
	res chan registerResult
}

func (e evDeploy) apply(m *Manager) {
	if e.gw != nil {
		m.observeGateway(*e.gw)
	}
	if e.err != nil {
		e.res <- registerResult{err: e.err}
		return
	}
	e.res <- m.startDeploy(e.f, e.cfg)
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
	}
	d, err := generation.NewDeploy(plan, time.Now, actuator{m})
	if err != nil {
		return registerResult{err: ipc.Errorf(ipc.CodeBadFrame, "%v", err)}
	}
	m.specs[gen] = sp
	m.gen = gen
	m.dep = d
	m.next = nil
	m.log.Info("deploy started", "deploy", plan.ID, "generation", gen, "from", plan.From.String(), "to", plan.To.String(),
		"clusters", f.Clusters, "max_parallel", maxPar)
	d.Start()
	m.depFed = true
	m.deployProgress()
	payload, _ := json.Marshal(map[string]any{
		"deploy_id":    plan.ID,
		"generation":   gen,
		"from":         plan.From,
		"to":           plan.To,
		"reclustering": plan.From != plan.To,
	})
	return registerResult{payload: payload}
}

// deployProgress logs a deploy's end once.
func (m *Manager) deployProgress() {
	if m.dep == nil || !m.dep.Done() || m.depLogged == m.dep {
		return
	}
	m.depLogged = m.dep
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
// on the event loop (the deploy is fed only from there).
type actuator struct{ m *Manager }

// slotFor returns the slot a deploy means by cluster of topo: one of the
// table in force, or of the table a re-clustering is building.
func (a actuator) slotFor(cluster int, topo generation.Topology) *slot {
	m := a.m
	if t := m.table(); t.topo == topo {
		return t.slots[cluster]
	}
	if m.next == nil || m.next.topo != topo {
		m.next = newRouteTable(topo, m.gen)
		for _, s := range m.next.slots {
			s.owned = true
		}
	}
	return m.next.slots[cluster]
}

func (a actuator) Spawn(cluster int, gen int64, topo generation.Topology) (generation.ProcRef, error) {
	m := a.m
	s := a.slotFor(cluster, topo)
	s.owned = true
	if s.restartTmr != nil {
		s.restartTmr.Stop()
		s.restartTmr = nil
	}
	// A process of this cluster that is not serving yet (restarting after a
	// crash) is superseded: the deploy's process replaces it.
	if cur := s.current; cur != nil && m.table().procs[s.id] != cur && cur.slot == s && topo == m.table().topo {
		m.stop(cur, "superseded by deploy")
	}
	p, err := m.spawn(s, gen, discord.ReasonDeploy)
	if err != nil {
		// The deploy's reason goes to the public feed: the detail only here.
		m.log.Error("spawn failed", "cluster", s.id, "generation", gen, "err", err)
		return generation.ProcRef{}, errors.New(publicSpawnFailure(err))
	}
	return p.ref(), nil
}

func (a actuator) Route(update func(*generation.Routes) *generation.Routes) {
	m := a.m
	cur := m.table()
	next := update(m.genRoutes(cur))
	if next.Topology != cur.topo {
		a.switchTable(next)
		return
	}
	for c := range cur.procs {
		ref, ok := next.Routed(c)
		var p *proc
		if ok {
			p = m.procs[ref.Seq]
		}
		if p != cur.procs[c] {
			m.setRoute(cur.slots[c], p)
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
	for _, s := range old.slots {
		// A cluster of the old topology that was restarting has a process
		// nobody routes: the new topology replaces it.
		if cur := s.current; cur != nil && old.procs[s.id] != cur {
			m.stop(cur, "superseded by re-clustering")
		}
		if s.restartTmr != nil {
			s.restartTmr.Stop()
			s.restartTmr = nil
		}
	}
	for _, s := range old.slots {
		s.mu.Lock()
		s.owned = true
	}
	m.routes.Store(&routeTable{topo: nt.topo, procs: procs, slots: nt.slots})
	var waiting []*pending
	for _, s := range old.slots {
		s.retired = true
		waiting = append(waiting, s.waiting...)
		s.waiting = nil
		s.mu.Unlock()
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

func (a actuator) Quiesce(ref generation.ProcRef) {
	if p := a.m.procs[ref.Seq]; p != nil {
		a.m.quiesce(p)
	}
}

func (a actuator) Stop(ref generation.ProcRef) {
	if p := a.m.procs[ref.Seq]; p != nil {
		a.m.stop(p, "deploy")
	}
}

func (a actuator) Activate(ref generation.ProcRef) {
	if p := a.m.procs[ref.Seq]; p != nil {
		a.m.activate(p)
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
	s.owned = false
	m.touch(s)
	if p := t.procs[cluster]; p != nil {
		s.current = p
		s.gen = p.gen
		return
	}
	if s.current != nil && s.current.state < procStopping {
		return // still the old one, serving or about to
	}
	s.current = nil
	m.respawn(s)
}
