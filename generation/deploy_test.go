package generation

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// This file holds the deploy's table tests and the fake they share with the
// randomized test: a clock, and an actuator that records every call, keeps a
// model of every process and of the published routing table, and flags any
// call the deploy should never make.

var t0 = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)

const (
	oldGen = 5
	newGen = 6
)

// fproc is the model of one process. exited means the deploy has been told:
// a call about a process that died but whose exit is not delivered yet is
// legitimate, since the manager does not know yet either.
type fproc struct {
	ref                                                      ProcRef
	topo                                                     Topology
	old                                                      bool
	ready, quiesceSent, quiesced, stopped, activated, exited bool
}

// serving reports whether p is ready and has not been told to leave: such a
// process must find its cluster routed.
func (p *fproc) serving() bool { return p.ready && !p.exited && !p.quiesceSent && !p.stopped }

type relKey struct {
	topo    Topology
	cluster int
}

type fake struct {
	d        *Deploy // to check that nothing moves once the deploy stopped running
	now      time.Time
	seq      uint64
	routes   *Routes
	procs    map[ProcRef]*fproc
	order    []*fproc
	calls    []string
	released map[relKey]int
	spawnErr map[int]error
	closed   bool     // the deploy was seen Done: no call may follow
	errs     []string // calls the deploy should not have made
}

// newFake models a running system on topology from: cluster c has an old,
// ready, ACTIVE process c@5#(c+1) unless c is in missing.
func newFake(from Topology, missing ...int) *fake {
	f := &fake{
		now: t0, seq: 100, routes: NewRoutes(from), procs: map[ProcRef]*fproc{},
		released: map[relKey]int{}, spawnErr: map[int]error{},
	}
	for c := range from.Clusters() {
		if slices.Contains(missing, c) {
			continue
		}
		p := &fproc{ref: ProcRef{Cluster: c, Generation: oldGen, Seq: uint64(c + 1)}, topo: from, old: true, ready: true, activated: true}
		f.add(p)
		f.routes = f.routes.With(p.ref)
	}
	return f
}

func (f *fake) add(p *fproc) { f.procs[p.ref] = p; f.order = append(f.order, p) }

func (f *fake) clock() time.Time { return f.now }

func (f *fake) bad(format string, args ...any) { f.errs = append(f.errs, fmt.Sprintf(format, args...)) }

func (f *fake) call(format string, args ...any) {
	if f.closed {
		f.bad("call after Done: "+format, args...)
	}
	f.calls = append(f.calls, fmt.Sprintf(format, args...))
}

// take returns the calls since the last take.
func (f *fake) take() []string { c := f.calls; f.calls = nil; return c }

func short(p ProcRef) string { return fmt.Sprintf("%d@%d", p.Cluster, p.Generation) }

// live returns the model of p, flagging a call about a process that is
// unknown or already confirmed gone.
func (f *fake) live(what string, p ProcRef) *fproc {
	q := f.procs[p]
	switch {
	case q == nil:
		f.bad("%s of unknown %v", what, p)
		return &fproc{}
	case q.exited:
		f.bad("%s of %v after its exit", what, p)
	}
	if f.released[relKey{q.topo, p.Cluster}] > 0 {
		f.bad("%s of %v after its cluster was released", what, p)
	}
	return q
}

func (f *fake) Spawn(c int, gen int64, topo Topology) (ProcRef, error) {
	if err := f.spawnErr[c]; err != nil {
		f.call("spawn %d@%d: %v", c, gen, err)
		return ProcRef{}, err
	}
	if f.d != nil && f.d.state != StateRunning {
		f.bad("spawn of cluster %d once the deploy is %s", c, f.d.state)
	}
	f.seq++
	p := &fproc{ref: ProcRef{Cluster: c, Generation: gen, Seq: f.seq}, topo: topo}
	f.add(p)
	f.call("spawn %s", short(p.ref))
	if f.released[relKey{topo, c}] > 0 {
		f.bad("spawn of released cluster %d", c)
	}
	return p.ref, nil
}

func (f *fake) Route(update func(*Routes) *Routes) {
	before := f.routes
	snap := before.clone()
	after := update(before)
	if before.Topology != snap.Topology || !slices.Equal(before.procs, snap.procs) {
		f.bad("Route changed the table it was given")
	}
	var diff []string
	if after.Topology != before.Topology {
		diff = append(diff, after.Topology.String())
	}
	for c := range after.Topology.Clusters() {
		p, ok := after.Routed(c)
		q, wasOK := before.Routed(c)
		switch {
		case after.Topology == before.Topology && ok == wasOK && p == q:
		case ok:
			diff = append(diff, fmt.Sprintf("%d=%s", c, short(p)))
		default:
			diff = append(diff, fmt.Sprintf("%d=none", c))
		}
	}
	for c := range after.Topology.Clusters() {
		p, ok := after.Routed(c)
		if q, wasOK := before.Routed(c); ok && (!wasOK || p != q || after.Topology != before.Topology) {
			if m := f.live("route", p); !m.ready {
				f.bad("routed %v before it was ready", p)
			}
			if f.d != nil && f.d.state != StateRunning {
				f.bad("routed %v once the deploy is %s", p, f.d.state)
			}
		}
	}
	f.routes = after
	f.call("route %s", strings.Join(diff, " "))
}

// notRouted checks that p, given op, is not routed: no process is quiesced or
// stopped while it still gets requests.
func (f *fake) notRouted(op string, p ProcRef) {
	if r, ok := f.routes.Routed(p.Cluster); ok && r == p {
		f.bad("%s of %v while it is routed", op, p)
	}
}

func (f *fake) Quiesce(p ProcRef) {
	q := f.live("quiesce", p)
	if !q.old || q.quiesceSent {
		f.bad("quiesce of %v (old %v, sent before %v)", p, q.old, q.quiesceSent)
	}
	f.notRouted("quiesce", p)
	q.quiesceSent = true
	f.call("quiesce %s", short(p))
}

func (f *fake) Stop(p ProcRef) {
	q := f.live("stop", p)
	if q.stopped {
		f.bad("stop of %v twice", p)
	}
	f.notRouted("stop", p)
	q.stopped = true
	f.call("stop %s", short(p))
}

