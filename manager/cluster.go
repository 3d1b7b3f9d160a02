package manager

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sm-supervisor/sm/discord"
	"github.com/sm-supervisor/sm/generation"
	"github.com/sm-supervisor/sm/ipc"
	"github.com/sm-supervisor/sm/supervise"
	"github.com/sm-supervisor/sm/unixsock"
)

// slot is one cluster of the topology: its shard range, its generation (the
// code version it runs) and its restart history. Loop-owned except waiting.
type slot struct {
	id          int
	first, last int
	topo        generation.Topology
	gen         int64 // the generation its processes run; a respawn keeps it
	owned       bool  // a deploy is moving this cluster: supervision leaves it alone
	dirty       bool  // its state changed since the feed last heard
	hist        supervise.History
	current     *proc // the process supervised for this cluster, nil between restarts
	restartAt   time.Time
	restartTmr  *time.Timer
	lastExit    string // how its last process ended, or why it did not start: for STATUS
	lastExitPub string // the same for the public feed: no path, argument or environment

	mu      sync.Mutex
	waiting []*pending // requests that arrived while the cluster had no routed process
	retired bool       // replaced by a re-clustering: requests go to the new table
}

// deployOwns reports whether a running deploy is moving cluster s, so that
// supervision must leave it alone: from the deploy's start (not only from
// its first spawn for s) until it releases s.
func (m *Manager) deployOwns(s *slot) bool {
	if s.owned {
		return true
	}
	return m.dep != nil && s.topo == m.table().topo && m.table().slots[s.id] == s && m.dep.Owns(s.id)
}

// retiredNow reads retired under the lock.
func (s *slot) retiredNow() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.retired
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
	seq       uint64
	cluster   int
	slot      *slot
	gen       int64
	tokenHash string // sha256 of its SM_TOKEN: all the state file keeps
	startTime uint64 // kernel start time: pid + start time name it for good
	adopted   bool   // survived a manager restart; watched through a pidfd
	wasRouted bool   // adopted and routed when the previous manager died
	stale     bool   // adopted but no longer its cluster's process: quiesced
	// reason is why it was spawned, for the identify budget: a first start, a
	// restart after a death (what a crash loop spends), or a deploy.
	reason discord.Reason
	// identWaiting holds the shards with an IDENTIFY waiting in the gate.
	identWaiting map[int]bool
	process      supervise.Process
	spawned      time.Time

	conn atomic.Pointer[conn] // set while registered; read by the hot path
	dead atomic.Bool          // exited or disconnected: never route to it
	// frames counts the frames the reader got from the process: a process
	// busy answering a flood is alive even if its heartbeat is queued behind
	// its replies. The loop notes on each tick when the count last moved
	// (framesSeen, seenAt), which spares the reader a clock read per frame.
	frames atomic.Uint64
	// beats is what its heartbeats left for the loop (heartbeat.go).
	beats beatBox

	sendMu     sync.RWMutex // held (read) by every send to the process
	sendClosed bool         // QUIESCE sent: requests go elsewhere

	// Loop-owned.
	state     procState
	activated bool
	lastBeat  time.Time
	// framesSeen is frames as of the tick that last saw it move, at seenAt.
	framesSeen uint64
	seenAt     time.Time
	beat       json.RawMessage // last heartbeat payload, passed through unread
	quiesced   bool
}

// usable reports whether requests may be sent to p now.
func (p *proc) usable() bool { return p != nil && !p.dead.Load() && p.conn.Load() != nil }

func (p *proc) pid() int { return p.process.PID() }

func (p *proc) ref() generation.ProcRef {
	return generation.ProcRef{Cluster: p.cluster, Generation: p.gen, Seq: p.seq}
}

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

type evQuiesced struct {
	p      *proc
	resume json.RawMessage
}

type evDisconnect struct {
	p *proc
	c *conn
}

type evExit struct{ p *proc }

type evRestart struct{ s *slot }

// respawn starts the supervised process of s at its generation.
func (m *Manager) respawn(s *slot) {
	if m.stopping.Load() || m.deployOwns(s) || s.current != nil {
		return
	}
	reason := discord.ReasonRestart
	if s.hist.Total == 0 && !m.restarted {
		reason = discord.ReasonStart
	}
	p, err := m.spawn(s, s.gen, reason)
	if err != nil {
		m.log.Error("spawn failed", "cluster", s.id, "generation", s.gen, "err", err)
		s.lastExit, s.lastExitPub = err.Error(), publicSpawnFailure(err)
		m.scheduleRestart(s)
		return
	}
	s.current = p
}

