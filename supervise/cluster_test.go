package supervise

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/backoff"
)

// This file holds the Cluster's table tests and the fake they share with the
// randomized test: a clock, and a model of the processes and the routing
// table that carries out every Action the way the manager does, answers
// spawns, and flags any action the Cluster should never ask for.

var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

// testRules are the manager's defaults, without jitter unless a test adds it.
func testRules() *Rules {
	return &Rules{
		Policy: RestartPolicy{
			Backoff:   backoff.Policy{Min: 500 * time.Millisecond, Max: 30 * time.Second},
			Intensity: 5,
			Period:    time.Minute,
		},
		StartTimeout:     30 * time.Second,
		HeartbeatTimeout: 5 * time.Second,
		QuiesceTimeout:   30 * time.Second,
		DisconnectGrace:  100 * time.Millisecond,
		Rand:             func() float64 { return 0.5 },
	}
}

// fproc is the model of one process, as the manager sees it.
type fproc struct {
	id                                   int
	adopted, wasRouted, deploy           bool
	connected, lost, registered, ready   bool
	greet                                bool // registered, its Greeted not yet told
	quiesceSent, quiesced, stopped, gone bool
	activated                            bool
}

// alive reports whether p has not been told to leave.
func (p *fproc) alive() bool { return !p.gone && !p.quiesceSent && !p.stopped }

type fake struct {
	c        *Cluster[int]
	r        *Rules
	now      time.Time
	seq      int
	procs    map[int]*fproc
	order    []*fproc
	routed   int // 0: none
	calls    []string
	errs     []string
	spawnErr error // the next spawn fails with it
	sendErr  bool  // QUIESCE cannot be sent
	closed   bool  // Close was called: nothing may be spawned

	// The restart policy's model: what every ActArm of the restart timer
	// must agree with.
	restarts   []time.Time
	crashLoop  bool
	total      int
	armed      bool // the restart timer
	restartAt  time.Time
	spawnCount int
}

func newFake(r *Rules) *fake {
	return &fake{c: NewCluster[int](r), r: r, now: t0, procs: map[int]*fproc{}}
}

func (f *fake) bad(format string, args ...any) { f.errs = append(f.errs, fmt.Sprintf(format, args...)) }

func (f *fake) call(format string, args ...any) {
	f.calls = append(f.calls, fmt.Sprintf(format, args...))
}

// take returns the calls since the last take.
func (f *fake) take() []string { c := f.calls; f.calls = nil; return c }

func (f *fake) add(p *fproc) *fproc { f.procs[p.id] = p; f.order = append(f.order, p); return p }

func (f *fake) newID() int { f.seq++; return f.seq }

// live returns the model of the process an action is about, flagging one
// that is unknown or gone.
func (f *fake) live(what string, id int) *fproc {
	p := f.procs[id]
	switch {
	case p == nil:
		f.bad("%s of unknown process %d", what, id)
		return &fproc{id: id}
	case p.gone:
		f.bad("%s of process %d after its exit", what, id)
	}
	return p
}

// run carries out an event's actions as the manager does and checks each.
func (f *fake) run(acts []Action[int]) {
	for i, a := range acts {
		if a.Kind == ActChanged && i != len(acts)-1 {
			f.bad("ActChanged is not the last action: %v", acts)
		}
		f.act(a)
	}
}