func (f *fake) Activate(p ProcRef) {
	q := f.live("activate", p)
	if q.activated || !q.ready {
		f.bad("activate of %v (active %v, ready %v)", p, q.activated, q.ready)
	}
	if r, ok := f.routes.Routed(p.Cluster); !ok || r != p {
		f.bad("activate of %v while it is not routed", p)
	}
	q.activated = true
	f.call("activate %s", short(p))
}

func (f *fake) Release(c int) {
	k := relKey{f.routes.Topology, c}
	if f.released[k] > 0 {
		f.bad("release of cluster %d twice", c)
	}
	f.released[k]++
	f.call("release %d", c)
}

// exited tells d that p exited, then plays the manager's supervision: the
// exit of a process in a cluster the deploy does not own unroutes it (the
// respawn that follows is not modelled).
func (f *fake) exited(d *Deploy, p ProcRef) {
	d.Exited(p)
	f.procs[p].exited = true
	if !d.Owns(p.Cluster) && f.procs[p].topo == f.routes.Topology {
		f.routes = f.routes.Without(p)
	}
}

// overlap reports whether two processes hold a shard in common.
func overlap(a, b *fproc) bool {
	af, al := a.topo.Range(a.ref.Cluster)
	bf, bl := b.topo.Range(b.ref.Cluster)
	return af <= bl && bf <= al
}

// violations checks the invariants that must hold after every event.
func (f *fake) violations(d *Deploy) []string {
	v := slices.Clone(f.errs)
	rt := f.routes
	for c := range rt.Topology.Clusters() {
		if p, ok := rt.Routed(c); ok {
			switch q := f.procs[p]; {
			case q == nil:
				v = append(v, fmt.Sprintf("cluster %d routed to unknown %v", c, p))
			case q.exited:
				v = append(v, fmt.Sprintf("cluster %d routed to %v, which exited", c, p))
			case !q.serving():
				v = append(v, fmt.Sprintf("cluster %d routed to %v, which is not serving", c, p))
			case q.topo != rt.Topology:
				v = append(v, fmt.Sprintf("cluster %d routed to %v of %v", c, p, q.topo))
			}
			continue
		}
		for _, q := range f.order {
			if q.topo == rt.Topology && q.ref.Cluster == c && q.serving() {
				v = append(v, fmt.Sprintf("cluster %d has %v ready but nothing routed", c, q.ref))
			}
		}
	}
	for i, a := range f.order {
		if a.old && !a.exited && !a.quiesceSent && !a.stopped && a.topo == rt.Topology {
			if r, _ := rt.Routed(a.ref.Cluster); r != a.ref {
				v = append(v, fmt.Sprintf("old %v was never told to leave but is not routed", a.ref))
			}
		}
		for _, b := range f.order[i+1:] {
			if a.activated && b.activated && !a.exited && !b.exited && overlap(a, b) {
				v = append(v, fmt.Sprintf("%v and %v are both ACTIVE on the same shards", a.ref, b.ref))
			}
		}
	}
	if t, ok := d.NextDeadline(); ok && !t.After(f.now) {
		v = append(v, fmt.Sprintf("deadline %v left unhandled at %v", t, f.now))
	}
	if _, err := json.Marshal(d.Status()); err != nil {
		v = append(v, fmt.Sprintf("status: %v", err))
	}
	if d.Done() && !f.closed { // checked once: afterwards supervision owns everything
		f.closed = true
		v = append(v, f.endViolations(d)...)
	}
	return v
}

// endViolations checks the state a finished deploy leaves behind.
func (f *fake) endViolations(d *Deploy) []string {
	var v []string
	st := d.Status()
	if st.State == StateRunning || st.State == StatePending || st.Finished.IsZero() {
		v = append(v, fmt.Sprintf("done but state %q, finished %v", st.State, st.Finished))
	}
	rt := f.routes
	for i, a := range f.order {
		r, ok := rt.Routed(a.ref.Cluster)
		routed := ok && r == a.ref && a.topo == rt.Topology
		if !a.exited && !(routed && a.activated) {
			v = append(v, fmt.Sprintf("done but %v is alive and not the routed, ACTIVE process", a.ref))
		}
		for _, b := range f.order[i+1:] {
			if !a.exited && !b.exited && overlap(a, b) {
				v = append(v, fmt.Sprintf("done but %v and %v are both alive on the same shards", a.ref, b.ref))
			}
		}
	}
	for c := range rt.Topology.Clusters() {
		if p, ok := rt.Routed(c); ok && !f.procs[p].activated {
			v = append(v, fmt.Sprintf("done but routed %v is not ACTIVE", p))
		}
	}
	for _, c := range st.Clusters {
		switch c.Phase {
		case PhaseActivated, PhaseFailed, PhaseSkipped:
		case PhaseOldExited:
			if c.Cluster < st.To.Clusters() {
				v = append(v, fmt.Sprintf("done but cluster %d is %s", c.Cluster, c.Phase))
			}
		default:
			v = append(v, fmt.Sprintf("done but cluster %d is %s", c.Cluster, c.Phase))
		}
	}
	if st.State == StateSucceeded {
		for _, c := range st.Clusters {
			if c.Cluster >= rt.Topology.Clusters() {
				continue
			}
			p, ok := rt.Routed(c.Cluster)
			switch {
			case rt.Topology != st.To:
				v = append(v, fmt.Sprintf("succeeded but %v is routed", rt.Topology))
			case ok && p.Generation != st.Generation:
				v = append(v, fmt.Sprintf("succeeded but cluster %d routes to %v", c.Cluster, p))
			case !ok && !f.procs[*c.New].exited: // else it died after its release
				v = append(v, fmt.Sprintf("succeeded but cluster %d routes nowhere", c.Cluster))
			}
		}
	}
	return v
}

// harness drives one deploy in the table tests.
type harness struct {
	t *testing.T
	f *fake
	d *Deploy
}

// plan returns a plan from topology from to to, with 2m/30s timeouts.
func plan(from, to Topology, f *fake, maxParallel int, clusters ...int) Plan {
	return Plan{
		ID: "d1", Gen: newGen, From: from, To: to, Current: f.routes, Clusters: clusters,
		MaxParallel: maxParallel, ReadyTimeout: 2 * time.Minute, QuiesceTimeout: 30 * time.Second,
	}
}

