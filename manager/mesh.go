package manager

import (
	"context"
	"slices"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sm-supervisor/sm/ipc"
	"github.com/sm-supervisor/sm/mesh"
)

// A manager in a mesh (docs/multihost.md): its mesh.Agent takes, renews and
// fences leases, and the loop supervises only the clusters this host holds.
// The agent's decisions reach the loop as evMeshHold events; the clusters'
// supervision (supervise.Cluster.Hold) decides what a lease held or lost
// means for their processes.

// meshState is a manager's part of a mesh; nil on a single host.
type meshState struct {
	nc    *nats.Conn
	store *mesh.Store
	agent *mesh.Agent
	disc  *meshDiscord // the shared identify gate, budget and resume store (meshdiscord.go)

	// Loop-owned: the agent's Stop calls waiting, per cluster, for every
	// process of the cluster to be confirmed gone.
	fences map[int][]chan struct{}
	// prev is the previous boot of this host, from the state file: its
	// leases are taken over at start (mesh.Agent.TakeOver).
	prev mesh.Holder

	// The feed's view of the mesh (meshfeed.go): viewPosted while an
	// evMeshView waits for the loop; the rest loop-owned.
	viewPosted atomic.Bool
	hostsKey   string         // the hosts as last published, lease ages left out
	hostsDirty bool           // the hosts changed since the last hosts event
	owners     map[int]string // each cluster's holder as last published
	// groups are the live processes by cluster, for the watchdog's kill
	// (meshfence.go); not loop-owned.
	groups procGroups
}

// joinMesh connects to the mesh's NATS server and opens its buckets, so
// that a manager that cannot join (refused credentials: mesh.ErrRefused, no
// server, another lease) refuses to start, having joined nothing: its host
// record is written only once Run runs the agent.
func (m *Manager) joinMesh() error {
	cfg := m.cfg.Mesh
	nc, err := mesh.Connect(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Lease.Duration)
	defer cancel()
	st, err := mesh.Open(ctx, nc, cfg.Name, cfg.Lease.Duration, mesh.Replicas(cfg.Replicas))
	topo := m.table().topo
	mtopo := mesh.Topology{TotalShards: topo.Total, ShardsPerCluster: topo.PerCluster}
	digest := mesh.ClusterDigest(m.cfg.Cluster.Command, m.cfg.Cluster.Env, m.cfg.Cluster.Dir)
	if err == nil {
		err = checkSameConfig(ctx, st, mesh.HostRecord{Holder: mesh.Holder{Host: cfg.HostID}, Topology: mtopo, Cluster: digest})
	}
	var md *meshDiscord
	if err == nil {
		md, err = m.openMeshDiscord(ctx, st)
	}
	if err != nil {
		nc.Close()
		return err
	}
	ms := &meshState{nc: nc, store: st, fences: map[int][]chan struct{}{}, disc: md}
	ms.agent = &mesh.Agent{
		Store:    st,
		Me:       mesh.Holder{Host: cfg.HostID, Boot: mesh.NewBootID()},
		Capacity: cfg.MaxClusters,
		Topology: mtopo,
		Cluster:  digest,
		Log:      m.log,
		Start:    func(c int) { m.post(evMeshHold{cluster: c, held: true}) },
		Stop:     m.meshStop,
		Viewed:   m.meshViewed,
		Kill:     m.meshKill,
	}
	m.mesh = ms
	m.router = newRouter(m, nc, ms.agent.Me, st)
	return nil
}

// checkSameConfig refuses to join a mesh whose live hosts run another
// [topology] or [cluster] (mesh.ErrConfigMismatch, naming the difference).
// It only reads: nothing is written before the check passes. Two hosts with
// different configurations starting in the same instant both see no other
// record and are not refused; every later start is.
func checkSameConfig(ctx context.Context, st *mesh.Store, me mesh.HostRecord) error {
	hosts, err := st.Hosts(ctx)
	if err != nil {
		return err
	}
	return mesh.CheckSameConfig(me, hosts)
}

// orphanTimeout is SM_ORPHAN_TIMEOUT_MS for a mesh of lease L: L/8. A
// cluster whose manager died exits once it cannot reach the socket for
// that long; the manager's last renewal was at most a renewal interval (L/4)
// before it died, so the cluster is gone within 3L/8 (+ its own polling) of
// that write, well before the lease can expire (L) for another host.
func orphanTimeout(lease time.Duration) time.Duration { return lease / 8 }

// meshStop is the agent's Stop: it returns once every process of cluster c
// is confirmed gone (a fence is a SIGKILL of the group), or once the manager
// has stopped (when the leases are released only if none is left: see
// runMesh).
func (m *Manager) meshStop(c int) {
	done := make(chan struct{})
	m.post(evMeshHold{cluster: c, done: done})
	select {
	case <-done:
	case <-m.done:
	}
}