func (f *fake) act(a Action[int]) {
	switch a.Kind {
	case ActSpawn:
		v := f.c.View()
		if f.closed || v.HasCurrent || v.Owned || !f.c.Held() {
			f.bad("spawn while closed %v, with a process %v, owned %v, held %v", f.closed, v.HasCurrent, v.Owned, f.c.Held())
		}
		if a.Restart != (f.total > 0) {
			f.bad("spawn restart=%v after %d restarts", a.Restart, f.total)
		}
		f.spawnCount++
		if err := f.spawnErr; err != nil {
			f.spawnErr = nil
			f.call("spawn failed")
			f.run(f.c.SpawnFailed(f.now, err.Error(), "spawn failed"))
			return
		}
		p := f.add(&fproc{id: f.newID()})
		f.call("spawn %d", p.id)
		f.run(f.c.Spawned(f.now, p.id))
	case ActStop:
		p := f.live("stop", a.Proc)
		if p.stopped && !a.Kill { // a fence kills one stopping with a grace
			f.bad("stop of %d twice", a.Proc)
		}
		p.stopped = true
		if f.routed == p.id {
			f.routed = 0 // a stop unroutes
		}
		if a.Kill {
			f.call("kill %d %s", a.Proc, a.Why)
			return
		}
		f.call("stop %d %s", a.Proc, a.Why)
	case ActQuiesce:
		p := f.live("quiesce", a.Proc)
		if p.quiesceSent || p.stopped {
			f.bad("quiesce of %d (sent before %v, stopped %v)", a.Proc, p.quiesceSent, p.stopped)
		}
		if f.routed == p.id {
			f.bad("quiesce of %d while it is routed", a.Proc)
		}
		if !p.connected {
			f.bad("quiesce of %d, which is not connected", a.Proc)
		}
		p.quiesceSent = true
		f.call("quiesce %d", a.Proc)
		if f.sendErr {
			f.call("quiesce %d failed", a.Proc)
			f.run(f.c.QuiesceFailed(f.now, a.Proc))
		}
	case ActRoute:
		p := f.live("route", a.Proc)
		if !p.ready || !p.alive() {
			f.bad("route of %d (ready %v, leaving %v)", a.Proc, p.ready, !p.alive())
		}
		f.routed = p.id
		f.call("route %d", a.Proc)
	case ActUnroute:
		if f.routed != a.Proc {
			f.bad("unroute of %d while %d is routed", a.Proc, f.routed)
		}
		f.routed = 0
		f.call("unroute %d", a.Proc)
	case ActActivate:
		p := f.live("activate", a.Proc)
		if p.activated || !p.alive() || f.routed != p.id {
			f.bad("activate of %d (active %v, leaving %v, routed %d)", a.Proc, p.activated, !p.alive(), f.routed)
		}
		p.activated = true
		f.call("activate %d", a.Proc)
	case ActArm:
		switch a.Timer {
		case TimerRestart:
			f.checkRestart(a)
			f.armed, f.restartAt = true, a.At
			loop := ""
			if a.CrashLoop {
				loop = " crash loop"
			}
			f.call("arm restart %v%s", a.Delay, loop)
		case TimerQuiesce:
			f.live("arm quiesce timer", a.Proc)
			f.call("arm quiesce %d +%v", a.Proc, a.At.Sub(f.now))
		case TimerDisconnect:
			f.live("arm disconnect timer", a.Proc)
			f.call("arm disconnect %d +%v", a.Proc, a.At.Sub(f.now))
		default:
			f.bad("arm of timer %d", a.Timer)
		}
	case ActDisarm:
		if !f.armed {
			f.bad("disarm of a restart timer not armed")
		}
		f.armed = false
		f.call("disarm restart")
	case ActReady:
		if p := f.live("ready", a.Proc); !p.ready {
			f.bad("ready report of %d, which never said ready", a.Proc)
		}
		f.call("ready %d", a.Proc)
	case ActRecovered:
		if !f.crashLoop {
			f.bad("recovered while not in a crash loop")
		}
		f.crashLoop = false
		f.prune()
		f.call("recovered")
	case ActChanged:
		f.call("changed")
	default:
		f.bad("unknown action %v", a)
	}
}

func (f *fake) prune() {
	f.restarts = slices.DeleteFunc(f.restarts, func(t time.Time) bool { return f.now.Sub(t) >= f.r.Policy.Period })
}

// checkRestart checks a restart's delay against the policy: the backoff's
// bounds, and past the intensity a crash loop at the ceiling.
func (f *fake) checkRestart(a Action[int]) {
	f.prune()
	f.restarts = append(f.restarts, f.now)
	f.total++
	if len(f.restarts) > f.r.Policy.Intensity {
		f.crashLoop = true
	}
	if a.CrashLoop != f.crashLoop {
		f.bad("restart %d: crash loop %v, want %v (%d restarts in the period)", f.total, a.CrashLoop, f.crashLoop, len(f.restarts))
	}
	if a.CrashLoop && a.Restarts != len(f.restarts) {
		f.bad("crash loop reported with %d restarts, want %d", a.Restarts, len(f.restarts))
	}
	b := f.r.Policy.Backoff
	base := float64(max(b.Max, b.Min))
	if !f.crashLoop {
		base = math.Min(float64(b.Min)*math.Pow(2, float64(len(f.restarts)-1)), base)
	}
	lo, hi := time.Duration(base*(1-b.Jitter)), time.Duration(base*(1+b.Jitter))
	if a.Delay < lo-1 || a.Delay > hi+1 {
		f.bad("restart %d: delay %v outside [%v, %v]", f.total, a.Delay, lo, hi)
	}
	if !a.At.Equal(f.now.Add(a.Delay)) {
		f.bad("restart at %v, want now + %v", a.At, a.Delay)
	}
}

// exited tells the cluster that p exited.
func (f *fake) exited(id int) {
	p := f.procs[id]
	p.gone, p.connected = true, false
	f.run(f.c.Exited(f.now, id, "exit status 1"))
}