func topo(total, per int) Topology { return Topology{Total: total, PerCluster: per} }

// start builds and starts a deploy and checks its first calls.
func start(t *testing.T, f *fake, p Plan, want ...string) *harness {
	t.Helper()
	d, err := NewDeploy(p, f.clock, f)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, f: f, d: d}
	f.d = d
	if len(f.take()) != 0 {
		t.Fatal("NewDeploy made calls")
	}
	h.do(d.Start, want...)
	return h
}

// do runs one event and checks the calls it made and every invariant.
func (h *harness) do(event func(), want ...string) {
	h.t.Helper()
	event()
	if got := h.f.take(); !slices.Equal(got, want) {
		h.t.Fatalf("calls:\n got  %q\n want %q", got, want)
	}
	if v := h.f.violations(h.d); len(v) > 0 {
		h.t.Fatalf("invariants:\n%s", strings.Join(v, "\n"))
	}
}

func (h *harness) old(c int) ProcRef {
	return ProcRef{Cluster: c, Generation: oldGen, Seq: uint64(c + 1)}
}

// new returns the newest process spawned for cluster c.
func (h *harness) new(c int) ProcRef {
	for _, p := range slices.Backward(h.f.order) {
		if !p.old && p.ref.Cluster == c {
			return p.ref
		}
	}
	h.t.Fatalf("no new process for cluster %d", c)
	return ProcRef{}
}

func (h *harness) ready(c int, want ...string) {
	h.t.Helper()
	p := h.new(c)
	h.f.procs[p].ready = true
	h.do(func() { h.d.Ready(p) }, want...)
}

func (h *harness) quiesced(c int, want ...string) {
	h.t.Helper()
	h.f.procs[h.old(c)].quiesced = true
	h.do(func() { h.d.Quiesced(h.old(c)) }, want...)
}

func (h *harness) exit(p ProcRef, want ...string) {
	h.t.Helper()
	h.do(func() { h.f.exited(h.d, p) }, want...)
}

func (h *harness) exitOld(c int, want ...string) { h.t.Helper(); h.exit(h.old(c), want...) }
func (h *harness) exitNew(c int, want ...string) { h.t.Helper(); h.exit(h.new(c), want...) }

// tick advances the clock by dt and ticks.
func (h *harness) tick(dt time.Duration, want ...string) {
	h.t.Helper()
	h.f.now = h.f.now.Add(dt)
	h.do(h.d.Tick, want...)
}

// end checks the deploy finished with state and reason, and the phase of
// each cluster in status order.
func (h *harness) end(state State, reason string, phases ...Phase) Status {
	h.t.Helper()
	st := h.d.Status()
	if !h.d.Done() || st.State != state || st.Reason != reason {
		h.t.Fatalf("done %v, state %q, reason %q; want %q, %q", h.d.Done(), st.State, st.Reason, state, reason)
	}
	var got []Phase
	for _, c := range st.Clusters {
		got = append(got, c.Phase)
	}
	if !slices.Equal(got, phases) {
		h.t.Fatalf("phases %v, want %v", got, phases)
	}
	return st
}

func (h *harness) phases(phases ...Phase) {
	h.t.Helper()
	var got []Phase
	for _, c := range h.d.Status().Clusters {
		got = append(got, c.Phase)
	}
	if !slices.Equal(got, phases) {
		h.t.Fatalf("phases %v, want %v", got, phases)
	}
}

const (
	pend = PhasePending
	spwn = PhaseSpawned
	rdy  = PhaseReady
	rtd  = PhaseRouted
	qing = PhaseQuiescing
	qd   = PhaseQuiesced
	oldx = PhaseOldExited
	actv = PhaseActivated
	fail = PhaseFailed
	skip = PhaseSkipped
)

var t4x2 = topo(4, 2) // two clusters

func TestRollingHappyPath(t *testing.T) {
	f := newFake(t4x2)
	h := start(t, f, plan(t4x2, t4x2, f, 1), "spawn 0@6")
	h.phases(spwn, pend)
	h.tick(time.Second)
	h.ready(0, "route 0=0@6", "quiesce 0@5")
	h.phases(qing, pend)
	h.tick(time.Second)
	h.quiesced(0)
	h.phases(qd, pend)
	h.tick(time.Second)
	h.exitOld(0, "activate 0@6", "release 0", "spawn 1@6")
	h.phases(actv, spwn)
	h.ready(1, "route 1=1@6", "quiesce 1@5")
	h.exitOld(1, "activate 1@6", "release 1")
	st := h.end(StateSucceeded, "", actv, actv)

	c := st.Clusters[0]
	wantTimes := []time.Time{t0, t0.Add(time.Second), t0.Add(time.Second), t0.Add(time.Second), t0.Add(2 * time.Second), t0.Add(3 * time.Second), t0.Add(3 * time.Second)}
	gotTimes := []time.Time{c.SpawnedAt, c.ReadyAt, c.RoutedAt, c.QuiesceSentAt, c.QuiescedAt, c.ExitedAt, c.ActivatedAt}
	if !slices.Equal(gotTimes, wantTimes) || !c.StopSentAt.IsZero() {
		t.Errorf("cluster 0 times %v, want %v", gotTimes, wantTimes)
	}
	if *c.Old != h.old(0) || *c.New != h.new(0) {
		t.Errorf("cluster 0 old %v new %v", c.Old, c.New)
	}
	if !st.Started.Equal(t0) || !st.Finished.Equal(t0.Add(3*time.Second)) {
		t.Errorf("started %v finished %v", st.Started, st.Finished)
	}
	// Done: every later event is ignored.
	h.do(func() { h.d.Exited(h.new(0)); h.d.Abort("late"); h.d.Tick() })
	h.end(StateSucceeded, "", actv, actv)
}

