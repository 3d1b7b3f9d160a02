package supervise

import (
	"errors"
	"time"
)

// This file is one cluster's supervision as a pure state machine: what to do
// when a process is spawned, registers, heartbeats, falls silent, loses its
// connection, is told to leave, exits; when to respawn and when that is a
// crash loop; what an adopt window, a deploy and a shutdown change. It does
// no I/O and reads no clock: every event brings its time, and every decision
// comes back as Actions for the caller (sm-manager's event loop) to carry out.
// generation.Deploy is its model; the two meet through Take, DeploySpawning,
// DeploySpawned, DeployRouted and Release.

// State is where a cluster is, as STATUS and the state feed report it: the
// state of the process shown for it, or, with none, StateRestarting or
// StateCrashLoop. The first six are also the life of one process, in order.
type State string

// A process's states, in the order of its life, then a cluster's without one.
const (
	StateStarting   State = "starting"   // spawned, not registered
	StateRegistered State = "registered" // registered, not (yet) ready
	StateReady      State = "ready"      // heartbeating ready:true
	StateQuiescing  State = "quiescing"  // QUIESCE sent
	StateStopping   State = "stopping"   // being stopped: TERM, grace, KILL
	StateExited     State = "exited"     // the kernel confirmed its exit
	StateRestarting State = "restarting" // no process: a respawn is due, or waits for a deploy or the adopt window
	StateCrashLoop  State = "crash_loop" // no process, and restarting past the policy's intensity
)

func (s State) rank() int {
	switch s {
	case StateStarting:
		return 0
	case StateRegistered:
		return 1
	case StateReady:
		return 2
	case StateQuiescing:
		return 3
	case StateStopping:
		return 4
	default:
		return 5
	}
}

// Before reports whether a process in state s has not yet reached state t of
// its life: StateReady.Before(StateQuiescing) holds, so does any state but
// StateExited before StateExited.
func (s State) Before(t State) bool { return s.rank() < t.rank() }

// Rules are what a manager's Clusters judge by; one value serves them all.
type Rules struct {
	Policy RestartPolicy
	// StartTimeout bounds a spawned process's silence until it registers.
	StartTimeout time.Duration
	// HeartbeatTimeout bounds a registered process's silence.
	HeartbeatTimeout time.Duration
	// QuiesceTimeout bounds the time from QUIESCE to the exit.
	QuiesceTimeout time.Duration
	// DisconnectGrace is how long a process that lost its connection may
	// take to be seen exiting before it is stopped as a live one: a process
	// that died closes its socket a moment before the kernel's exit notice.
	DisconnectGrace time.Duration
	// Rand returns uniform numbers in [0, 1), the backoff's jitter.
	Rand func() float64
}

// Timer names a deadline the caller arms for a Cluster (ActArm) and reports
// back with Due.
type Timer int

// The timers a Cluster arms.
const (
	TimerRestart    Timer = iota + 1 // the cluster's respawn is due
	TimerQuiesce                     // a process has had QuiesceTimeout to exit after QUIESCE
	TimerDisconnect                  // a process that lost its connection has had DisconnectGrace to exit
)

// ActionKind says what an Action asks for.
type ActionKind int