// violations checks the invariants that must hold after every event.
func (f *fake) violations() []string {
	v := slices.Clone(f.errs)
	routed := 0
	for _, p := range f.order {
		pv, ok := f.c.Proc(p.id)
		switch {
		case p.gone && ok:
			v = append(v, fmt.Sprintf("process %d exited but the cluster still has it (%s)", p.id, pv.State))
		case !p.gone && !ok:
			v = append(v, fmt.Sprintf("process %d is alive but the cluster forgot it", p.id))
		case !ok:
			continue
		case p.stopped && pv.State != StateStopping:
			v = append(v, fmt.Sprintf("process %d was stopped but is %s", p.id, pv.State))
		case p.quiesceSent && !p.stopped && pv.State != StateQuiescing:
			v = append(v, fmt.Sprintf("process %d was quiesced but is %s", p.id, pv.State))
		}
		if pv.Routed {
			routed++
			if pv.State != StateReady {
				v = append(v, fmt.Sprintf("process %d is routed in state %s", p.id, pv.State))
			}
			if f.routed != p.id {
				v = append(v, fmt.Sprintf("process %d is routed, but the table routes %d", p.id, f.routed))
			}
		}
		if pv.Activated != p.activated && !p.adopted {
			v = append(v, fmt.Sprintf("process %d: activated %v, but ACTIVATE sent %v", p.id, pv.Activated, p.activated))
		}
	}
	if routed > 1 {
		v = append(v, fmt.Sprintf("%d processes routed", routed))
	}
	active := 0
	for _, p := range f.order {
		if p.activated && !p.gone {
			active++
		}
	}
	if active > 1 {
		v = append(v, fmt.Sprintf("%d processes ACTIVE at once", active))
	}
	if routed == 0 && f.routed != 0 {
		v = append(v, fmt.Sprintf("the table routes %d, the cluster nothing", f.routed))
	}
	cv := f.c.View()
	if cv.HasCurrent {
		if p := f.procs[cv.Current]; p == nil || p.gone {
			v = append(v, fmt.Sprintf("the supervised process %d is gone", cv.Current))
		}
	}
	// Liveness: a cluster nothing holds back (a deploy, shutdown, a retirement,
	// the adopt window, another host's lease) has a process, or a respawn due.
	if !cv.Owned && !f.c.closing && !f.c.retired && !f.c.adopting && !f.c.unheld && !cv.HasCurrent && !f.armed && f.spawnCount > 0 {
		v = append(v, "the cluster has no process and no respawn due")
	}
	if cv.CrashLoop != f.crashLoop {
		v = append(v, fmt.Sprintf("crash loop %v, the model says %v", cv.CrashLoop, f.crashLoop))
	}
	return v
}

// harness drives one Cluster in the table tests.
type harness struct {
	t *testing.T
	*fake
}

func newHarness(t *testing.T, r *Rules) *harness { return &harness{t: t, fake: newFake(r)} }

// do runs one event and checks the calls it made and every invariant.
func (h *harness) do(event func() []Action[int], want ...string) {
	h.t.Helper()
	h.run(event())
	if got := h.take(); !slices.Equal(got, want) {
		h.t.Fatalf("calls:\n got  %q\n want %q", got, want)
	}
	if v := h.violations(); len(v) > 0 {
		h.t.Fatalf("invariants:\n%s", strings.Join(v, "\n"))
	}
}

func (h *harness) advance(d time.Duration) { h.now = h.now.Add(d) }

func (h *harness) procView(id int) ProcView { pv, _ := h.c.Proc(id); return pv }

func (h *harness) ensure(want ...string) {
	h.t.Helper()
	h.do(func() []Action[int] { return h.c.Ensure(h.now) }, want...)
}

func (h *harness) register(id int, want ...string) {
	h.t.Helper()
	if err := h.c.Admissible(id); err != nil {
		h.t.Fatalf("process %d not admissible: %v", id, err)
	}
	p := h.procs[id]
	p.connected, p.registered = true, true
	h.do(func() []Action[int] { return h.c.Registered(h.now, id) }, want...)
}

func (h *harness) greeted(id int, want ...string) {
	h.t.Helper()
	h.do(func() []Action[int] { return h.c.Greeted(h.now, id) }, want...)
}

func (h *harness) beat(id int, ready bool, want ...string) {
	h.t.Helper()
	h.procs[id].ready = h.procs[id].ready || ready
	h.do(func() []Action[int] { return h.c.Heartbeat(h.now, id, ready) }, want...)
}

func (h *harness) tick(want ...string) {
	h.t.Helper()
	h.do(func() []Action[int] { return h.c.Tick(h.now) }, want...)
}

func (h *harness) due(t Timer, id int, want ...string) {
	h.t.Helper()
	h.do(func() []Action[int] { return h.c.Due(h.now, t, id) }, want...)
}

func (h *harness) exit(id int, want ...string) {
	h.t.Helper()
	h.do(func() []Action[int] { h.exited(id); return nil }, want...)
}