func TestRollingMaxParallel(t *testing.T) {
	t12 := topo(12, 2) // six clusters
	f := newFake(t12)
	h := start(t, f, plan(t12, t12, f, 4), "spawn 0@6", "spawn 1@6", "spawn 2@6", "spawn 3@6")
	h.ready(2, "route 2=2@6", "quiesce 2@5")
	h.ready(0, "route 0=0@6", "quiesce 0@5")
	h.exitOld(2, "activate 2@6", "release 2", "spawn 4@6")
	h.exitOld(0, "activate 0@6", "release 0", "spawn 5@6")
	h.phases(actv, spwn, actv, spwn, spwn, spwn)
	for _, c := range []int{1, 3, 4, 5} {
		h.ready(c, fmt.Sprintf("route %d=%d@6", c, c), fmt.Sprintf("quiesce %d@5", c))
		h.exitOld(c, fmt.Sprintf("activate %d@6", c), fmt.Sprintf("release %d", c))
	}
	h.end(StateSucceeded, "", actv, actv, actv, actv, actv, actv)
}

func TestRollingChosenClusters(t *testing.T) {
	t8 := topo(8, 2)
	f := newFake(t8)
	h := start(t, f, plan(t8, t8, f, 1, 3, 1), "spawn 3@6")
	h.ready(3, "route 3=3@6", "quiesce 3@5")
	h.exitOld(3, "activate 3@6", "release 3", "spawn 1@6")
	h.ready(1, "route 1=1@6", "quiesce 1@5")
	// Clusters the deploy does not own are the supervisor's business.
	if h.d.Owns(0) || !h.d.Owns(1) {
		t.Fatal("wrong clusters owned")
	}
	h.exitOld(0)
	if _, ok := f.routes.Routed(0); ok {
		t.Fatal("the supervisor did not get the exit of cluster 0")
	}
	h.exitOld(1, "activate 1@6", "release 1")
	h.end(StateSucceeded, "", actv, actv)
}

// A recycle is a rolling deploy of the listed clusters at the generation they
// already run: a fresh process of 1@5 replaces the old one by the four steps.
func TestRecycle(t *testing.T) {
	f := newFake(t4x2)
	p := plan(t4x2, t4x2, f, 1, 1)
	p.Gen, p.Recycle = oldGen, true
	h := start(t, f, p, "spawn 1@5")
	if h.d.Owns(0) || !h.d.Owns(1) {
		t.Fatal("a recycle of cluster 1 owns the wrong clusters")
	}
	h.ready(1, "route 1=1@5", "quiesce 1@5")
	h.quiesced(1)
	h.exitOld(1, "activate 1@5", "release 1")
	st := h.end(StateSucceeded, "", actv)
	if st.Clusters[0].New.Seq == st.Clusters[0].Old.Seq {
		t.Fatalf("recycled into the same process: %+v", st.Clusters[0])
	}
}

// Resume mode: the old process is unrouted and quiesced first; the new one is
// spawned once the old is gone (so it can RESUME its sessions), and routed and
// ACTIVATEd when ready.
func TestResumeHappyPath(t *testing.T) {
	f := newFake(t4x2)
	p := plan(t4x2, t4x2, f, 1)
	p.Resume = true
	h := start(t, f, p, "route 0=none", "quiesce 0@5")
	h.phases(qing, pend)
	h.tick(time.Second)
	h.quiesced(0)
	h.phases(qd, pend)
	h.exitOld(0, "spawn 0@6")
	h.phases(spwn, pend)
	h.tick(time.Second)
	h.ready(0, "route 0=0@6", "activate 0@6", "release 0", "route 1=none", "quiesce 1@5")
	h.exitOld(1, "spawn 1@6")
	h.ready(1, "route 1=1@6", "activate 1@6", "release 1")
	st := h.end(StateSucceeded, "", actv, actv)
	c := st.Clusters[0]
	if st.Mode != "resume" || c.RoutedAt.Sub(c.QuiesceSentAt) != 2*time.Second || !c.ExitedAt.Before(c.SpawnedAt.Add(1)) {
		t.Errorf("mode %q, cluster 0 %+v", st.Mode, c)
	}
}

// An old process that ignores QUIESCE is killed at QuiesceTimeout; its
// confirmed exit lets the new one start.
func TestResumeOldIgnoresQuiesce(t *testing.T) {
	f := newFake(t4x2)
	p := plan(t4x2, t4x2, f, 1, 1)
	p.Resume = true
	h := start(t, f, p, "route 1=none", "quiesce 1@5")
	h.tick(29 * time.Second)
	h.tick(time.Second, "stop 1@5")
	h.exitOld(1, "spawn 1@6")
	h.ready(1, "route 1=1@6", "activate 1@6", "release 1")
	h.end(StateSucceeded, "", actv)
}

// A new process that is not ready in time is stopped; the old is gone, so
// the cluster goes back to supervision, which respawns it.
func TestResumeNewNotReady(t *testing.T) {
	f := newFake(t4x2)
	p := plan(t4x2, t4x2, f, 1)
	p.Resume = true
	h := start(t, f, p, "route 0=none", "quiesce 0@5")
	h.exitOld(0, "spawn 0@6")
	h.tick(2*time.Minute, "stop 0@6", "release 1")
	h.exitNew(0, "release 0")
	h.end(StateFailed, "cluster 0: generation 6 not ready within 2m0s", fail, skip)
}

// An abort while the old process hands over kills it; its exit releases the
// cluster to supervision, with no new process spawned.
func TestResumeAbortWhileHandingOver(t *testing.T) {
	f := newFake(t4x2)
	p := plan(t4x2, t4x2, f, 1)
	p.Resume = true
	h := start(t, f, p, "route 0=none", "quiesce 0@5")
	h.do(func() { h.d.Abort("manager shutting down") }, "stop 0@5", "release 1")
	h.exitOld(0, "release 0")
	h.end(StateAborted, "aborted: manager shutting down", fail, skip)
}