// What a Cluster asks of its caller. Proc is the process an action is about.
const (
	// ActSpawn: start a process for the cluster at its generation, then
	// report Spawned or SpawnFailed. Restart says it is not the cluster's
	// first start (what the identify budget counts).
	ActSpawn ActionKind = iota + 1
	// ActStop: take what Proc said last (while still routed), take it out
	// of routing, fail its requests, and stop it (TERM, grace, KILL). Its
	// confirmed exit comes back as Exited. Why says why; Fault that
	// supervision judged it faulty; Silent, for a silence, how long.
	ActStop
	// ActQuiesce: stop sending Proc requests and send it QUIESCE; report a
	// failure to send with QuiesceFailed.
	ActQuiesce
	// ActRoute: route the cluster to Proc in place of any other, handing it
	// the requests that waited.
	ActRoute
	// ActUnroute: take Proc out of routing.
	ActUnroute
	// ActActivate: send Proc ACTIVATE.
	ActActivate
	// ActArm: report Due(Timer, Proc) at At (a restart: after Delay, and
	// CrashLoop reports that the cluster is in a crash loop, with Restarts
	// restarts in the policy's period). A Cluster checks every Due against
	// its own deadlines, so an early, late or repeated one is harmless.
	ActArm
	// ActDisarm: the restart timer armed is no longer needed.
	ActDisarm
	// ActReady: Proc became ready (tell a deploy).
	ActReady
	// ActRecovered: the cluster left its crash loop.
	ActRecovered
	// ActChanged: what STATUS shows of the cluster changed: publish it.
	// When an event emits it, it is its last action.
	ActChanged
)

// Action is one thing a Cluster asks its caller to do, in order.
type Action[P comparable] struct {
	Kind      ActionKind
	Proc      P
	Timer     Timer
	At        time.Time
	Delay     time.Duration
	Restart   bool
	CrashLoop bool
	Restarts  int
	Why       string
	Fault     bool
	Silent    time.Duration
	// Kill, on an ActStop, asks for SIGKILL at once, with no grace: a fence
	// (Hold), which must be done within the lease's margin.
	Kill bool
}

// Why a Cluster stops or quiesces a process on its own.
const (
	whySilent      = "heartbeat timeout"
	whyLost        = "disconnected"
	whyQuiesce     = "quiesce timeout"
	whyNotConn     = "quiesce: not connected"
	whyNotBack     = "not re-adopted"
	whySuperseded  = "superseded by deploy"
	whyReclustered = "superseded by re-clustering"
	whyShutdown    = "shutdown"
	whyStale       = "no longer its cluster's"
	whyReadopted   = "re-adopted"
	whyFenced      = "lease not held"
)

// Admission refusals (Admissible).
var (
	// ErrUnknownProc means the process is not (or no longer) the cluster's.
	ErrUnknownProc = errors.New("not a live process of the cluster")
	// ErrLeaving means the process is being stopped or lost its connection.
	ErrLeaving = errors.New("the process is being stopped")
	// ErrConnected means the process is registered on a live connection.
	ErrConnected = errors.New("the process is already registered on a live connection")
)

// ProcView is what a Cluster knows of one of its processes.
type ProcView struct {
	State     State
	Routed    bool
	Activated bool
	Spawned   time.Time // or adopted
	LastBeat  time.Time // its last heartbeat, or REGISTER, or spawn
}

// View is what a Cluster shows of itself, apart from its processes.
type View[P comparable] struct {
	Current    P // the process supervised for the cluster, if HasCurrent
	HasCurrent bool
	Owned      bool // a deploy is moving the cluster
	Restarts   int  // restarts since the manager started
	CrashLoop  bool
	RestartAt  time.Time // when the last respawn was due (zero: none yet)
	LastExit   string    // how its last supervised process ended, or why a spawn failed
	// LastExitPublic is LastExit as the public may see it: a failed spawn's
	// reason without the command's path, arguments or environment.
	LastExitPublic string
}

// member is a Cluster's record of one process.
type member[P comparable] struct {
	p         P
	state     State
	spawned   time.Time
	lastBeat  time.Time // heartbeat, REGISTER or spawn
	seen      time.Time // the last sign of life other than a heartbeat (Alive)
	adopted   bool      // survived a manager restart
	wasRouted bool      // adopted, and routed when the previous manager died
	connected bool
	lost      bool // its connection is gone: it may never register again
	routed    bool
	activated bool
	quiesced  bool      // sent QUIESCED
	killed    bool      // a fence's ActStop with Kill went out
	quiesceBy time.Time // while quiescing: when it is stopped (zero once handled)
	lostBy    time.Time // after a lost connection: when it is stopped (zero once handled)
}