func (h *harness) disconnect(id int, want ...string) {
	h.t.Helper()
	p := h.procs[id]
	p.connected, p.lost = false, true
	h.do(func() []Action[int] { return h.c.Disconnected(h.now, id) }, want...)
}

// deploySpawned has a deploy take the cluster and spawn a process for it.
func (h *harness) deploySpawned() int {
	h.t.Helper()
	h.c.Take(h.now)
	p := h.add(&fproc{id: h.newID(), deploy: true})
	h.do(func() []Action[int] { return h.c.DeploySpawned(h.now, p.id) }, "changed")
	return p.id
}

// serving brings up the cluster's first process, routed and ACTIVE.
func (h *harness) serving() int {
	h.t.Helper()
	h.ensure("spawn 1", "changed")
	h.register(1, "changed")
	h.beat(1, true, "route 1", "activate 1", "ready 1", "changed")
	return 1
}

func TestClusterStartsRoutesAndActivates(t *testing.T) {
	h := newHarness(t, testRules())
	h.ensure("spawn 1", "changed")
	h.ensure() // it has a process
	h.register(1, "changed")
	if pv, _ := h.c.Proc(1); pv.State != StateRegistered || !pv.LastBeat.Equal(h.now) {
		t.Fatalf("after REGISTER: %+v", pv)
	}
	h.beat(1, false) // not ready: nothing to do
	if h.c.Steady(1) {
		t.Error("a process not ready yet is steady")
	}
	h.beat(1, true, "route 1", "activate 1", "ready 1", "changed")
	h.beat(1, true) // ready latches: the next heartbeats change nothing
	if !h.c.Steady(1) {
		t.Error("a ready process is not steady")
	}
	if err := h.c.Admissible(1); !errors.Is(err, ErrConnected) {
		t.Errorf("second REGISTER on a live connection: %v, want ErrConnected", err)
	}
	if err := h.c.Admissible(99); !errors.Is(err, ErrUnknownProc) {
		t.Errorf("REGISTER of a stranger: %v, want ErrUnknownProc", err)
	}
}

func TestClusterSilence(t *testing.T) {
	t.Run("never registers", func(t *testing.T) {
		h := newHarness(t, testRules())
		h.ensure("spawn 1", "changed")
		h.advance(30 * time.Second)
		h.tick() // exactly the limit is not past it
		h.advance(time.Millisecond)
		h.tick("stop 1 heartbeat timeout", "changed")
		h.exit(1, "arm restart 500ms", "changed")
	})
	t.Run("stops heartbeating", func(t *testing.T) {
		h := newHarness(t, testRules())
		h.serving()
		h.advance(5*time.Second + time.Millisecond)
		h.tick("stop 1 heartbeat timeout", "changed") // the stop unroutes it
	})
	t.Run("busy with replies", func(t *testing.T) {
		h := newHarness(t, testRules())
		h.serving()
		h.advance(4 * time.Second)
		h.c.Alive(h.now, 1) // frames, no heartbeat
		h.advance(4 * time.Second)
		h.tick()
		h.advance(2 * time.Second)
		h.tick("stop 1 heartbeat timeout", "changed")
	})
	t.Run("frames do not count before REGISTER", func(t *testing.T) {
		h := newHarness(t, testRules())
		h.ensure("spawn 1", "changed")
		h.advance(29 * time.Second)
		h.c.Alive(h.now, 1)
		h.advance(2 * time.Second)
		h.tick("stop 1 heartbeat timeout", "changed")
	})
	t.Run("a leaving process is not judged", func(t *testing.T) {
		h := newHarness(t, testRules())
		h.serving()
		h.do(func() []Action[int] { return h.c.Quiesce(h.now, 1) }, "unroute 1", "quiesce 1", "arm quiesce 1 +30s", "changed")
		h.advance(20 * time.Second)
		h.tick()
	})
}

func TestClusterRestartBackoffAndCrashLoop(t *testing.T) {
	r := testRules()
	r.Policy.Intensity = 2
	r.Policy.Backoff.Max = 4 * time.Second
	h := newHarness(t, r)
	h.serving()
	h.exit(1, "unroute 1", "arm restart 500ms", "changed")
	if v := h.c.View(); v.LastExit != "exit status 1" || v.Restarts != 1 || v.HasCurrent {
		t.Fatalf("after the exit: %+v", v)
	}
	h.due(TimerRestart, 0) // early: nothing
	h.advance(500 * time.Millisecond)
	h.due(TimerRestart, 0, "spawn 2", "changed")
	h.due(TimerRestart, 0) // repeated: nothing
	h.exit(2, "arm restart 1s", "changed")
	h.advance(time.Second)
	h.due(TimerRestart, 0, "spawn 3", "changed")
	h.exit(3, "arm restart 4s crash loop", "changed") // a third restart within the period
	h.advance(4 * time.Second)
	h.due(TimerRestart, 0, "spawn 4", "changed")
	h.register(4, "changed")
	h.beat(4, true, "route 4", "activate 4", "ready 4", "changed")
	if h.c.Steady(4) {
		t.Error("a crash-looping cluster's process is steady: its recovery needs the loop")
	}
	h.advance(time.Minute - time.Millisecond)
	h.beat(4, true)
	h.advance(time.Millisecond)
	h.beat(4, true, "recovered", "changed")
	if v := h.c.View(); v.CrashLoop || v.Restarts != 3 {
		t.Fatalf("after recovering: %+v", v)
	}
	h.exit(4, "unroute 4", "arm restart 500ms", "changed") // the history was pruned: the backoff starts over
}