func TestRollingNotReadyInTime(t *testing.T) {
	f := newFake(t4x2)
	h := start(t, f, plan(t4x2, t4x2, f, 1), "spawn 0@6")
	h.tick(2*time.Minute - 1)
	if dl, ok := h.d.NextDeadline(); !ok || !dl.Equal(t0.Add(2*time.Minute)) {
		t.Fatalf("NextDeadline = %v, %v", dl, ok)
	}
	h.tick(1, "stop 0@6", "release 1")
	h.phases(fail, skip)
	// A Ready that comes too late is not routed.
	h.ready(0)
	h.exitNew(0, "release 0")
	st := h.end(StateFailed, "cluster 0: generation 6 not ready within 2m0s", fail, skip)
	if st.Clusters[0].Reason != st.Reason || !st.Clusters[0].StopSentAt.Equal(t0.Add(2*time.Minute)) {
		t.Errorf("cluster 0: %+v", st.Clusters[0])
	}
}

func TestRollingLateReadyLosesToTimeout(t *testing.T) {
	f := newFake(t4x2)
	h := start(t, f, plan(t4x2, t4x2, f, 1), "spawn 0@6")
	f.now = f.now.Add(3 * time.Minute) // no Tick: the event itself checks the deadline
	h.ready(0, "stop 0@6", "release 1")
	h.exitNew(0, "release 0")
	h.end(StateFailed, "cluster 0: generation 6 not ready within 2m0s", fail, skip)
}

func TestRollingNewExitsBeforeReady(t *testing.T) {
	f := newFake(t4x2)
	h := start(t, f, plan(t4x2, t4x2, f, 1), "spawn 0@6")
	h.exitNew(0, "release 0", "release 1")
	h.end(StateFailed, "cluster 0: generation 6 exited before it was ready", fail, skip)
}

func TestRollingSpawnError(t *testing.T) {
	f := newFake(t4x2)
	f.spawnErr[1] = errors.New("no such file")
	h := start(t, f, plan(t4x2, t4x2, f, 1), "spawn 0@6")
	h.ready(0, "route 0=0@6", "quiesce 0@5")
	h.exitOld(0, "activate 0@6", "release 0", "spawn 1@6: no such file", "release 1")
	h.end(StateFailed, "cluster 1: spawn generation 6: no such file", actv, fail)
}

// With max_parallel 4, a failure rolls back the clusters not yet routed and
// lets the routed ones finish; clusters already moved stay moved.
func TestRollingParallelFailure(t *testing.T) {
	t12 := topo(12, 2)
	f := newFake(t12)
	h := start(t, f, plan(t12, t12, f, 4), "spawn 0@6", "spawn 1@6", "spawn 2@6", "spawn 3@6")
	h.ready(0, "route 0=0@6", "quiesce 0@5")
	h.exitOld(0, "activate 0@6", "release 0", "spawn 4@6")
	h.ready(1, "route 1=1@6", "quiesce 1@5")
	h.exitNew(2, "release 2", "stop 3@6", "stop 4@6", "release 5")
	h.phases(actv, qing, fail, fail, fail, skip)
	st := h.d.Status()
	if st.Clusters[3].Reason != "rolled back: cluster 2: generation 6 exited before it was ready" {
		t.Errorf("cluster 3 reason %q", st.Clusters[3].Reason)
	}
	h.exitNew(3, "release 3")
	h.tick(30*time.Second, "stop 1@5") // cluster 1's old ignores QUIESCE
	h.exitOld(1, "activate 1@6", "release 1")
	h.exitNew(4, "release 4")
	h.end(StateFailed, "cluster 2: generation 6 exited before it was ready", actv, actv, fail, fail, fail, skip)
	for c, gen := range []int64{6, 6, 5, 5, 5, 5} {
		if p, ok := f.routes.Routed(c); !ok || p.Generation != gen {
			t.Errorf("cluster %d routed to %v, want generation %d", c, p, gen)
		}
	}
}

func TestRollingOldIgnoresQuiesce(t *testing.T) {
	f := newFake(t4x2)
	h := start(t, f, plan(t4x2, t4x2, f, 1, 0), "spawn 0@6")
	h.ready(0, "route 0=0@6", "quiesce 0@5")
	if dl, ok := h.d.NextDeadline(); !ok || !dl.Equal(t0.Add(30*time.Second)) {
		t.Fatalf("NextDeadline = %v, %v", dl, ok)
	}
	h.tick(29 * time.Second)
	h.tick(time.Second, "stop 0@5")
	if _, ok := h.d.NextDeadline(); ok {
		t.Fatal("a deadline after the kill")
	}
	h.tick(time.Hour) // the kill takes what it takes; the kernel's word is awaited
	h.exitOld(0, "activate 0@6", "release 0")
	st := h.end(StateSucceeded, "", actv)
	if st.Clusters[0].StopSentAt.IsZero() || !st.Clusters[0].QuiescedAt.IsZero() {
		t.Errorf("cluster 0: %+v", st.Clusters[0])
	}
}

func TestRollingOldCrashesBeforeNewReady(t *testing.T) {
	f := newFake(t4x2)
	h := start(t, f, plan(t4x2, t4x2, f, 1, 0), "spawn 0@6")
	h.exitOld(0, "route 0=none")
	h.phases(spwn)
	h.ready(0, "route 0=0@6", "activate 0@6", "release 0")
	h.end(StateSucceeded, "", actv)
}

func TestRollingOldCrashesThenNewFails(t *testing.T) {
	f := newFake(t4x2)
	h := start(t, f, plan(t4x2, t4x2, f, 1), "spawn 0@6")
	h.exitOld(0, "route 0=none")
	h.tick(2*time.Minute, "stop 0@6", "release 1")
	h.exitNew(0, "release 0") // the supervisor respawns it at the old generation
	h.end(StateFailed, "cluster 0: generation 6 not ready within 2m0s", fail, skip)
}

func TestRollingOldCrashesAfterSwitch(t *testing.T) {
	f := newFake(t4x2)
	h := start(t, f, plan(t4x2, t4x2, f, 1, 1), "spawn 1@6")
	h.ready(1, "route 1=1@6", "quiesce 1@5")
	h.exitOld(1, "activate 1@6", "release 1")
	h.end(StateSucceeded, "", actv)
}