// Cluster is one cluster's supervision. It tracks every process of the
// cluster until the kernel confirms its exit: the supervised one (current),
// a deploy's, and survivors of a previous manager. P names a process; the
// caller assigns it, unique for the Cluster's life. It is not safe for
// concurrent use: one event loop feeds it.
//
// Its invariants, which its randomized test checks after every event: at
// most one process is routed, and only a ready one; at most one is ACTIVE;
// every process it is told
// of is stopped or quiesced once nothing needs it and shutdown comes; a
// restart waits within the backoff's bounds, and past the policy's
// intensity the cluster is reported in a crash loop.
type Cluster[P comparable] struct {
	rules     *Rules
	procs     []*member[P] // not yet confirmed exited, in the order they came
	current   *member[P]   // supervised: respawned when it dies
	hist      History
	restartAt time.Time
	armed     bool // a restart is due at restartAt
	spawning  bool // an ActSpawn awaits its Spawned or SpawnFailed
	lastExit  string
	lastPub   string // lastExit for the public
	owned     bool   // a deploy moves the cluster: no routing, activation or respawn of its own
	retired   bool   // replaced by a re-clustering, or a survivor's slot of another topology
	adopting  bool   // the adopt window is open: a dead process is respawned when it closes
	closing   bool   // the manager is shutting down: no more spawns
	unheld    bool   // in a mesh, another host may hold the cluster's lease: no spawns (Hold)
	out       []Action[P]
	changed   bool
}

// NewCluster returns the supervision of a cluster with no process yet. r is
// shared and must not change.
func NewCluster[P comparable](r *Rules) *Cluster[P] { return &Cluster[P]{rules: r} }

// done ends an event: its actions, with ActChanged last if it changed what
// STATUS shows.
func (c *Cluster[P]) done() []Action[P] {
	out := c.out
	if c.changed {
		out = append(out, Action[P]{Kind: ActChanged})
	}
	c.out, c.changed = nil, false
	return out
}

func (c *Cluster[P]) emit(a Action[P]) { c.out = append(c.out, a) }

func (c *Cluster[P]) find(p P) *member[P] {
	for _, m := range c.procs {
		if m.p == p {
			return m
		}
	}
	return nil
}

func (c *Cluster[P]) add(p P, now time.Time) *member[P] {
	m := &member[P]{p: p, state: StateStarting, spawned: now, lastBeat: now}
	c.procs = append(c.procs, m)
	return m
}

func (c *Cluster[P]) routedMember() *member[P] {
	for _, m := range c.procs {
		if m.routed {
			return m
		}
	}
	return nil
}

// --- Spawning ---------------------------------------------------------------

// Ensure spawns a process for the cluster if it has none and nothing holds
// it back: at the manager's start, and wherever a cluster must be served.
func (c *Cluster[P]) Ensure(now time.Time) []Action[P] {
	c.respawn()
	return c.done()
}

// respawn asks for the supervised process, unless the cluster has one, a
// deploy owns it, it was retired, or the manager is shutting down.
func (c *Cluster[P]) respawn() {
	if c.current != nil || c.spawning || c.owned || c.retired || c.closing || c.unheld {
		return
	}
	c.spawning = true
	c.emit(Action[P]{Kind: ActSpawn, Restart: c.hist.Total > 0})
}

// Spawned reports that the process ActSpawn asked for runs as p: it is the
// cluster's supervised process.
func (c *Cluster[P]) Spawned(now time.Time, p P) []Action[P] {
	c.spawning = false
	c.current = c.add(p, now)
	c.changed = true
	return c.done()
}

// SpawnFailed reports that the process ActSpawn asked for could not start:
// why is the cluster's last exit (public, the same without the command's
// path, arguments or environment), and the respawn is retried after the
// policy's delay.
func (c *Cluster[P]) SpawnFailed(now time.Time, why, public string) []Action[P] {
	c.spawning = false
	c.lastExit, c.lastPub, c.changed = why, public, true
	c.scheduleRestart(now)
	return c.done()
}

