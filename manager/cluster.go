package manager

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sm-supervisor/sm/ipc"
	"github.com/sm-supervisor/sm/supervise"
	"github.com/sm-supervisor/sm/unixsock"
)

// slot is one cluster of the topology: its shard range, its generation (the
// code version it runs) and its restart history. Loop-owned except waiting.
type slot struct {
	id          int
	first, last int
	gen         int64
	hist        supervise.History
	current     *proc // the process supervised for this cluster, nil between restarts
	restartAt   time.Time
	restartTmr  *time.Timer
	lastExit    string
	lastExitAt  time.Time
	restartNext time.Duration

	mu      sync.Mutex
	waiting []*pending // requests that arrived while the cluster had no routed process
}

// waitingLive counts queued requests not yet completed; it drops completed
// ones so the bound counts only what really waits. Call with mu held.
func (s *slot) waitingLive() int {
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

// procState is where a process is in its life.
type procState int

const (
	procStarting   procState = iota // spawned, not registered
	procRegistered                  // registered, not (yet) ready
	procReady                       // heartbeating ready:true
	procQuiescing                   // QUIESCE sent
	procStopping                    // being stopped (TERM, grace, KILL)
	procExited                      // the kernel confirmed its exit
)

func (s procState) String() string {
	return [...]string{"starting", "registered", "ready", "quiescing", "stopping", "exited"}[s]
}

// proc is one spawned cluster process.
type proc struct {
	seq     uint64
	cluster int
	gen     int64
	token   string
	process supervise.Process
	spawned time.Time

	conn atomic.Pointer[conn] // set while registered; read by the hot path
	dead atomic.Bool          // exited or disconnected: never route to it

	// Loop-owned.
	state     procState
	activated bool
	lastBeat  time.Time
	readyAt   time.Time
	beat      json.RawMessage // last heartbeat payload, passed through unread
	quiesced  bool
}

// usable reports whether requests may be sent to p now.
func (p *proc) usable() bool { return p != nil && !p.dead.Load() && p.conn.Load() != nil }

func (p *proc) pid() int { return p.process.PID() }

// event is something for the loop to act on.
type event interface{ apply(m *Manager) }

type evRegister struct {
	c   *conn
	f   *ipc.Frame
	res chan registerResult
}

type registerResult struct {
	payload json.RawMessage
	err     *ipc.Error
}

type evHeartbeat struct {
	p       *proc
	ready   bool
	payload json.RawMessage
	at      time.Time
}

type evQuiesced struct{ p *proc }

type evDisconnect struct {
	p *proc
	c *conn
}

type evExit struct{ p *proc }

type evRestart struct{ s *slot }

// spawn starts a new process for s at its generation.
func (m *Manager) spawn(s *slot) {
	if m.stopping.Load() {
		return
	}
	token := newToken()
	p := &proc{seq: m.procSeq.Add(1), cluster: s.id, gen: s.gen, token: token, spawned: time.Now()}
	topo := m.Topology()
	env := []string{
		"SM_SOCKET=" + m.cfg.Socket,
		"SM_CLUSTER=" + strconv.Itoa(s.id),
		"SM_GENERATION=" + strconv.FormatInt(s.gen, 10),
		"SM_SHARD_FIRST=" + strconv.Itoa(s.first),
		"SM_SHARD_LAST=" + strconv.Itoa(s.last),
		"SM_TOTAL_SHARDS=" + strconv.Itoa(topo.Total),
		"SM_TOKEN=" + token,
	}
	for k, v := range m.cfg.Cluster.Env {
		env = append(env, k+"="+v)
	}
	process, err := m.spawner.Spawn(supervise.Spec{Argv: m.argv, Env: env, Dir: m.cfg.Cluster.Dir})
	if err != nil {
		m.log.Error("spawn failed", "cluster", s.id, "generation", s.gen, "err", err)
		s.lastExit, s.lastExitAt = err.Error(), time.Now()
		m.scheduleRestart(s)
		return
	}
	p.process = process
	p.lastBeat = p.spawned
	s.current = p
	m.procs[p.seq] = p
	m.log.Info("cluster spawned", "cluster", s.id, "generation", s.gen, "pid", process.PID(), "shards", fmt.Sprintf("%d-%d", s.first, s.last))
	go func() {
		<-process.Exited()
		m.post(evExit{p: p})
	}()
}

func newToken() string {
	b := make([]byte, 24)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// apply of evRegister checks a cluster's REGISTER against the process the
// manager spawned for that slot: token, generation, liveness, and the peer.
func (e evRegister) apply(m *Manager) {
	r := m.admitCluster(e.c, e.f)
	e.res <- r
}

func (m *Manager) admitCluster(c *conn, f *ipc.Frame) registerResult {
	forbidden := func(format string, args ...any) registerResult {
		m.log.Warn("cluster REGISTER refused", "conn", c.id, "peer_pid", c.cred.PID, "reason", fmt.Sprintf(format, args...))
		return registerResult{err: ipc.Errorf(ipc.CodeForbidden, format, args...)}
	}
	if f.Cluster == nil || f.Generation == nil {
		return registerResult{err: ipc.Errorf(ipc.CodeBadFrame, "cluster REGISTER needs cluster and generation")}
	}
	id, gen := *f.Cluster, *f.Generation
	if id < 0 || id >= len(m.slots) {
		return forbidden("cluster %d is not in the topology", id)
	}
	var p *proc
	for _, cand := range m.procs {
		if cand.cluster == id && cand.gen == gen && subtle.ConstantTimeCompare([]byte(cand.token), []byte(f.Token)) == 1 {
			p = cand
			break
		}
	}
	if p == nil {
		return forbidden("no process of cluster %d generation %d holds that token", id, gen)
	}
	if p.state >= procStopping || p.dead.Load() {
		return forbidden("cluster %d generation %d is being stopped", id, gen)
	}
	if p.conn.Load() != nil {
		return forbidden("cluster %d generation %d is already registered on a live connection", id, gen)
	}
	// The token could leak; the kernel's word on who connected cannot. The peer
	// must be the spawned process or one in its process group (a wrapper's child).
	if c.cred.PID != p.pid() {
		if pg, err := unixsock.ProcessGroup(c.cred.PID); err != nil || pg != p.pid() {
			return forbidden("peer pid %d is not cluster %d's process %d or its group", c.cred.PID, id, p.pid())
		}
	}
	c.proc = p
	c.role = ipc.RoleCluster
	c.name = "cluster-" + strconv.Itoa(id)
	p.conn.Store(c)
	if p.state == procStarting {
		p.state = procRegistered
	}
	p.lastBeat = time.Now()
	s := m.slots[id]
	m.log.Info("cluster registered", "cluster", id, "generation", gen, "pid", p.pid(), "conn", c.id)
	payload, _ := json.Marshal(map[string]any{
		"cluster":               id,
		"generation":            gen,
		"shard_first":           s.first,
		"shard_last":            s.last,
		"total_shards":          m.Topology().Total,
		"active":                p.activated,
		"heartbeat_interval_ms": m.cfg.Heartbeat.Interval.Milliseconds(),
		"heartbeat_timeout_ms":  m.cfg.Heartbeat.Timeout.Milliseconds(),
	})
	return registerResult{payload: payload}
}

func (e evHeartbeat) apply(m *Manager) {
	p := e.p
	if p.state >= procStopping {
		return
	}
	p.lastBeat = e.at
	p.beat = e.payload
	if e.ready && p.state == procRegistered {
		p.state = procReady
		p.readyAt = e.at
		m.log.Info("cluster ready", "cluster", p.cluster, "generation", p.gen, "pid", p.pid(), "after", e.at.Sub(p.spawned).Round(time.Millisecond))
		m.becameReady(p)
	}
	s := m.slots[p.cluster]
	if p.state == procReady && s.current == p && m.policy.Recovered(&s.hist, p.spawned, e.at) {
		m.log.Info("cluster left crash loop", "cluster", p.cluster, "generation", p.gen)
	}
}

// becameReady routes a ready process that is its slot's current one and, at
// first start or after a restart, ACTIVATEs it.
func (m *Manager) becameReady(p *proc) {
	s := m.slots[p.cluster]
	if s.current != p {
		return
	}
	m.setRoute(p.cluster, p)
	m.activate(p)
}

func (m *Manager) activate(p *proc) {
	if p.activated {
		return
	}
	if c := p.conn.Load(); c != nil {
		c.send(&ipc.Frame{Op: ipc.OpActivate})
	}
	p.activated = true
	m.log.Info("cluster activated", "cluster", p.cluster, "generation", p.gen, "pid", p.pid())
}

// setRoute publishes a routing table with cluster routed to p (nil: none) and,
// if p can serve, hands it the requests that waited.
func (m *Manager) setRoute(cluster int, p *proc) {
	s := m.slots[cluster]
	s.mu.Lock()
	old := m.routes.Load()
	procs := append([]*proc(nil), old.procs...)
	procs[cluster] = p
	m.routes.Store(&routeTable{topo: old.topo, procs: procs})
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

func (e evQuiesced) apply(m *Manager) {
	if !e.p.quiesced {
		e.p.quiesced = true
		m.log.Info("cluster quiesced", "cluster", e.p.cluster, "generation", e.p.gen, "pid", e.p.pid())
	}
}

// apply of evDisconnect: a cluster that loses its connection without exiting
// is treated as dead: it is stopped, and its exit brings the restart.
func (e evDisconnect) apply(m *Manager) {
	p := e.p
	if p.conn.Load() != e.c {
		return
	}
	p.conn.Store(nil)
	m.unroute(p)
	if p.state >= procStopping {
		return
	}
	if p.state == procQuiescing && p.quiesced {
		return // it said goodbye and is exiting; its exit is awaited
	}
	m.log.Warn("cluster disconnected without exiting; stopping it", "cluster", p.cluster, "generation", p.gen, "pid", p.pid())
	m.stop(p, "disconnected")
}

// unroute takes a process that can no longer serve out of the routing table
// and fails the requests it held.
func (m *Manager) unroute(p *proc) {
	p.dead.Store(true)
	if m.routes.Load().procs[p.cluster] == p {
		m.setRoute(p.cluster, nil)
	}
	m.failProcPending(p)
}

func (e evExit) apply(m *Manager) {
	p := e.p
	wasStopping := p.state >= procQuiescing
	p.state = procExited
	delete(m.procs, p.seq)
	if c := p.conn.Load(); c != nil {
		c.c.Close()
		p.conn.Store(nil)
	}
	m.unroute(p)
	s := m.slots[p.cluster]
	status := p.process.ExitStatus()
	m.log.Info("cluster exited", "cluster", p.cluster, "generation", p.gen, "pid", p.pid(), "status", status, "expected", wasStopping && m.stopping.Load())
	if s.current != p {
		return
	}
	s.current = nil
	s.lastExit, s.lastExitAt = status, time.Now()
	if m.stopping.Load() {
		return
	}
	m.scheduleRestart(s)
}

// scheduleRestart respawns s after the restart policy's delay.
func (m *Manager) scheduleRestart(s *slot) {
	d := m.policy.Next(&s.hist, time.Now(), m.rand())
	s.restartNext = d.Delay
	s.restartAt = time.Now().Add(d.Delay)
	if d.CrashLoop {
		m.log.Error("cluster in crash loop; retrying at the backoff ceiling", "cluster", s.id, "generation", s.gen,
			"restarts_in_period", len(s.hist.Restarts), "delay", d.Delay.Round(time.Millisecond))
	} else {
		m.log.Info("cluster restart scheduled", "cluster", s.id, "generation", s.gen, "delay", d.Delay.Round(time.Millisecond))
	}
	s.restartTmr = time.AfterFunc(d.Delay, func() { m.post(evRestart{s: s}) })
}

func (e evRestart) apply(m *Manager) {
	s := e.s
	s.restartTmr = nil
	if s.current == nil {
		m.spawn(s)
	}
}

// checkHeartbeats stops processes whose heartbeats stopped: a hung process is
// killed and replaced.
func (m *Manager) checkHeartbeats(now time.Time) {
	for _, p := range m.procs {
		var limit time.Duration
		switch p.state {
		case procStarting:
			limit = m.cfg.Heartbeat.StartTimeout.Duration
		case procRegistered, procReady:
			limit = m.cfg.Heartbeat.Timeout.Duration
		default:
			continue
		}
		if silent := now.Sub(p.lastBeat); silent > limit {
			m.log.Warn("cluster missed heartbeats; stopping it", "cluster", p.cluster, "generation", p.gen, "pid", p.pid(), "silent", silent.Round(time.Millisecond))
			m.stop(p, "heartbeat timeout")
		}
	}
}

// stop ends p: SIGTERM, grace, SIGKILL. Its confirmed exit arrives as evExit.
func (m *Manager) stop(p *proc, reason string) {
	if p.state >= procStopping {
		return
	}
	p.state = procStopping
	m.unroute(p)
	m.log.Info("stopping cluster", "cluster", p.cluster, "generation", p.gen, "pid", p.pid(), "reason", reason)
	grace := m.cfg.Restart.StopGrace.Duration
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

// quiesce asks p to finish its work and exit.
func (m *Manager) quiesce(p *proc) {
	if p.state >= procQuiescing {
		return
	}
	c := p.conn.Load()
	if c == nil || c.send(&ipc.Frame{Op: ipc.OpQuiesce}) != nil {
		m.stop(p, "quiesce: not connected")
		return
	}
	p.state = procQuiescing
	m.log.Info("quiesce sent", "cluster", p.cluster, "generation", p.gen, "pid", p.pid())
}

// shutdown quiesces every process, waits for their exits up to
// shutdown.timeout, stops the rest, and waits for the kernel to confirm.
func (m *Manager) shutdown() {
	m.log.Info("shutting down: quiescing clusters", "processes", len(m.procs))
	for _, s := range m.slots {
		if s.restartTmr != nil {
			s.restartTmr.Stop()
		}
	}
	for _, p := range m.procs {
		if p.state == procStarting {
			m.stop(p, "shutdown")
			continue
		}
		m.quiesce(p)
	}
	deadline := time.NewTimer(m.cfg.Shutdown.Timeout.Duration)
	defer deadline.Stop()
	forced := false
	for len(m.procs) > 0 {
		select {
		case ev := <-m.events:
			switch ev.(type) {
			case evRestart:
				continue // no respawns while stopping
			case evRegister:
				ev.(evRegister).res <- registerResult{err: ipc.Errorf(ipc.CodeShuttingDown, "manager is shutting down")}
				continue
			}
			ev.apply(m)
		case <-deadline.C:
			if forced {
				m.log.Error("processes did not exit after SIGKILL", "left", len(m.procs))
				return
			}
			forced = true
			m.log.Warn("shutdown timeout: stopping clusters that did not quiesce", "left", len(m.procs))
			for _, p := range m.procs {
				m.stop(p, "shutdown timeout")
			}
			deadline.Reset(m.cfg.Restart.StopGrace.Duration + 5*time.Second)
		}
	}
	m.log.Info("all clusters stopped")
}

// deploy is the DEPLOY op. Rolling deploys arrive with the generation machine.
func (m *Manager) deploy(c *conn, f *ipc.Frame) {
	if c.proc != nil {
		c.replyErr(f.ID, ipc.CodeForbidden, "DEPLOY is for client connections")
		return
	}
	c.replyErr(f.ID, ipc.CodeUnavailable, "deploys are not available in this build")
}