func TestRollingNewExitsAfterSwitch(t *testing.T) {
	f := newFake(t4x2)
	h := start(t, f, plan(t4x2, t4x2, f, 1), "spawn 0@6")
	h.ready(0, "route 0=0@6", "quiesce 0@5")
	h.exitNew(0, "route 0=none", "release 1")
	h.phases(fail, skip)
	// The old one was told to QUIESCE: it drains and goes; then supervision
	// respawns cluster 0 at generation 6. No ACTIVATE from the deploy.
	h.quiesced(0)
	h.exitOld(0, "release 0")
	st := h.end(StateFailed, "cluster 0: generation 6 exited after the switch, before ACTIVATE", fail, skip)
	if st.Clusters[0].ExitedAt.IsZero() || !st.Clusters[0].ActivatedAt.IsZero() {
		t.Errorf("cluster 0: %+v", st.Clusters[0])
	}
}

func TestRollingNoOldProcess(t *testing.T) {
	f := newFake(t4x2, 1)
	h := start(t, f, plan(t4x2, t4x2, f, 1), "spawn 0@6")
	h.ready(0, "route 0=0@6", "quiesce 0@5")
	h.exitOld(0, "activate 0@6", "release 0", "spawn 1@6")
	h.ready(1, "route 1=1@6", "activate 1@6", "release 1")
	st := h.end(StateSucceeded, "", actv, actv)
	if st.Clusters[1].Old != nil {
		t.Errorf("cluster 1 old %v", st.Clusters[1].Old)
	}
}

// A cluster whose old process dies before its turn is started at once, past
// max_parallel, instead of waiting dead behind the queue.
func TestRollingPendingOldCrashes(t *testing.T) {
	t6 := topo(6, 2)
	f := newFake(t6)
	h := start(t, f, plan(t6, t6, f, 1), "spawn 0@6")
	h.exitOld(2, "route 2=none", "spawn 2@6")
	h.phases(spwn, pend, spwn)
	h.ready(2, "route 2=2@6", "activate 2@6", "release 2")
	h.ready(0, "route 0=0@6", "quiesce 0@5")
	h.exitOld(0, "activate 0@6", "release 0", "spawn 1@6")
	h.ready(1, "route 1=1@6", "quiesce 1@5")
	h.exitOld(1, "activate 1@6", "release 1")
	h.end(StateSucceeded, "", actv, actv, actv)
}

func TestRollingAbort(t *testing.T) {
	t12 := topo(12, 2)
	f := newFake(t12)
	h := start(t, f, plan(t12, t12, f, 3), "spawn 0@6", "spawn 1@6", "spawn 2@6")
	h.ready(0, "route 0=0@6", "quiesce 0@5")
	h.exitOld(0, "activate 0@6", "release 0", "spawn 3@6")
	h.ready(1, "route 1=1@6", "quiesce 1@5")
	h.ready(2, "route 2=2@6", "quiesce 2@5")
	h.quiesced(2)
	h.do(func() { h.d.Abort("manager stopping") },
		"stop 3@6", "release 4", "release 5", "stop 1@5", "stop 2@5")
	h.phases(actv, qing, qd, fail, skip, skip)
	h.exitNew(3, "release 3")
	h.exitOld(2, "activate 2@6", "release 2")
	if h.d.Done() {
		t.Fatal("done before every stopped process is gone")
	}
	h.do(func() { h.d.Abort("again") })
	h.exitOld(1, "activate 1@6", "release 1")
	h.end(StateAborted, "aborted: manager stopping", actv, actv, actv, fail, skip, skip)
}

func TestAbortBeforeStart(t *testing.T) {
	f := newFake(t4x2)
	d, err := NewDeploy(plan(t4x2, t4x2, f, 1), f.clock, f)
	if err != nil {
		t.Fatal(err)
	}
	d.Abort("shutdown")
	d.Start()
	d.Ready(ProcRef{})
	if !d.Done() || d.Status().State != StateAborted || len(f.take()) != 0 {
		t.Fatalf("done %v, status %+v, calls %v", d.Done(), d.Status(), f.calls)
	}
}

func TestEventsIgnored(t *testing.T) {
	f := newFake(t4x2)
	d, err := NewDeploy(plan(t4x2, t4x2, f, 1), f.clock, f)
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, f: f, d: d}
	h.do(func() { d.Exited(h.old(0)); d.Tick() }) // before Start
	if st := d.Status(); st.State != StatePending || st.Clusters[0].Phase != pend {
		t.Fatalf("status before start: %+v", st)
	}
	h.do(d.Start, "spawn 0@6")
	h.do(d.Start)
	unknown := ProcRef{Cluster: 0, Generation: newGen, Seq: 999}
	h.do(func() {
		d.Ready(unknown)
		d.Exited(unknown)
		d.Quiesced(unknown)
		d.Ready(h.old(0))     // old processes are ready already
		d.Quiesced(h.old(0))  // not asked to QUIESCE yet
		d.Quiesced(h.new(0))  // new processes are never asked
		f.exited(d, h.old(1)) // not its turn, but handled: see TestRollingPendingOldCrashes
	}, "route 1=none", "spawn 1@6")
	h.ready(0, "route 0=0@6", "quiesce 0@5")
	h.ready(0)
	h.quiesced(0)
	h.quiesced(0)
	if st := d.Status().Clusters[0]; !st.QuiescedAt.Equal(t0) {
		t.Fatalf("quiesced at %v", st.QuiescedAt)
	}
	h.exitOld(0, "activate 0@6", "release 0")
	h.exitOld(0)
	h.exitNew(1, "release 1")
	h.exitNew(1)
	h.end(StateFailed, "cluster 1: generation 6 exited before it was ready", actv, fail)
}

// The re-clustering most tests below take: 16 shards / 4 per cluster (4
// clusters) to 24 / 8 (3 clusters).
var reclusterFrom, reclusterTo = topo(16, 4), topo(24, 8)

// startRecluster starts that re-clustering, which spawns the three new
// clusters first.
func startRecluster(t *testing.T) *harness {
	t.Helper()
	f := newFake(reclusterFrom)
	return start(t, f, plan(reclusterFrom, reclusterTo, f, 0), "spawn 0@6", "spawn 1@6", "spawn 2@6")
}