// scheduleRestart records a restart and arms its timer.
func (c *Cluster[P]) scheduleRestart(now time.Time) {
	d := c.rules.Policy.Next(&c.hist, now, c.rules.Rand())
	c.restartAt, c.armed, c.changed = now.Add(d.Delay), true, true
	c.emit(Action[P]{Kind: ActArm, Timer: TimerRestart, At: c.restartAt, Delay: d.Delay,
		CrashLoop: d.CrashLoop, Restarts: len(c.hist.Restarts)})
}

func (c *Cluster[P]) disarm() {
	if c.armed {
		c.armed = false
		c.emit(Action[P]{Kind: ActDisarm, Timer: TimerRestart})
	}
}

// --- Admission --------------------------------------------------------------

// Admissible reports whether p may REGISTER now: it is a live process of the
// cluster, not being stopped, never disconnected, and not already
// registered on another connection.
func (c *Cluster[P]) Admissible(p P) error {
	m := c.find(p)
	switch {
	case m == nil:
		return ErrUnknownProc
	case !m.state.Before(StateStopping) || m.lost:
		return ErrLeaving
	case m.connected:
		return ErrConnected
	}
	return nil
}

// Registered reports that p's REGISTER was admitted (Admissible, and the
// peer checked): its connection is the process's, and it counts as heard
// from.
func (c *Cluster[P]) Registered(now time.Time, p P) []Action[P] {
	if m := c.find(p); m != nil {
		m.connected = true
		if m.state == StateStarting {
			m.state = StateRegistered
		}
		m.lastBeat, c.changed = now, true
	}
	return c.done()
}

// Greeted reports that p's REGISTER reply has gone out, so what follows it
// on the connection comes after. A survivor of a previous manager that is no
// longer its cluster's is quiesced; the one that was routed is routed again.
func (c *Cluster[P]) Greeted(now time.Time, p P) []Action[P] {
	m := c.find(p)
	if m == nil || !m.adopted || !m.state.Before(StateQuiescing) {
		return c.done()
	}
	switch {
	case c.current != m:
		c.quiesce(m, now, whyStale)
	case m.wasRouted:
		// Routing as it was: the process was serving when the manager died.
		m.state = StateReady
		c.route(m, whyReadopted)
	}
	return c.done()
}

// --- Heartbeats and silence -------------------------------------------------

// Heartbeat reports p's heartbeats up to now; sawReady says one of them was
// ready:true. The first makes a registered process ready, and the supervised
// one, unless a deploy owns the cluster, routed, and ACTIVE once no other
// process of the cluster runs (a stale survivor's exit brings the ACTIVATE:
// a survivor's first ready heartbeat may come before its Greeted). A
// cluster in a crash loop leaves it once its process has been up, ready,
// for the policy's period.
func (c *Cluster[P]) Heartbeat(now time.Time, p P, sawReady bool) []Action[P] {
	m := c.find(p)
	if m == nil || !m.state.Before(StateStopping) {
		return nil
	}
	m.lastBeat = now
	if sawReady && m.state == StateRegistered {
		m.state, c.changed = StateReady, true
		if c.current == m && !c.owned {
			c.route(m, "")
			c.maybeActivate()
		}
		c.emit(Action[P]{Kind: ActReady, Proc: p})
	}
	if m.state == StateReady && c.current == m && c.rules.Policy.Recovered(&c.hist, m.spawned, now) {
		c.changed = true
		c.emit(Action[P]{Kind: ActRecovered, Proc: p})
	}
	return c.done()
}

// Steady reports whether p's heartbeats need no decision until the next
// Tick: it is ready, and its cluster is not in a crash loop waiting for it.
func (c *Cluster[P]) Steady(p P) bool {
	m := c.find(p)
	return m != nil && m.state == StateReady && !(c.current == m && c.hist.CrashLoop)
}