// runMesh starts the agent; the function it returns stops it and closes the
// connection. With release it lets the agent release the leases (their
// clusters' processes are confirmed gone); without, it closes the connection
// first, so the leases are left to expire: some process may still be alive.
func (m *Manager) runMesh() (stop func(release bool)) {
	taken := m.succeed()
	now := time.Now()
	for _, s := range m.table().slots {
		// A previous boot's survivors are fenced, but for the clusters
		// whose leases this boot took over: those are adopted.
		m.setRemote(s, !taken[s.id])
		m.do(s, s.sup.Hold(now, taken[s.id]))
	}
	m.mesh.disc.start(m.mesh.agent.Me)
	if err := m.router.start(); err != nil {
		m.log.Error("mesh: cross-host routing not started: requests for other hosts' clusters fail", "err", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := m.mesh.agent.Run(ctx); err != nil {
			m.log.Error("mesh: agent stopped", "err", err)
		}
	}()
	return func(release bool) {
		m.router.stop()
		m.mesh.disc.stop() // before the leases go: the resume state written first
		if !release {
			m.log.Warn("mesh: leaving without releasing leases: a cluster process was not confirmed gone")
			m.mesh.nc.Close()
		}
		cancel()
		<-done
		m.mesh.nc.Close()
	}
}

// succeed takes over the leases of this host's previous boot, if the state
// file named one (restore), and returns the clusters this boot now holds.
// It runs before the loop, bounded by half a lease: the survivors waiting
// to register count their SM_ORPHAN_TIMEOUT_MS meanwhile.
func (m *Manager) succeed() map[int]bool {
	prev := m.mesh.prev
	if prev.Boot == "" {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.Mesh.Lease.Duration/2)
	defer cancel()
	start := time.Now()
	held, err := m.mesh.agent.TakeOver(ctx, prev)
	if err != nil {
		m.log.Warn("mesh: some of the previous boot's leases were not taken over; their clusters are fenced", "previous_boot", prev.Boot, "err", err)
	}
	m.log.Info("mesh: took over the previous boot's leases: adopting its clusters", "previous_boot", prev.Boot, "boot", m.mesh.agent.Me.Boot,
		"clusters", held, "took", time.Since(start).Round(time.Millisecond))
	taken := map[int]bool{}
	for _, c := range held {
		taken[c] = true
	}
	return taken
}

// meshHold carries out the agent's decision about cluster c: held, it may
// run here; not held, its processes are killed, and done (if any) is closed
// once they are all gone.
func (m *Manager) meshHold(c int, held bool, done chan struct{}) {
	t := m.table()
	if c < 0 || c >= len(t.slots) {
		if done != nil {
			close(done)
		}
		return
	}
	if m.resumeFirst(c, held) {
		return // spawned once its shards' resume state is read
	}
	s := t.slots[c]
	if held {
		s.fenced.Store(false)
		m.log.Info("mesh: cluster held here: supervising it", "cluster", c)
	} else {
		m.log.Info("mesh: cluster not held here: stopping it", "cluster", c)
	}
	m.setRemote(s, !held)
	m.do(s, s.sup.Hold(time.Now(), held))
	m.touch(s)
	if done != nil {
		m.mesh.fences[c] = append(m.mesh.fences[c], done)
	}
	m.fenceDone(s)
}

// fenceDone closes the fences waiting on s once its processes are all gone.
func (m *Manager) fenceDone(s *slot) {
	if m.mesh == nil || !s.sup.Empty() {
		return
	}
	for _, d := range m.mesh.fences[s.id] {
		close(d)
	}
	delete(m.mesh.fences, s.id)
}

// setRemote marks s as held elsewhere (or not): requests for it are then
// answered unavailable at once, those waiting for it too.
func (m *Manager) setRemote(s *slot, remote bool) {
	s.mu.Lock()
	s.remote.Store(remote)
	var waiting []*pending
	if remote {
		waiting, s.waiting = s.waiting, nil
	}
	s.mu.Unlock()
	for _, p := range waiting {
		// To the cluster's new holder, if the watch of the leases knows it.
		h := m.hop(s.id, p)
		if h.Kind == mesh.HopLocal {
			h = mesh.Hop{Kind: mesh.HopFail, Why: "this host lost its lease"}
		}
		m.routeAway(s.id, p, h)
	}
}

// HostStatus is one host of a mesh in a Status.
type HostStatus struct {
	ID       string `json:"id"`
	Capacity int    `json:"capacity"` // mesh.max_clusters; 0 is no limit
	Clusters []int  `json:"clusters"` // the clusters it holds, as it last wrote
	// LeaseAgeMS is how long ago the host last renewed its record: the NATS
	// server's store time against this host's clock, as last read.
	LeaseAgeMS int64 `json:"lease_age_ms"`
	Self       bool  `json:"self,omitempty"` // this manager
}

// meshHosts is the hosts of the mesh as the agent last read them.
func (m *Manager) meshHosts(now time.Time) []HostStatus {
	snap := m.mesh.agent.Snapshot()
	out := make([]HostStatus, 0, len(snap.Hosts))
	for _, h := range snap.Hosts {
		hs := HostStatus{ID: h.Host, Capacity: h.Capacity, Clusters: slices.Clone(h.Clusters),
			LeaseAgeMS: max(0, now.Sub(h.Written).Milliseconds()), Self: h.Holder == m.mesh.agent.Me}
		if hs.Clusters == nil {
			hs.Clusters = []int{}
		}
		out = append(out, hs)
	}
	return out
}

// meshOwner is the host holding cluster c's lease, "" if none (or no mesh).
func (m *Manager) meshOwner(c int) string {
	if m.mesh == nil {
		return ""
	}
	h, ok := m.mesh.agent.Holder(c)
	if !ok {
		return ""
	}
	return h.Host
}

// errMeshDeploy refuses a DEPLOY in a mesh: a deploy spawns every cluster
// of the topology, and across hosts it must move each on its holder.
var errMeshDeploy = ipc.Errorf(ipc.CodeUnavailable, "DEPLOY is not supported with [mesh] yet (docs/multihost.md)")