func TestClusterSpawnFailure(t *testing.T) {
	h := newHarness(t, testRules())
	h.spawnErr = errors.New("spawn /opt/bot: no such file")
	h.ensure("spawn failed", "arm restart 500ms", "changed")
	if v := h.c.View(); v.LastExit != "spawn /opt/bot: no such file" || v.LastExitPublic != "spawn failed" {
		t.Errorf("last exit %q, public %q", v.LastExit, v.LastExitPublic)
	}
	h.advance(500 * time.Millisecond)
	h.due(TimerRestart, 0, "spawn 1", "changed")
}

func TestClusterDisconnect(t *testing.T) {
	t.Run("exit follows", func(t *testing.T) {
		h := newHarness(t, testRules())
		h.serving()
		h.disconnect(1, "unroute 1", "arm disconnect 1 +100ms", "changed")
		if err := h.c.Admissible(1); !errors.Is(err, ErrLeaving) {
			t.Errorf("REGISTER after a lost connection: %v, want ErrLeaving", err)
		}
		h.exit(1, "arm restart 500ms", "changed")
		h.advance(100 * time.Millisecond)
		h.due(TimerDisconnect, 1) // it is gone
	})
	t.Run("no exit", func(t *testing.T) {
		h := newHarness(t, testRules())
		h.serving()
		h.disconnect(1, "unroute 1", "arm disconnect 1 +100ms", "changed")
		h.due(TimerDisconnect, 1) // early
		h.advance(100 * time.Millisecond)
		h.due(TimerDisconnect, 1, "stop 1 disconnected", "changed")
	})
	t.Run("after QUIESCED", func(t *testing.T) {
		h := newHarness(t, testRules())
		h.serving()
		h.do(func() []Action[int] { return h.c.Quiesce(h.now, 1) }, "unroute 1", "quiesce 1", "arm quiesce 1 +30s", "changed")
		if !h.c.Quiesced(h.now, 1) || h.c.Quiesced(h.now, 1) {
			t.Error("Quiesced: want true the first time only")
		}
		h.disconnect(1) // it said goodbye: its exit is awaited
	})
	t.Run("not registered", func(t *testing.T) {
		h := newHarness(t, testRules())
		h.ensure("spawn 1", "changed")
		h.register(1, "changed")
		h.disconnect(1, "arm disconnect 1 +100ms")
	})
}

func TestClusterQuiesce(t *testing.T) {
	t.Run("timeout", func(t *testing.T) {
		h := newHarness(t, testRules())
		h.serving()
		h.do(func() []Action[int] { return h.c.Quiesce(h.now, 1) }, "unroute 1", "quiesce 1", "arm quiesce 1 +30s", "changed")
		h.do(func() []Action[int] { return h.c.Quiesce(h.now, 1) }) // once
		h.advance(30 * time.Second)
		h.due(TimerQuiesce, 1, "stop 1 quiesce timeout", "changed")
		h.due(TimerQuiesce, 1)
	})
	t.Run("exits in time", func(t *testing.T) {
		h := newHarness(t, testRules())
		h.serving()
		h.do(func() []Action[int] { return h.c.Quiesce(h.now, 1) }, "unroute 1", "quiesce 1", "arm quiesce 1 +30s", "changed")
		h.exit(1, "arm restart 500ms", "changed")
		h.advance(30 * time.Second)
		h.due(TimerQuiesce, 1)
	})
	t.Run("cannot be sent", func(t *testing.T) {
		h := newHarness(t, testRules())
		h.serving()
		h.sendErr = true
		h.do(func() []Action[int] { return h.c.Quiesce(h.now, 1) },
			"unroute 1", "quiesce 1", "quiesce 1 failed", "stop 1 quiesce: not connected", "changed", "arm quiesce 1 +30s", "changed")
	})
	t.Run("not connected", func(t *testing.T) {
		h := newHarness(t, testRules())
		h.ensure("spawn 1", "changed")
		h.do(func() []Action[int] { return h.c.Quiesce(h.now, 1) }, "stop 1 quiesce: not connected", "changed")
	})
}