// Alive reports a sign of life from p other than a heartbeat (frames it
// sent): a process busy answering a flood is alive even if its heartbeat is
// queued behind its replies. It does not count before REGISTER.
func (c *Cluster[P]) Alive(now time.Time, p P) {
	if m := c.find(p); m != nil && m.state.Before(StateQuiescing) {
		m.seen = now
	}
}

// Tick judges silence: a process silent for longer than its limit
// (Rules.StartTimeout before REGISTER, HeartbeatTimeout after) is hung, and
// stopped.
func (c *Cluster[P]) Tick(now time.Time) []Action[P] {
	for _, m := range c.procs {
		var limit time.Duration
		switch m.state {
		case StateStarting:
			limit = c.rules.StartTimeout
		case StateRegistered, StateReady:
			limit = c.rules.HeartbeatTimeout
		default:
			continue
		}
		last := m.lastBeat
		if m.seen.After(last) && m.state != StateStarting {
			last = m.seen
		}
		if silent := now.Sub(last); silent > limit {
			c.stop(m, whySilent, true, silent)
		}
	}
	return c.done()
}

// --- Leaving ----------------------------------------------------------------

// Disconnected reports that p's connection ended without its exit: it is
// unrouted and, unless it said goodbye (QUIESCED) or is being stopped, is
// stopped as hung if its exit does not follow within DisconnectGrace.
func (c *Cluster[P]) Disconnected(now time.Time, p P) []Action[P] {
	m := c.find(p)
	if m == nil {
		return c.done()
	}
	m.connected, m.lost = false, true
	c.unroute(m)
	if !m.state.Before(StateStopping) || (m.state == StateQuiescing && m.quiesced) {
		return c.done()
	}
	m.lostBy = now.Add(c.rules.DisconnectGrace)
	c.emit(Action[P]{Kind: ActArm, Timer: TimerDisconnect, Proc: p, At: m.lostBy})
	return c.done()
}

// Quiesce has p finish its work and exit: unrouted, then QUIESCE, and
// stopped if it has not exited within QuiesceTimeout (a deploy's own
// deadline may come first). A process not connected is stopped at once.
func (c *Cluster[P]) Quiesce(now time.Time, p P) []Action[P] {
	if m := c.find(p); m != nil {
		c.quiesce(m, now, "")
	}
	return c.done()
}

func (c *Cluster[P]) quiesce(m *member[P], now time.Time, why string) {
	if !m.state.Before(StateQuiescing) {
		return
	}
	if !m.connected {
		c.stop(m, whyNotConn, false, 0)
		return
	}
	c.unroute(m)
	m.state, m.quiesceBy, c.changed = StateQuiescing, now.Add(c.rules.QuiesceTimeout), true
	c.emit(Action[P]{Kind: ActQuiesce, Proc: m.p, Why: why})
	c.emit(Action[P]{Kind: ActArm, Timer: TimerQuiesce, Proc: m.p, At: m.quiesceBy})
}

// QuiesceFailed reports that p's QUIESCE could not be sent: it is stopped.
func (c *Cluster[P]) QuiesceFailed(now time.Time, p P) []Action[P] {
	if m := c.find(p); m != nil {
		c.stop(m, whyNotConn, false, 0)
	}
	return c.done()
}

// Quiesced reports p's QUIESCED and whether it is the first.
func (c *Cluster[P]) Quiesced(now time.Time, p P) bool {
	m := c.find(p)
	if m == nil || m.quiesced {
		return false
	}
	m.quiesced = true
	return true
}

// Stop has p stopped (ActStop) for the reason why, unless it already is.
func (c *Cluster[P]) Stop(now time.Time, p P, why string) []Action[P] {
	if m := c.find(p); m != nil {
		c.stop(m, why, false, 0)
	}
	return c.done()
}

func (c *Cluster[P]) stop(m *member[P], why string, fault bool, silent time.Duration) {
	if !m.state.Before(StateStopping) {
		return
	}
	m.state, m.routed, c.changed = StateStopping, false, true
	c.emit(Action[P]{Kind: ActStop, Proc: m.p, Why: why, Fault: fault, Silent: silent})
}