func TestReclusterHappyPath(t *testing.T) {
	h := startRecluster(t)
	h.ready(2)
	h.ready(0)
	h.phases(rdy, spwn, rdy, pend)
	h.ready(1, "route 24 shards / 8 per cluster 0=0@6 1=1@6 2=2@6", "quiesce 0@5", "quiesce 1@5", "quiesce 2@5", "quiesce 3@5")
	h.phases(qing, qing, qing, qing)
	h.quiesced(3)
	h.exitOld(3)
	h.exitOld(0)
	h.exitOld(2)
	h.phases(oldx, qing, oldx, oldx)
	h.tick(30*time.Second, "stop 1@5")
	h.exitOld(1, "activate 0@6", "activate 1@6", "activate 2@6", "release 0", "release 1", "release 2")
	h.end(StateSucceeded, "", actv, actv, actv, oldx)
	if h.f.routes.Topology != reclusterTo {
		t.Errorf("routed topology %v", h.f.routes.Topology)
	}
}

// Same total, other split: 16 / 4 (4 clusters) to 16 / 8 (2) and back.
func TestReclusterSameTotal(t *testing.T) {
	t.Run("fewer clusters", func(t *testing.T) {
		from, to := topo(16, 4), topo(16, 8)
		f := newFake(from)
		h := start(t, f, plan(from, to, f, 0), "spawn 0@6", "spawn 1@6")
		h.ready(0)
		h.ready(1, "route 16 shards / 8 per cluster 0=0@6 1=1@6", "quiesce 0@5", "quiesce 1@5", "quiesce 2@5", "quiesce 3@5")
		for c := range 3 {
			h.exitOld(c)
		}
		h.exitOld(3, "activate 0@6", "activate 1@6", "release 0", "release 1")
		h.end(StateSucceeded, "", actv, actv, oldx, oldx)
	})
	t.Run("more clusters", func(t *testing.T) {
		from, to := topo(16, 8), topo(16, 4)
		f := newFake(from)
		h := start(t, f, plan(from, to, f, 0), "spawn 0@6", "spawn 1@6", "spawn 2@6", "spawn 3@6")
		for c := range 3 {
			h.ready(c)
		}
		h.ready(3, "route 16 shards / 4 per cluster 0=0@6 1=1@6 2=2@6 3=3@6", "quiesce 0@5", "quiesce 1@5")
		h.exitOld(0)
		h.exitOld(1, "activate 0@6", "activate 1@6", "activate 2@6", "activate 3@6", "release 0", "release 1", "release 2", "release 3")
		st := h.end(StateSucceeded, "", actv, actv, actv, actv)
		if st.Clusters[2].Old != nil || st.Clusters[2].New == nil {
			t.Errorf("cluster 2: %+v", st.Clusters[2])
		}
	})
}

func TestReclusterFailure(t *testing.T) {
	h := startRecluster(t)
	h.ready(0)
	h.ready(1)
	h.tick(2*time.Minute, "stop 0@6", "stop 1@6", "stop 2@6")
	h.phases(fail, fail, fail, fail)
	h.exitNew(0)
	h.exitNew(2)
	h.exitNew(1, "release 0", "release 1", "release 2", "release 3") // the old topology's clusters
	st := h.end(StateFailed, "cluster 2: generation 6 not ready within 2m0s", fail, fail, fail, fail)
	if h.f.routes.Topology != reclusterFrom || st.Clusters[0].Reason != "rolled back: "+st.Reason {
		t.Errorf("routes %v, cluster 0 %+v", h.f.routes.Topology, st.Clusters[0])
	}
}

func TestReclusterSpawnError(t *testing.T) {
	f := newFake(reclusterFrom)
	f.spawnErr[1] = errors.New("boom")
	h := start(t, f, plan(reclusterFrom, reclusterTo, f, 0), "spawn 0@6", "spawn 1@6: boom", "stop 0@6")
	h.exitNew(0, "release 0", "release 1", "release 2", "release 3")
	h.end(StateFailed, "cluster 1: spawn generation 6: boom", fail, fail, fail, fail)
}

// An old process that dies before the switch is unrouted; the new topology
// takes its shards over at the switch.
func TestReclusterOldCrashesBeforeSwitch(t *testing.T) {
	h := startRecluster(t)
	h.exitOld(3, "route 3=none")
	h.ready(0)
	h.ready(1)
	h.ready(2, "route 24 shards / 8 per cluster 0=0@6 1=1@6 2=2@6", "quiesce 0@5", "quiesce 1@5", "quiesce 2@5")
	h.phases(qing, qing, qing, oldx)
	h.exitOld(0)
	h.exitOld(1)
	h.exitOld(2, "activate 0@6", "activate 1@6", "activate 2@6", "release 0", "release 1", "release 2")
	h.end(StateSucceeded, "", actv, actv, actv, oldx)
}

func TestReclusterOldCrashThenFailure(t *testing.T) {
	h := startRecluster(t)
	h.exitOld(3, "route 3=none")
	h.exitNew(1, "stop 0@6", "stop 2@6")
	h.exitNew(0)
	h.exitNew(2, "release 0", "release 1", "release 2", "release 3")
	h.end(StateFailed, "cluster 1: generation 6 exited before it was ready", fail, fail, fail, fail)
}

func TestReclusterNewExitsAfterSwitch(t *testing.T) {
	h := startRecluster(t)
	for c := range 3 {
		h.ready(c, func() []string {
			if c < 2 {
				return nil
			}
			return []string{"route 24 shards / 8 per cluster 0=0@6 1=1@6 2=2@6", "quiesce 0@5", "quiesce 1@5", "quiesce 2@5", "quiesce 3@5"}
		}()...)
	}
	h.exitNew(1, "route 1=none")
	for c := range 3 {
		h.exitOld(c)
	}
	h.exitOld(3, "activate 0@6", "activate 2@6", "release 0", "release 1", "release 2")
	h.end(StateFailed, "cluster 1: generation 6 exited after the switch, before ACTIVATE", actv, fail, actv, oldx)
}