func TestClusterDeploy(t *testing.T) {
	t.Run("rolls to a new process", func(t *testing.T) {
		h := newHarness(t, testRules())
		h.serving()
		h.c.Take(h.now)
		h.do(func() []Action[int] { return h.c.DeploySpawning(h.now) }) // the old one serves: it stays
		h.deploySpawned()
		h.register(2, "changed")
		h.beat(2, true, "ready 2", "changed") // the deploy routes it, not supervision
		h.do(func() []Action[int] { return h.c.DeployRouted(h.now, 2, true) }, "route 2", "changed")
		h.do(func() []Action[int] { return h.c.Quiesce(h.now, 1) }, "quiesce 1", "arm quiesce 1 +30s", "changed")
		// The old one exits: the deploy hears of it first, ACTIVATEs the
		// new one and releases the cluster; then supervision hears.
		h.do(func() []Action[int] {
			h.procs[1].gone = true
			h.run(h.c.Activate(h.now, 2))
			h.run(h.c.Release(h.now))
			return h.c.Exited(h.now, 1, "exit status 0")
		}, "activate 2", "changed", "changed", "changed")
		if v := h.c.View(); !v.HasCurrent || v.Current != 2 || v.Owned || v.LastExit != "" {
			t.Fatalf("after the release: %+v", v)
		}
		h.exit(2, "unroute 2", "arm restart 500ms", "changed") // supervised again
	})
	t.Run("supersedes a restarting process", func(t *testing.T) {
		h := newHarness(t, testRules())
		h.serving()
		h.exit(1, "unroute 1", "arm restart 500ms", "changed")
		h.c.Take(h.now)
		h.advance(time.Second)
		h.due(TimerRestart, 0)                                                                    // owned: no respawn
		h.do(func() []Action[int] { return h.c.Release(h.now) }, "spawn 2", "changed", "changed") // the spawn's, the release's
		h.c.Take(h.now)
		h.do(func() []Action[int] { return h.c.DeploySpawning(h.now) }, "stop 2 superseded by deploy", "changed")
	})
	t.Run("new process fails before the switch", func(t *testing.T) {
		h := newHarness(t, testRules())
		h.serving()
		h.deploySpawned()
		h.do(func() []Action[int] { return h.c.Stop(h.now, 2, "deploy") }, "stop 2 deploy", "changed")
		h.exit(2, "changed")
		h.do(func() []Action[int] { return h.c.Release(h.now) }, "changed") // the old one keeps it
		if v, pv := h.c.View(), h.procView(1); v.Current != 1 || !pv.Routed {
			t.Fatalf("after the rollback: %+v", v)
		}
	})
	t.Run("released with nothing routed", func(t *testing.T) {
		h := newHarness(t, testRules())
		h.serving()
		h.deploySpawned()
		h.register(2, "changed")
		h.beat(2, true, "ready 2", "changed")
		h.do(func() []Action[int] { return h.c.DeployRouted(h.now, 2, true) }, "route 2", "changed")
		h.do(func() []Action[int] { return h.c.Quiesce(h.now, 1) }, "quiesce 1", "arm quiesce 1 +30s", "changed")
		h.exit(2, "unroute 2", "changed") // after the switch, before ACTIVATE
		// The deploy hears of the old one's exit first and releases: the
		// old one was told to leave, so the cluster is respawned.
		h.do(func() []Action[int] { return h.c.Release(h.now) }, "spawn 3", "changed", "changed")
		h.exit(1, "changed")
		if v := h.c.View(); v.LastExit != "" || v.Current != 3 {
			t.Fatalf("an exit the deploy handed over is not the cluster's: %+v", v)
		}
	})
	t.Run("re-clustering retires the old cluster", func(t *testing.T) {
		h := newHarness(t, testRules())
		h.serving()
		h.c.Take(h.now)
		h.do(func() []Action[int] {
			h.routed = 0 // the new table routes elsewhere
			return h.c.Retire(h.now)
		})
		h.do(func() []Action[int] { return h.c.Quiesce(h.now, 1) }, "quiesce 1", "arm quiesce 1 +30s", "changed")
		h.exit(1, "changed")
		h.ensure() // never respawned
	})
	t.Run("re-clustering switch", func(t *testing.T) {
		h := newHarness(t, testRules())
		h.deploySpawned()
		h.register(1, "changed")
		h.beat(1, true, "ready 1", "changed")
		h.c.Switched(h.now, 1)
		h.routed = 1
		h.do(func() []Action[int] { return h.c.Activate(h.now, 1) }, "activate 1", "changed")
		h.do(func() []Action[int] { return h.c.Release(h.now) }, "changed")
		if v := h.c.View(); v.Current != 1 {
			t.Fatalf("after the release: %+v", v)
		}
	})
}