// Due reports that timer t (for process p, unless it is TimerRestart) has
// come due at now. One that is early, stale or repeated changes nothing.
func (c *Cluster[P]) Due(now time.Time, t Timer, p P) []Action[P] {
	switch t {
	case TimerRestart:
		if c.armed && !now.Before(c.restartAt) {
			c.armed = false
			c.respawn()
		}
	case TimerQuiesce:
		if m := c.find(p); m != nil && m.state == StateQuiescing && !m.quiesceBy.IsZero() && !now.Before(m.quiesceBy) {
			m.quiesceBy = time.Time{}
			c.stop(m, whyQuiesce, true, 0)
		}
	case TimerDisconnect:
		if m := c.find(p); m != nil && !m.lostBy.IsZero() && !now.Before(m.lostBy) {
			m.lostBy = time.Time{}
			if m.state.Before(StateStopping) && !m.connected {
				c.stop(m, whyLost, true, 0)
			}
		}
	}
	return c.done()
}

// Exited reports that the kernel confirmed p's exit; status is how it ended.
// The cluster's supervised process is respawned after the policy's delay,
// unless a deploy owns the cluster, the adopt window is open (its end
// respawns), the cluster was retired or the manager is shutting down.
// Another process's exit may leave the routed one alone at last: it is
// then ACTIVATEd. A deploy must hear of an exit before its Cluster does.
func (c *Cluster[P]) Exited(now time.Time, p P, status string) []Action[P] {
	m := c.find(p)
	if m == nil {
		return c.done()
	}
	c.procs = deleteMember(c.procs, m)
	c.unroute(m)
	m.state, c.changed = StateExited, true
	if c.current != m {
		c.maybeActivate()
		return c.done()
	}
	c.current, c.lastExit, c.lastPub = nil, status, status // "exit status 1": nothing of the command
	if !c.closing && !c.owned && !c.retired && !c.adopting && !c.unheld {
		c.scheduleRestart(now)
	}
	return c.done()
}

func deleteMember[P comparable](ms []*member[P], m *member[P]) []*member[P] {
	for i, q := range ms {
		if q == m {
			copy(ms[i:], ms[i+1:])
			ms[len(ms)-1] = nil
			return ms[:len(ms)-1]
		}
	}
	return ms
}

// --- Routing and activation -------------------------------------------------

// route makes m the cluster's routed process.
func (c *Cluster[P]) route(m *member[P], why string) {
	if c.retired {
		return
	}
	for _, q := range c.procs {
		q.routed = q == m
	}
	c.changed = true
	c.emit(Action[P]{Kind: ActRoute, Proc: m.p, Why: why})
}

func (c *Cluster[P]) unroute(m *member[P]) {
	if m.routed {
		m.routed, c.changed = false, true
		c.emit(Action[P]{Kind: ActUnroute, Proc: m.p})
	}
}

// Activate has p ACTIVATEd (a deploy's step 4), unless it is already or was
// told to leave.
func (c *Cluster[P]) Activate(now time.Time, p P) []Action[P] {
	if m := c.find(p); m != nil {
		c.activate(m)
	}
	return c.done()
}

func (c *Cluster[P]) activate(m *member[P]) {
	// A process told to stop taking work is never made the active one.
	if m.activated || !m.state.Before(StateQuiescing) {
		return
	}
	m.activated, c.changed = true, true
	c.emit(Action[P]{Kind: ActActivate, Proc: m.p})
}

// ActivationWaits reports that the ACTIVATE asked for p could not go out
// yet (the handoff of the process it follows may still be on its way): p is
// not active, and the caller asks again with Activate when it can.
func (c *Cluster[P]) ActivationWaits(now time.Time, p P) []Action[P] {
	if m := c.find(p); m != nil && m.activated {
		m.activated, c.changed = false, true
	}
	return c.done()
}