func TestReclusterAbort(t *testing.T) {
	t.Run("before the switch", func(t *testing.T) {
		h := startRecluster(t)
		h.ready(0)
		h.do(func() { h.d.Abort("bye") }, "stop 0@6", "stop 1@6", "stop 2@6")
		h.exitNew(0)
		h.exitNew(1)
		h.exitNew(2, "release 0", "release 1", "release 2", "release 3")
		h.end(StateAborted, "aborted: bye", fail, fail, fail, fail)
	})
	t.Run("after the switch", func(t *testing.T) {
		h := startRecluster(t)
		h.ready(0)
		h.ready(1)
		h.ready(2, "route 24 shards / 8 per cluster 0=0@6 1=1@6 2=2@6", "quiesce 0@5", "quiesce 1@5", "quiesce 2@5", "quiesce 3@5")
		h.exitOld(0)
		h.do(func() { h.d.Abort("bye") }, "stop 1@5", "stop 2@5", "stop 3@5")
		h.exitOld(1)
		h.exitOld(2)
		h.exitOld(3, "activate 0@6", "activate 1@6", "activate 2@6", "release 0", "release 1", "release 2")
		h.end(StateAborted, "aborted: bye", actv, actv, actv, oldx)
	})
}

func TestNewDeployValidates(t *testing.T) {
	t8 := topo(8, 2)
	good := func() Plan { return plan(t8, t8, newFake(t8), 1) }
	tests := []struct {
		name string
		edit func(*Plan)
		want string
	}{
		{"bad from", func(p *Plan) { p.From = topo(0, 1) }, "current topology"},
		{"bad to", func(p *Plan) { p.To = topo(8, 0) }, "new topology"},
		{"no table", func(p *Plan) { p.Current = nil }, "routing table"},
		{"table of another topology", func(p *Plan) { p.Current = NewRoutes(topo(8, 4)) }, "routing table"},
		{"generation not newer", func(p *Plan) { p.Gen = oldGen }, "already runs generation 5"},
		{"no ready timeout", func(p *Plan) { p.ReadyTimeout = 0 }, "must be positive"},
		{"no quiesce timeout", func(p *Plan) { p.QuiesceTimeout = -1 }, "must be positive"},
		{"max parallel 0", func(p *Plan) { p.MaxParallel = 0 }, "max_parallel"},
		{"cluster out of range", func(p *Plan) { p.Clusters = []int{1, 4} }, "cluster 4 is not"},
		{"negative cluster", func(p *Plan) { p.Clusters = []int{-1} }, "cluster -1 is not"},
		{"duplicate cluster", func(p *Plan) { p.Clusters = []int{2, 1, 2} }, "listed twice"},
		{"clusters while re-clustering", func(p *Plan) { p.To = topo(8, 4); p.Clusters = []int{1} }, "moves every cluster"},
		{"resume while re-clustering", func(p *Plan) { p.To, p.Resume = topo(8, 4), true }, "cannot be resumed"},
		{"recycle of no cluster", func(p *Plan) { p.Gen, p.Recycle = oldGen, true }, "names its clusters"},
		{"recycle to another generation", func(p *Plan) { p.Recycle, p.Clusters = true, []int{1} }, "keeps the generation"},
		{"recycle re-clustering", func(p *Plan) { p.Gen, p.Recycle, p.To, p.Clusters = oldGen, true, topo(8, 4), []int{1} }, "keeps the topology"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := good()
			tt.edit(&p)
			_, err := NewDeploy(p, time.Now, newFake(t8))
			if !errors.Is(err, ErrInvalidPlan) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want %q", err, tt.want)
			}
		})
	}
	if _, err := NewDeploy(good(), nil, newFake(t8)); !errors.Is(err, ErrInvalidPlan) {
		t.Errorf("no clock: %v", err)
	}
	p := good()
	p.To, p.MaxParallel = topo(8, 4), 0 // re-clustering ignores max_parallel
	if _, err := NewDeploy(p, time.Now, newFake(t8)); err != nil {
		t.Errorf("re-clustering plan: %v", err)
	}
}

func TestPhaseOf(t *testing.T) {
	at := t0
	tests := []struct {
		c    ClusterStatus
		want Phase
	}{
		{ClusterStatus{}, pend},
		{ClusterStatus{SpawnedAt: at}, spwn},
		{ClusterStatus{SpawnedAt: at, ExitedAt: at}, spwn}, // old died before the switch
		{ClusterStatus{SpawnedAt: at, ReadyAt: at}, rdy},
		{ClusterStatus{SpawnedAt: at, ReadyAt: at, RoutedAt: at}, rtd},
		{ClusterStatus{RoutedAt: at, QuiesceSentAt: at}, qing},
		{ClusterStatus{RoutedAt: at, QuiesceSentAt: at, QuiescedAt: at}, qd},
		{ClusterStatus{RoutedAt: at, QuiesceSentAt: at, QuiescedAt: at, ExitedAt: at}, oldx},
		{ClusterStatus{RoutedAt: at, ExitedAt: at, ActivatedAt: at}, actv},
		{ClusterStatus{RoutedAt: at, ActivatedAt: at, end: PhaseFailed}, fail},
		{ClusterStatus{end: PhaseSkipped}, skip},
	}
	for _, tt := range tests {
		if got := phaseOf(&tt.c); got != tt.want {
			t.Errorf("phaseOf(%+v) = %s, want %s", tt.c, got, tt.want)
		}
	}
}

func TestStatusJSON(t *testing.T) {
	f := newFake(t4x2)
	h := start(t, f, plan(t4x2, t4x2, f, 1, 0), "spawn 0@6")
	h.ready(0, "route 0=0@6", "quiesce 0@5")
	b, err := json.Marshal(h.d.Status())
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"id":"d1","generation":6,"from":{"total_shards":4,"shards_per_cluster":2},` +
		`"to":{"total_shards":4,"shards_per_cluster":2},"state":"running","started":"2025-01-02T03:04:05Z",` +
		`"clusters":[{"cluster":0,"phase":"quiescing","new":{"cluster":0,"generation":6,"seq":101},` +
		`"old":{"cluster":0,"generation":5,"seq":1},"spawned_at":"2025-01-02T03:04:05Z","ready_at":"2025-01-02T03:04:05Z",` +
		`"routed_at":"2025-01-02T03:04:05Z","quiesce_sent_at":"2025-01-02T03:04:05Z"}]}`
	if string(b) != want {
		t.Errorf("status JSON\n got  %s\n want %s", b, want)
	}
}