func TestClusterAdoption(t *testing.T) {
	t.Run("routed survivor wins", func(t *testing.T) {
		h := newHarness(t, testRules())
		for _, routed := range []bool{false, true, false} {
			p := h.add(&fproc{id: h.newID(), adopted: true})
			h.c.Adopted(h.now, p.id, routed, routed)
		}
		h.c.Adopting(h.now)
		if v := h.c.View(); v.Current != 2 {
			t.Fatalf("supervised survivor %d, want the routed one, 2", v.Current)
		}
		h.ensure() // it has one
		h.register(1, "changed")
		h.greeted(1, "quiesce 1", "arm quiesce 1 +30s", "changed") // stale
		h.register(2, "changed")
		h.procs[2].ready = true // routed before: ready as it was
		h.greeted(2, "route 2", "changed")
		h.exit(1, "changed") // 2 was ACTIVE before the restart: nothing to send
		h.do(func() []Action[int] { return h.c.AdoptDone(h.now) }, "stop 3 not re-adopted", "changed")
		h.exit(3, "changed")
	})
	t.Run("routed survivor not yet ACTIVE", func(t *testing.T) {
		h := newHarness(t, testRules())
		for _, routed := range []bool{true, false} {
			p := h.add(&fproc{id: h.newID(), adopted: true})
			h.c.Adopted(h.now, p.id, routed, false)
		}
		h.register(1, "changed")
		h.procs[1].ready = true
		h.greeted(1, "route 1", "changed")
		h.register(2, "changed")
		h.greeted(2, "quiesce 2", "arm quiesce 2 +30s", "changed")
		h.exit(2, "activate 1", "changed") // the only one left
	})
	t.Run("ready before its reply went out", func(t *testing.T) {
		// A survivor's first ready heartbeat can be taken on a tick before
		// its Greeted: it is routed, but ACTIVATEd only once the stale
		// survivor, still ACTIVE, is gone.
		// The manager died mid-deploy: 1 routed, not ACTIVE yet; 2, the old
		// generation, ACTIVE still.
		h := newHarness(t, testRules())
		for _, routed := range []bool{true, false} {
			p := h.add(&fproc{id: h.newID(), adopted: true, wasRouted: routed, activated: !routed})
			h.c.Adopted(h.now, p.id, routed, p.activated)
		}
		h.register(1, "changed")
		h.beat(1, true, "route 1", "ready 1", "changed") // no ACTIVATE: 2 is ACTIVE and not even quiesced
		h.greeted(1, "route 1", "changed")
		h.register(2, "changed")
		h.greeted(2, "quiesce 2", "arm quiesce 2 +30s", "changed")
		h.exit(2, "activate 1", "changed")
	})
	t.Run("no survivor back", func(t *testing.T) {
		h := newHarness(t, testRules())
		p := h.add(&fproc{id: h.newID(), adopted: true})
		h.c.Adopted(h.now, p.id, true, true)
		h.c.Adopting(h.now)
		h.exit(1, "changed") // the window's end respawns
		h.do(func() []Action[int] { return h.c.AdoptDone(h.now) }, "spawn 2", "changed")
	})
	t.Run("survivor of another topology", func(t *testing.T) {
		h := newHarness(t, testRules())
		h.do(func() []Action[int] { return h.c.Retire(h.now) })
		p := h.add(&fproc{id: h.newID(), adopted: true})
		h.c.Adopted(h.now, p.id, true, true)
		h.register(1, "changed")
		h.greeted(1, "quiesce 1", "arm quiesce 1 +30s", "changed")
		h.exit(1, "changed")
		h.do(func() []Action[int] { return h.c.AdoptDone(h.now) })
	})
}

func TestClusterShutdown(t *testing.T) {
	h := newHarness(t, testRules())
	h.serving()
	h.exit(1, "unroute 1", "arm restart 500ms", "changed")
	h.advance(500 * time.Millisecond)
	h.due(TimerRestart, 0, "spawn 2", "changed")
	h.exit(2, "arm restart 1s", "changed")
	h.closed = true
	h.do(func() []Action[int] { return h.c.Close(h.now) }, "disarm restart")
	h.advance(time.Second)
	h.due(TimerRestart, 0)
	h.ensure()
	h.do(func() []Action[int] { return h.c.Release(h.now) }, "changed") // even a deploy's release spawns nothing

	h = newHarness(t, testRules())
	h.serving()
	h.deploySpawned()
	h.closed = true
	h.do(func() []Action[int] { return h.c.Close(h.now) })
	h.do(func() []Action[int] { return h.c.QuiesceAll(h.now) },
		"unroute 1", "quiesce 1", "arm quiesce 1 +30s", "stop 2 shutdown", "changed")
	h.do(func() []Action[int] { return h.c.StopAll(h.now, "shutdown timeout") }, "stop 1 shutdown timeout", "changed")
	h.exit(1, "changed")
	h.exit(2, "changed")
	if len(h.c.procs) != 0 {
		t.Fatalf("%d processes left", len(h.c.procs))
	}
}