// maybeActivate ACTIVATEs the routed supervised process once it is the only
// process of the cluster left: never two active processes for a cluster.
func (c *Cluster[P]) maybeActivate() {
	m := c.current
	if c.owned || m == nil || m.activated || m.state != StateReady || !m.routed || len(c.procs) > 1 {
		return
	}
	c.activate(m)
}

// --- Deploys ----------------------------------------------------------------

// Take reports that a deploy has started and owns the cluster until it
// Releases it: supervision routes, activates and respawns nothing meanwhile.
func (c *Cluster[P]) Take(now time.Time) { c.owned = true }

// DeploySpawning reports that the deploy is about to spawn the cluster's new
// process: a pending respawn is dropped, and a supervised process not
// serving yet (restarting after a crash) gives way to the deploy's.
func (c *Cluster[P]) DeploySpawning(now time.Time) []Action[P] {
	c.owned = true
	c.disarm()
	if m := c.current; m != nil && !m.routed {
		c.stop(m, whySuperseded, false, 0)
	}
	return c.done()
}

// DeploySpawned reports the deploy's new process p.
func (c *Cluster[P]) DeploySpawned(now time.Time, p P) []Action[P] {
	c.owned = true
	c.add(p, now)
	c.changed = true
	return c.done()
}

// DeployRouted reports that the deploy routes the cluster to p, or, with ok
// false, to no process.
func (c *Cluster[P]) DeployRouted(now time.Time, p P, ok bool) []Action[P] {
	if !ok {
		if m := c.routedMember(); m != nil {
			c.unroute(m)
		}
		return c.done()
	}
	if m := c.find(p); m != nil && !m.routed {
		c.route(m, "")
	}
	return c.done()
}

// Switched reports that a re-clustering switch published a whole new
// routing table, routing this (new) cluster to p: no action follows.
func (c *Cluster[P]) Switched(now time.Time, p P) {
	for _, m := range c.procs {
		m.routed = m.p == p
	}
}

// Retire reports that the cluster is gone from routing for good (a
// re-clustering replaced it): it is never respawned, a pending respawn is
// dropped, and a supervised process that was not serving is stopped. Its
// other processes are the deploy's to end.
func (c *Cluster[P]) Retire(now time.Time) []Action[P] {
	c.owned, c.retired = true, true
	c.disarm()
	if m := c.current; m != nil && !m.routed {
		c.stop(m, whyReclustered, false, 0)
	}
	for _, m := range c.procs {
		m.routed = false // the table that routed them is no longer in force
	}
	return c.done()
}

// Release reports that the deploy hands the cluster back: its routed process
// becomes the supervised one. With none routed, a supervised process that
// was not told to leave keeps the cluster; otherwise it is respawned. The
// process whose exit the deploy is reacting to is told to leave already
// (QUIESCE or a stop), so Release need not know of that exit yet.
func (c *Cluster[P]) Release(now time.Time) []Action[P] {
	c.owned, c.changed = false, true
	if m := c.routedMember(); m != nil {
		c.current = m
		return c.done()
	}
	if m := c.current; m != nil && m.state.Before(StateQuiescing) {
		return c.done() // still the old one, serving or about to
	}
	c.current = nil
	c.respawn()
	return c.done()
}

// --- Adoption ---------------------------------------------------------------

// Adopted reports p, a process a previous manager left running: wasRouted
// and activated are what that manager recorded. The cluster's supervised
// process is the one that was routed, else the first unrouted one; any
// other is stale and is quiesced once it registers (Greeted). A retired
// cluster (a survivor of another topology) has no supervised process.
func (c *Cluster[P]) Adopted(now time.Time, p P, wasRouted, activated bool) {
	m := c.add(p, now)
	m.adopted, m.activated = true, activated
	if c.retired {
		return
	}
	m.wasRouted = wasRouted
	if c.current == nil || (wasRouted && !c.current.wasRouted) {
		c.current = m
	}
}

// Adopting reports that the adopt window is open: a supervised process that
// dies meanwhile is respawned when it closes, not before.
func (c *Cluster[P]) Adopting(now time.Time) { c.adopting = true }