// spawn starts a process for cluster s running generation gen's spec, with
// the environment of the protocol and a fresh token.
func (m *Manager) spawn(s *slot, gen int64, reason discord.Reason) (*proc, error) {
	sp, ok := m.specs[gen]
	if !ok {
		return nil, fmt.Errorf("no command known for generation %d", gen)
	}
	token := newToken()
	p := &proc{seq: m.procSeq.Add(1), cluster: s.id, slot: s, gen: gen, tokenHash: hashToken(token), spawned: time.Now(), reason: reason}
	env := append([]string{
		"SM_SOCKET=" + m.cfg.Socket,
		"SM_CLUSTER=" + strconv.Itoa(s.id),
		"SM_GENERATION=" + strconv.FormatInt(gen, 10),
		"SM_SHARD_FIRST=" + strconv.Itoa(s.first),
		"SM_SHARD_LAST=" + strconv.Itoa(s.last),
		"SM_TOTAL_SHARDS=" + strconv.Itoa(s.topo.Total),
		"SM_TOKEN=" + token,
	}, sp.env...)
	process, err := m.spawner.Spawn(supervise.Spec{Argv: sp.argv, Env: env, Dir: sp.dir})
	if err != nil {
		return nil, err
	}
	p.process = process
	p.lastBeat = p.spawned
	p.startTime, _ = supervise.StartTime(process.PID())
	m.procs[p.seq] = p
	m.liveProcs.Add(1)
	m.touch(s)
	m.log.Info("cluster spawned", "cluster", s.id, "generation", gen, "pid", process.PID(), "shards", fmt.Sprintf("%d-%d", s.first, s.last))
	m.watchExit(p)
	return p, nil
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
	var p *proc
	hash := []byte(hashToken(f.Token))
	for _, cand := range m.procs {
		if cand.cluster == id && cand.gen == gen && subtle.ConstantTimeCompare([]byte(cand.tokenHash), hash) == 1 {
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
	s := p.slot
	m.touch(s)
	m.log.Info("cluster registered", "cluster", id, "generation", gen, "pid", p.pid(), "conn", c.id)
	reply := map[string]any{
		"cluster":               id,
		"generation":            gen,
		"shard_first":           s.first,
		"shard_last":            s.last,
		"total_shards":          s.topo.Total,
		"active":                p.activated,
		"heartbeat_interval_ms": m.cfg.Heartbeat.Interval.Milliseconds(),
		"heartbeat_timeout_ms":  m.cfg.Heartbeat.Timeout.Milliseconds(),
		"identify": map[string]any{
			"gate":            true,
			"spacing_ms":      m.disc.gate.Spacing().Milliseconds(),
			"max_concurrency": m.disc.gate.MaxConcurrency(),
		},
	}
	m.registerFields(reply, p) // start, resume, gateway (identify.go)
	payload, _ := json.Marshal(reply)
	return registerResult{payload: payload}
}

// becameReady routes a ready process that is its slot's current one and, at
// first start or after a restart, ACTIVATEs it, unless another process of
// the cluster still runs: a stale survivor after a manager restart, whose
// exit then brings the ACTIVATE (maybeActivate). A survivor's first ready
// heartbeat can be taken on a tick before its evRegistered.
func (m *Manager) becameReady(p *proc) {
	s := p.slot
	if s.current != p || m.deployOwns(s) {
		return
	}
	m.setRoute(s, p)
	m.maybeActivate(s)
}

func (m *Manager) activate(p *proc) {
	// A process told to stop taking work is never made the active one.
	if p.activated || p.state >= procQuiescing {
		return
	}
	if m.activationWaits(p) {
		return // a quiesced predecessor's handoff may be on the way (handoff.go)
	}
	m.sendActivate(p) // with the cluster's handoff, if one waits
	p.activated = true
	m.touch(p.slot)
	m.persist()
	m.log.Info("cluster activated", "cluster", p.cluster, "generation", p.gen, "pid", p.pid())
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

func (e evQuiesced) apply(m *Manager) {
	m.drainBeat(e.p) // its last heartbeats' resume state first
	m.takeResume(e.p, e.resume, time.Now())
	if !e.p.quiesced {
		e.p.quiesced = true
		m.log.Info("cluster quiesced", "cluster", e.p.cluster, "generation", e.p.gen, "pid", e.p.pid())
		if m.dep != nil {
			m.dep.Quiesced(e.p.ref())
			m.depFed = true
		}
	}
}

// apply of evDisconnect: a cluster that loses its connection without exiting
// is treated as dead: it is stopped, and its exit brings the restart.
func (e evDisconnect) apply(m *Manager) {
	p := e.p
	if p.conn.Load() != e.c {
		return
	}
	m.drainBeat(p) // what it said before it went
	p.conn.Store(nil)
	m.unroute(p)
	m.cancelIdentifies(p)
	m.handoffDrained(p) // its last frames are read: an ACTIVATE may go out
	if p.state >= procStopping {
		return
	}
	if p.state == procQuiescing && p.quiesced {
		return // it said goodbye and is exiting; its exit is awaited
	}
	// A process that died closes its socket a moment before the kernel's
	// exit notice reaches the loop: give that notice a moment before
	// treating the process as alive but disconnected.
	time.AfterFunc(disconnectGrace, func() { m.post(evDisconnected{p: p}) })
}

// disconnectGrace is how long a disconnected process may take to be seen
// exiting before it is stopped as a live one that lost its connection.
const disconnectGrace = 100 * time.Millisecond

type evDisconnected struct{ p *proc }

func (e evDisconnected) apply(m *Manager) {
	p := e.p
	if p.state >= procStopping || p.conn.Load() != nil {
		return // exited meanwhile (procExited), or already being stopped
	}
	m.log.Warn("cluster disconnected without exiting; stopping it", "cluster", p.cluster, "generation", p.gen, "pid", p.pid())
	m.stop(p, "disconnected")
}

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

// routedNow reports whether the table in force routes to p.
func (m *Manager) routedNow(p *proc) bool {
	t := m.table()
	return p.cluster < len(t.slots) && t.slots[p.cluster] == p.slot && t.procs[p.cluster] == p
}

func (e evExit) apply(m *Manager) {
	p := e.p
	m.drainBeat(p) // what it said before it died
	wasStopping := p.state >= procQuiescing
	p.state = procExited
	delete(m.procs, p.seq)
	m.liveProcs.Add(-1)
	m.cancelIdentifies(p)
	m.touch(p.slot)
	if c := p.conn.Load(); c != nil {
		// Its last replies may still sit unread in the socket: the reader
		// drains them, reaches EOF, and its disconnect fails what is left.
		// A descendant holding the socket open must not stall that forever.
		p.dead.Store(true)
		if m.routedNow(p) {
			m.setRoute(p.slot, nil)
		}
		time.AfterFunc(exitDrainWait, func() { c.c.Abort(errProcessExited) })
	} else {
		m.unroute(p)
	}
	s := p.slot
	status := p.process.ExitStatus()
	m.log.Info("cluster exited", "cluster", p.cluster, "generation", p.gen, "pid", p.pid(), "status", status, "expected", wasStopping)
	if m.dep != nil {
		m.dep.Exited(p.ref())
		m.depFed = true
	}
	if s.current != p {
		m.maybeActivate(s)
		return
	}
	s.current = nil
	s.lastExit, s.lastExitPub = status, status // "exit status 1", "signal: killed": nothing of the command
	if m.stopping.Load() || m.deployOwns(s) || s.retiredNow() || m.adopting {
		return // while adopting, the window's end spawns what is missing
	}
	m.scheduleRestart(s)
}

// scheduleRestart respawns s after the restart policy's delay.
func (m *Manager) scheduleRestart(s *slot) {
	d := m.policy.Next(&s.hist, time.Now(), m.rand())
	s.restartAt = time.Now().Add(d.Delay)
	m.touch(s)
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
	if !s.retiredNow() && s.current == nil {
		m.metrics.restarts.Inc()
		m.respawn(s)
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
		if n := p.frames.Load(); n != p.framesSeen {
			p.framesSeen, p.seenAt = n, now
		}
		last := p.lastBeat
		if p.seenAt.After(last) && p.state != procStarting {
			last = p.seenAt
		}
		if silent := now.Sub(last); silent > limit {
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
	m.drainBeat(p) // its resume reports still count
	p.state = procStopping
	m.touch(p.slot)
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

type evQuiesceTimeout struct{ p *proc }

func (e evQuiesceTimeout) apply(m *Manager) {
	if e.p.state == procQuiescing {
		m.log.Warn("cluster did not exit within deploy.quiesce_timeout after QUIESCE; stopping it", "cluster", e.p.cluster, "generation", e.p.gen, "pid", e.p.pid())
		m.stop(e.p, "quiesce timeout")
	}
}

// ErrNotConnected means a process has no live connection to the manager.
var ErrNotConnected = errors.New("process is not connected")

// quiesce asks p to finish its work and exit.
func (m *Manager) quiesce(p *proc) {
	if p.state >= procQuiescing {
		return
	}
	if m.routedNow(p) {
		m.setRoute(p.slot, nil)
	}
	c := p.conn.Load()
	p.sendMu.Lock()
	p.sendClosed = true
	err := ErrNotConnected
	if c != nil {
		err = c.send(&ipc.Frame{Op: ipc.OpQuiesce})
	}
	p.sendMu.Unlock()
	if err != nil {
		m.stop(p, "quiesce: not connected")
		return
	}
	p.state = procQuiescing
	m.touch(p.slot)
	// Bounded everywhere, not only in deploys: a process that never exits
	// after QUIESCE is stopped (a deploy's own deadline may come first).
	time.AfterFunc(m.cfg.Deploy.QuiesceTimeout.Duration, func() { m.post(evQuiesceTimeout{p: p}) })
	m.log.Info("quiesce sent", "cluster", p.cluster, "generation", p.gen, "pid", p.pid())
}

// shutdown quiesces every process, waits for their exits up to
// shutdown.timeout, stops the rest, and waits for the kernel to confirm.
func (m *Manager) shutdown() {
	m.log.Info("shutting down: quiescing clusters", "processes", len(m.procs))
	if m.dep != nil && !m.dep.Done() {
		m.dep.Abort("manager shutting down")
		m.depFed = true
	}
	for _, s := range m.table().slots {
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
			switch ev := ev.(type) {
			case evRestart:
				continue // no respawns while stopping
			case evRegister:
				ev.res <- registerResult{err: ipc.Errorf(ipc.CodeShuttingDown, "manager is shutting down")}
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