// TestClusterHold: a cluster whose lease this host lost is killed at once,
// even while stopping with a grace, and never respawned until held again.
func TestClusterHold(t *testing.T) {
	h := newHarness(t, testRules())
	h.serving()
	h.do(func() []Action[int] { return h.c.Hold(h.now, false) }, "kill 1 lease not held", "changed")
	if h.c.Held() || h.c.Empty() {
		t.Fatalf("held %v, empty %v after the fence", h.c.Held(), h.c.Empty())
	}
	h.do(func() []Action[int] { return h.c.Hold(h.now, false) }) // once is enough
	h.exit(1, "changed")
	if !h.c.Empty() {
		t.Fatal("not empty after the exit")
	}
	h.ensure()
	h.do(func() []Action[int] { return h.c.Hold(h.now, true) }, "spawn 2", "changed")

	// A process stopping with a grace (a silence) is killed all the same.
	h = newHarness(t, testRules())
	h.ensure("spawn 1", "changed")
	h.do(func() []Action[int] { return h.c.Stop(h.now, 1, "test") }, "stop 1 test", "changed")
	h.do(func() []Action[int] { return h.c.Hold(h.now, false) }, "kill 1 lease not held", "changed")
	h.exit(1, "changed")
	h.advance(time.Minute)
	h.due(TimerRestart, 0)

	// A cluster never held here is never spawned.
	h = newHarness(t, testRules())
	h.do(func() []Action[int] { return h.c.Hold(h.now, false) }, "changed")
	h.ensure()
}

func TestClusterActivationWaits(t *testing.T) {
	h := newHarness(t, testRules())
	h.ensure("spawn 1", "changed")
	h.register(1, "changed")
	h.beat(1, true, "route 1", "activate 1", "ready 1", "changed")
	// The ACTIVATE could not go out (a handoff may be on its way): 1 is not
	// active until it is asked again.
	h.procs[1].activated = false
	h.do(func() []Action[int] { return h.c.ActivationWaits(h.now, 1) }, "changed")
	h.do(func() []Action[int] { return h.c.ActivationWaits(h.now, 1) })
	h.do(func() []Action[int] { return h.c.Activate(h.now, 1) }, "activate 1", "changed")
}

func TestClusterIgnores(t *testing.T) {
	h := newHarness(t, testRules())
	h.serving()
	// Events about a stranger change nothing.
	id := 99
	h.do(func() []Action[int] { return h.c.Heartbeat(h.now, id, true) })
	h.do(func() []Action[int] { return h.c.Stop(h.now, id, "deploy") })
	h.do(func() []Action[int] { return h.c.Quiesce(h.now, id) })
	h.do(func() []Action[int] { return h.c.Activate(h.now, id) })
	h.do(func() []Action[int] { return h.c.Exited(h.now, id, "") })
	h.do(func() []Action[int] { return h.c.Due(h.now, TimerQuiesce, id) })
	h.do(func() []Action[int] { return h.c.DeployRouted(h.now, id, true) })
	// A process being stopped is not heard: not even its ready heartbeat.
	h.do(func() []Action[int] { return h.c.Stop(h.now, 1, "deploy") }, "stop 1 deploy", "changed")
	h.advance(time.Minute)
	h.beat(1, true)
	h.tick()
	if pv, _ := h.c.Proc(1); !pv.LastBeat.Equal(t0) {
		t.Errorf("a stopping process's heartbeat was recorded: %v", pv.LastBeat)
	}
}

func TestClusterDeployUnroutesAndRetires(t *testing.T) {
	h := newHarness(t, testRules())
	h.serving()
	h.c.Take(h.now)
	h.do(func() []Action[int] { return h.c.DeployRouted(h.now, 0, false) }, "unroute 1", "changed")
	h.do(func() []Action[int] { return h.c.DeployRouted(h.now, 0, false) }) // nothing routed
	h.exit(1, "changed")                                                    // owned: the deploy's to answer
	h.do(func() []Action[int] { return h.c.Release(h.now) }, "spawn 2", "changed", "changed")
	h.c.Take(h.now)
	h.do(func() []Action[int] { return h.c.Retire(h.now) }, "stop 2 superseded by re-clustering", "changed")
	h.exit(2, "changed")
	if v := h.c.View(); v.HasCurrent || v.LastExit != "exit status 1" {
		t.Fatalf("retired: %+v", v)
	}
}

func TestStateOrder(t *testing.T) {
	life := []State{StateStarting, StateRegistered, StateReady, StateQuiescing, StateStopping, StateExited}
	for i, s := range life {
		for j, u := range life {
			if got := s.Before(u); got != (i < j) {
				t.Errorf("%s.Before(%s) = %v", s, u, got)
			}
		}
	}
}