// AdoptDone reports that the adopt window closed: survivors that did not
// come back are stopped, and a cluster without a supervised process is
// spawned.
func (c *Cluster[P]) AdoptDone(now time.Time) []Action[P] {
	c.adopting = false
	for _, m := range c.procs {
		if m.adopted && !m.connected && m.state.Before(StateStopping) {
			c.stop(m, whyNotBack, true, 0)
		}
	}
	if c.current == nil {
		c.respawn()
	}
	return c.done()
}

// --- Shutdown ---------------------------------------------------------------

// Close reports that the manager is shutting down: nothing is spawned again
// and a pending respawn is dropped.
func (c *Cluster[P]) Close(now time.Time) []Action[P] {
	c.closing = true
	c.disarm()
	return c.done()
}

// QuiesceAll quiesces every process, and stops those not registered yet.
func (c *Cluster[P]) QuiesceAll(now time.Time) []Action[P] {
	for _, m := range c.procs {
		if m.state == StateStarting {
			c.stop(m, whyShutdown, false, 0)
			continue
		}
		c.quiesce(m, now, whyShutdown)
	}
	return c.done()
}

// StopAll stops every process not stopped yet, for the reason why.
func (c *Cluster[P]) StopAll(now time.Time, why string) []Action[P] {
	for _, m := range c.procs {
		c.stop(m, why, false, 0)
	}
	return c.done()
}

// --- Mesh -------------------------------------------------------------------

// Hold reports whether this host holds the cluster's lease in a mesh
// (docs/multihost.md). A Cluster is held from NewCluster on: a single host
// holds every cluster. Without the lease nothing is spawned, a pending
// respawn is dropped, and every process is killed at once (ActStop with
// Kill, also one already stopping with a grace): this is the fence, and it
// has only the lease's margin, not a stop grace. Held again, the cluster is
// spawned as at a first start.
func (c *Cluster[P]) Hold(now time.Time, held bool) []Action[P] {
	if held {
		if c.unheld {
			c.unheld = false
			c.respawn() // its Spawned or SpawnFailed says what changed
		}
		return c.done()
	}
	if !c.unheld {
		c.unheld, c.changed = true, true
	}
	c.disarm()
	for _, m := range c.procs {
		if !m.killed {
			m.killed = true
			m.state, m.routed, c.changed = StateStopping, false, true
			c.emit(Action[P]{Kind: ActStop, Proc: m.p, Why: whyFenced, Kill: true})
		}
	}
	return c.done()
}

// Held reports whether the cluster may run here (see Hold).
func (c *Cluster[P]) Held() bool { return !c.unheld }

// Empty reports whether every process the cluster was told of has exited.
func (c *Cluster[P]) Empty() bool { return len(c.procs) == 0 }

// --- Views ------------------------------------------------------------------

// Proc returns what the cluster knows of p, and false once p has exited (or
// was never its).
func (c *Cluster[P]) Proc(p P) (ProcView, bool) {
	m := c.find(p)
	if m == nil {
		return ProcView{State: StateExited}, false
	}
	return ProcView{State: m.state, Routed: m.routed, Activated: m.activated,
		Spawned: m.spawned, LastBeat: m.lastBeat}, true
}

// View returns the cluster's supervision state.
func (c *Cluster[P]) View() View[P] {
	v := View[P]{Owned: c.owned, Restarts: c.hist.Total, CrashLoop: c.hist.CrashLoop,
		RestartAt: c.restartAt, LastExit: c.lastExit, LastExitPublic: c.lastPub}
	if c.current != nil {
		v.Current, v.HasCurrent = c.current.p, true
	}
	return v
}

// Owned reports whether a deploy owns the cluster.
func (c *Cluster[P]) Owned() bool { return c.owned }

// IsCurrent reports whether p is the cluster's supervised process.
func (c *Cluster[P]) IsCurrent(p P) bool { return c.current != nil && c.current.p == p }
