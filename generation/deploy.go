package generation

import (
	"errors"
	"fmt"
	"time"
)

// Actuator carries out a deploy's decisions. The manager implements it; tests
// record the calls. Its methods must not block and must not call back into the
// Deploy: outcomes come back later as events (Ready, Quiesced, Exited).
type Actuator interface {
	// Spawn starts a process for cluster of topo at generation gen and returns
	// its name, which must be unique, with that cluster and generation.
	Spawn(cluster int, gen int64, topo Topology) (ProcRef, error)
	// Route applies update to the routing table in force and publishes the
	// result, in call order. Updates touch only clusters the deploy owns, so
	// routing changes the supervisor makes meanwhile to other clusters survive.
	Route(update func(*Routes) *Routes)
	// Quiesce sends QUIESCE to p.
	Quiesce(p ProcRef)
	// Stop has p killed (SIGTERM, grace, SIGKILL); the confirmed exit comes back as Exited.
	Stop(p ProcRef)
	// Activate sends ACTIVATE to p.
	Activate(p ProcRef)
	// Release hands cluster c of the topology now routed back to supervision,
	// which respawns it, at the generation of the processes last spawned for it,
	// if it has no process.
	Release(cluster int)
}

// Plan is what a deploy is asked to do.
type Plan struct {
	ID   string
	Gen  int64    // the new generation number
	From Topology // the topology in force
	To   Topology // the new topology; To != From means re-clustering
	// Current is the routing table at the start, for From. A cluster may have
	// no routed process. The deploy owns every cluster it moves from Start
	// until it Releases it: the supervisor must leave those alone meanwhile.
	Current *Routes
	// Clusters lists the clusters to roll, in order; empty means all. It must
	// be empty for re-clustering, which always moves every cluster.
	Clusters []int
	// MaxParallel bounds the clusters rolling at once (at least 1). A
	// re-clustering deploy starts every new cluster at once.
	MaxParallel    int
	ReadyTimeout   time.Duration // from spawn to ready
	QuiesceTimeout time.Duration // from QUIESCE to the old process's exit, before it is killed
	// Recycle replaces the listed clusters' processes by fresh ones of the
	// generation they run, Gen, by the same four steps: the manager's
	// memory and lag recycling (package recycle). The topology must not
	// change and Clusters must name the clusters.
	Recycle bool
	// Resume is the resume-handoff mode, for rolling deploys: each cluster's
	// old process is quiesced and unrouted first, and its new process is
	// spawned only once the old one is confirmed gone, so that it can RESUME
	// the old one's sessions instead of identifying. Requests wait for the
	// cluster in between: the gap, bounded by QuiesceTimeout (then the old
	// one is killed) plus ReadyTimeout.
	Resume bool
}

// ErrInvalidPlan is wrapped by NewDeploy's errors.
var ErrInvalidPlan = errors.New("invalid deploy plan")

func (p *Plan) reclustering() bool { return p.To != p.From }

func (p *Plan) validate() error {
	if err := p.From.Validate(); err != nil {
		return fmt.Errorf("current topology: %w", err)
	}
	if err := p.To.Validate(); err != nil {
		return fmt.Errorf("new topology: %w", err)
	}
	if p.Current == nil || p.Current.Topology != p.From {
		return fmt.Errorf("the current routing table is not for %v", p.From)
	}
	if p.Recycle {
		if p.reclustering() || len(p.Clusters) == 0 {
			return fmt.Errorf("a recycle keeps the topology and names its clusters")
		}
		for _, c := range p.Clusters {
			if old, ok := p.Current.Routed(c); ok && old.Generation != p.Gen {
				return fmt.Errorf("cluster %d runs generation %d, not %d: a recycle keeps the generation", c, old.Generation, p.Gen)
			}
		}
	}
	for c := range p.From.Clusters() {
		if old, ok := p.Current.Routed(c); ok && old.Generation >= p.Gen && !p.Recycle {
			return fmt.Errorf("cluster %d already runs generation %d, not older than %d", c, old.Generation, p.Gen)
		}
	}
	if p.ReadyTimeout <= 0 || p.QuiesceTimeout <= 0 {
		return fmt.Errorf("ready timeout %v and quiesce timeout %v must be positive", p.ReadyTimeout, p.QuiesceTimeout)
	}
	if p.Resume && p.reclustering() {
		return fmt.Errorf("re-clustering from %v to %v changes every shard range: its sessions cannot be resumed by other clusters", p.From, p.To)
	}
	if p.reclustering() {
		if len(p.Clusters) > 0 {
			return fmt.Errorf("re-clustering from %v to %v moves every cluster; clusters cannot be chosen", p.From, p.To)
		}
		return nil
	}
	if p.MaxParallel < 1 {
		return fmt.Errorf("max_parallel must be at least 1, got %d", p.MaxParallel)
	}
	seen := make(map[int]bool, len(p.Clusters))
	for _, c := range p.Clusters {
		if c < 0 || c >= p.From.Clusters() {
			return fmt.Errorf("cluster %d is not a cluster of %v", c, p.From)
		}
		if seen[c] {
			return fmt.Errorf("cluster %d is listed twice", c)
		}
		seen[c] = true
	}
	return nil
}

// Deploy moves clusters to a new generation by DESIGN.md's four steps:
// (1) spawn the new process, (2) once it is ready, route to it, (3) QUIESCE
// the old one and confirm its exit, (4) ACTIVATE the new one. It does no I/O:
// the manager feeds it events from its single event loop and an Actuator
// carries out its decisions. It is not safe for concurrent use.
//
// Rolling moves each cluster on its own. Re-clustering moves all of them as
// one unit, since old and new ranges differ: every new process must be ready
// before the whole table switches, and every old one gone before any new one
// is ACTIVE.
type Deploy struct {
	plan       Plan
	now        func() time.Time
	act        Actuator
	state      State
	reason     string
	done       bool
	startedAt  time.Time
	finishedAt time.Time
	units      []*unit // in start order
	slots      []*slot // in status order
	procs      map[ProcRef]*proc
}

// unit is a set of clusters that switch together: one cluster when rolling,
// all of them when re-clustering.
type unit struct {
	state unitState
	slots []*slot
}

type unitState int

const (
	unitPending     unitState = iota // not started
	unitHandingOver                  // resume mode: the old process quiescing, no new one yet
	unitSpawned                      // step 1: new processes starting
	unitSwitched                     // steps 2-3: routed to the new processes, old ones leaving
	unitRollingBack                  // failed before the switch: new processes being stopped
	unitSettled                      // released to supervision
)

// slot is one cluster of a unit: its old process, its new one, its record.
type slot struct {
	st       ClusterStatus
	unit     *unit
	old, new *proc
}

type proc struct {
	ref                    ProcRef
	slot                   *slot
	ready, stopped, exited bool
}

// NewDeploy checks p and returns a deploy ready to Start. now is its clock;
// act carries out its decisions.
func NewDeploy(p Plan, now func() time.Time, act Actuator) (*Deploy, error) {
	if err := p.validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidPlan, err)
	}
	if now == nil || act == nil {
		return nil, fmt.Errorf("%w: no clock or no actuator", ErrInvalidPlan)
	}
	d := &Deploy{plan: p, now: now, act: act, state: StatePending, procs: make(map[ProcRef]*proc)}
	if p.reclustering() {
		u := &unit{}
		for c := range max(p.From.Clusters(), p.To.Clusters()) {
			d.addSlot(u, c)
		}
		d.units = []*unit{u}
		return d, nil
	}
	clusters := p.Clusters
	if len(clusters) == 0 {
		for c := range p.From.Clusters() {
			clusters = append(clusters, c)
		}
	}
	for _, c := range clusters {
		u := &unit{}
		d.addSlot(u, c)
		d.units = append(d.units, u)
	}
	return d, nil
}

func (d *Deploy) addSlot(u *unit, c int) {
	s := &slot{unit: u, st: ClusterStatus{Cluster: c, resume: d.plan.Resume}}
	old, ok := d.plan.Current.Routed(c)
	if ok {
		s.old = d.track(old, s)
	} else if c >= d.plan.To.Clusters() {
		return // a cluster the new topology drops, with no process: nothing to do
	}
	u.slots = append(u.slots, s)
	d.slots = append(d.slots, s)
}

func (d *Deploy) track(ref ProcRef, s *slot) *proc {
	p := &proc{ref: ref, slot: s}
	d.procs[ref] = p
	return p
}

// Start takes ownership of the plan's clusters and starts the first ones.
// Events before Start are ignored.
func (d *Deploy) Start() {
	if d.state != StatePending {
		return
	}
	d.state, d.startedAt = StateRunning, d.now()
	d.step(func(now time.Time) { d.startUnits(now) })
}

// Ready reports that p heartbeated ready:true.
func (d *Deploy) Ready(p ProcRef) { d.step(func(now time.Time) { d.ready(p, now) }) }

// Quiesced reports that p sent QUIESCED.
func (d *Deploy) Quiesced(p ProcRef) { d.step(func(now time.Time) { d.quiesced(p, now) }) }

// Exited reports that the kernel confirmed p's exit. The manager feeds it
// every exit first, then the cluster's supervision (supervise.Cluster),
// which leaves a cluster the deploy Owns alone.
func (d *Deploy) Exited(p ProcRef) { d.step(func(now time.Time) { d.exited(p, now) }) }

// Tick checks the deadlines against the clock. Every event checks them too,
// so a late event never beats its own timeout; Tick covers quiet periods (see
// NextDeadline).
func (d *Deploy) Tick() { d.step(func(time.Time) {}) }

// Abort stops the deploy because the manager is shutting down, leaving every
// cluster with exactly one process: clusters not yet switched keep their old
// process and their new one is killed; switched clusters keep the new one and
// their old one is killed now instead of waited for. The deploy is Done once
// those exits are confirmed (and the new processes ACTIVATEd).
func (d *Deploy) Abort(reason string) {
	if d.state == StatePending { // never started: it owns nothing
		d.state, d.reason, d.done = StateAborted, "aborted: "+reason, true
		for _, s := range d.slots {
			s.st.end = PhaseSkipped
		}
		return
	}
	d.step(func(now time.Time) {
		d.halt(StateAborted, "aborted: "+reason, now)
		for _, u := range d.units {
			if u.state == unitSwitched {
				for _, s := range u.slots {
					d.kill(s, s.old, now)
				}
			}
		}
	})
}

// step runs one event: deadlines first, then the event, then the end check.
// Events for unknown processes, repeated events, and events outside
// Start..Done have no effect.
func (d *Deploy) step(event func(now time.Time)) {
	if d.state == StatePending || d.done {
		return
	}
	now := d.now()
	d.expire(now)
	event(now)
	for _, u := range d.units {
		if u.state != unitSettled {
			return
		}
	}
	d.done, d.finishedAt = true, now
	if d.state == StateRunning {
		d.state = StateSucceeded
	}
}

// startUnits starts pending clusters while the deploy runs and MaxParallel allows.
func (d *Deploy) startUnits(now time.Time) {
	for _, u := range d.units {
		if d.state != StateRunning || d.inFlight() >= d.maxParallel() {
			return
		}
		if u.state == unitPending {
			d.spawn(u, now)
		}
	}
}

func (d *Deploy) inFlight() int {
	n := 0
	for _, u := range d.units {
		if u.state != unitPending && u.state != unitSettled {
			n++
		}
	}
	return n
}

func (d *Deploy) maxParallel() int {
	if d.plan.reclustering() {
		return 1 // one unit holds every cluster
	}
	return d.plan.MaxParallel
}

// spawn is step 1: start a new process for every cluster of u in the new
// topology (a re-clustering to fewer clusters leaves some slots old-only).
// In resume mode, a cluster with a live old process first hands over: the old
// one is unrouted and quiesced, and the spawn waits for its exit.
func (d *Deploy) spawn(u *unit, now time.Time) {
	if d.plan.Resume && u.state == unitPending {
		if s := u.slots[0]; s.old != nil && !s.old.exited {
			u.state = unitHandingOver
			ref := s.old.ref
			d.act.Route(func(r *Routes) *Routes { return r.Without(ref) })
			d.act.Quiesce(ref)
			s.st.QuiesceSentAt = now
			return
		}
	}
	u.state = unitSpawned
	for _, s := range u.slots {
		if s.st.Cluster >= d.plan.To.Clusters() {
			continue
		}
		ref, err := d.act.Spawn(s.st.Cluster, d.plan.Gen, d.plan.To)
		if err != nil {
			d.failCluster(s, now, fmt.Sprintf("cluster %d: spawn generation %d: %v", s.st.Cluster, d.plan.Gen, err))
			return
		}
		s.new, s.st.SpawnedAt = d.track(ref, s), now
	}
}

// ready moves step 1 to step 2 once every new process of the unit is ready.
func (d *Deploy) ready(ref ProcRef, now time.Time) {
	p := d.known(ref)
	if p == nil || p != p.slot.new || p.ready || p.slot.unit.state != unitSpawned {
		return // a process being rolled back is never routed
	}
	p.ready, p.slot.st.ReadyAt = true, now
	for _, s := range p.slot.unit.slots {
		if s.new != nil && !s.new.ready {
			return
		}
	}
	d.switchRoutes(p.slot.unit, now)
}

// switchRoutes is steps 2 and 3: route the unit's clusters to their new
// processes in one table change, then QUIESCE the old processes.
func (d *Deploy) switchRoutes(u *unit, now time.Time) {
	u.state = unitSwitched
	var news []ProcRef
	for _, s := range u.slots {
		if s.new != nil {
			news = append(news, s.new.ref)
		}
		s.st.RoutedAt = now
	}
	recluster, to := d.plan.reclustering(), d.plan.To
	d.act.Route(func(r *Routes) *Routes {
		if recluster {
			r = NewRoutes(to) // every range changes at once
		}
		return r.WithAll(news)
	})
	for _, s := range u.slots {
		if s.old != nil && !s.old.exited {
			d.act.Quiesce(s.old.ref)
			s.st.QuiesceSentAt = now
		}
	}
	d.advance(u, now) // no old process left: ACTIVATE now
}

// quiesced records step 3's QUIESCED; the exit is what step 3 waits for.
func (d *Deploy) quiesced(ref ProcRef, now time.Time) {
	p := d.known(ref)
	if p == nil || p != p.slot.old || p.slot.st.QuiesceSentAt.IsZero() || !p.slot.st.QuiescedAt.IsZero() {
		return
	}
	// In resume mode the new process's spawn waits for the exit, not this.
	p.slot.st.QuiescedAt = now
}

// exited handles a confirmed exit, expected or not, of an old or a new process.
func (d *Deploy) exited(ref ProcRef, now time.Time) {
	p := d.known(ref)
	if p == nil {
		return
	}
	p.exited = true
	s, u := p.slot, p.slot.unit
	if p == s.old {
		s.st.ExitedAt = now
		switch u.state {
		case unitHandingOver:
			// Resume mode: the sessions are free; the new process may resume them.
			if d.state == StateRunning {
				d.spawn(u, now)
			} else {
				d.release(u, d.plan.From) // halted meanwhile: supervision respawns it
			}
		case unitPending:
			// Nothing serves the cluster and its turn has not come: start it now,
			// past MaxParallel, rather than leave it dead behind the queue.
			d.act.Route(func(r *Routes) *Routes { return r.Without(ref) })
			d.spawn(u, now)
		case unitSpawned, unitRollingBack:
			// Before the switch: unroute the dead process so requests wait for
			// the new one (or, after a rollback, for the supervisor's respawn).
			d.act.Route(func(r *Routes) *Routes { return r.Without(ref) })
		}
		// unitSwitched: this is the confirmed exit step 3 waits for, crash or not.
		d.advance(u, now)
		return
	}
	switch u.state {
	case unitSpawned:
		what := "exited before it was ready"
		if p.ready {
			what = "exited before the switch"
		}
		d.failCluster(s, now, fmt.Sprintf("cluster %d: generation %d %s", s.st.Cluster, d.plan.Gen, what))
	case unitSwitched:
		// Routed but never ACTIVE: unroute it, so requests wait instead of
		// reaching a dead process. The old one was already told to QUIESCE and
		// cannot take work back; once it is confirmed gone the cluster is
		// released and the supervisor respawns it at the new generation, so two
		// processes never handle the cluster's events at once.
		d.act.Route(func(r *Routes) *Routes { return r.Without(ref) })
		d.failCluster(s, now, fmt.Sprintf("cluster %d: generation %d exited after the switch, before ACTIVATE", s.st.Cluster, d.plan.Gen))
	}
	// unitRollingBack: the stop we ordered took effect.
	d.advance(u, now)
}

// advance is step 4: once a unit has nothing left in flight, ACTIVATE its
// new processes if it switched, and release its clusters.
func (d *Deploy) advance(u *unit, now time.Time) {
	switch u.state {
	case unitSwitched:
		for _, s := range u.slots {
			if s.old != nil && !s.old.exited {
				return // step 3 still waiting
			}
		}
		for _, s := range u.slots {
			if s.new != nil && !s.new.exited {
				d.act.Activate(s.new.ref)
				s.st.ActivatedAt = now
			}
		}
		d.release(u, d.plan.To)
	case unitRollingBack:
		for _, s := range u.slots {
			if s.new != nil && !s.new.exited {
				return // a stopped process not confirmed gone yet
			}
		}
		d.release(u, d.plan.From)
	default:
		return
	}
	d.startUnits(now)
}

// release hands the unit's clusters of topology t (the one it left routed)
// back to supervision.
func (d *Deploy) release(u *unit, t Topology) {
	u.state = unitSettled
	for _, s := range u.slots {
		if s.st.Cluster < t.Clusters() {
			d.act.Release(s.st.Cluster)
		}
	}
}

// expire enforces the deadlines: ReadyTimeout fails a cluster in step 1,
// QuiesceTimeout has its old process killed in step 3.
func (d *Deploy) expire(now time.Time) {
	for _, u := range d.units {
		for _, s := range u.slots {
			t, ok := d.deadline(s)
			switch {
			case !ok || now.Before(t):
			case u.state == unitSpawned && s.new != nil && !s.new.ready:
				d.failCluster(s, now, fmt.Sprintf("cluster %d: generation %d not ready within %v", s.st.Cluster, d.plan.Gen, d.plan.ReadyTimeout))
			default:
				d.kill(s, s.old, now)
			}
		}
	}
}

// deadline returns when s next needs the clock's attention, if ever.
func (d *Deploy) deadline(s *slot) (time.Time, bool) {
	switch u := s.unit; {
	case u.state == unitSpawned && s.new != nil && !s.new.ready:
		return s.st.SpawnedAt.Add(d.plan.ReadyTimeout), true
	case (u.state == unitSwitched || u.state == unitHandingOver) && s.old != nil && !s.old.exited && !s.old.stopped:
		return s.st.QuiesceSentAt.Add(d.plan.QuiesceTimeout), true
	}
	return time.Time{}, false
}

// failCluster records why s did not move and stops the deploy.
func (d *Deploy) failCluster(s *slot, now time.Time, reason string) {
	s.st.end, s.st.Reason = PhaseFailed, reason
	d.halt(StateFailed, reason, now) // first, so that no rollback below starts another cluster
	if s.unit.state == unitSpawned { // halted already (an abort): roll back this one still
		d.rollBack(s.unit, now, reason)
	}
}

// halt stops the deploy from moving clusters: pending ones are skipped,
// ones not yet switched are rolled back, switched ones finish their steps
// (the clusters already moved stay on the new generation).
func (d *Deploy) halt(state State, reason string, now time.Time) {
	if d.state != StateRunning {
		return
	}
	d.state, d.reason = state, reason
	for _, u := range d.units {
		switch u.state {
		case unitHandingOver:
			// Resume mode, the old process leaving and no new one yet: an
			// abort kills it now; a failure elsewhere lets it finish
			// quiescing. Either way its exit releases the cluster, which
			// supervision respawns (resuming its sessions).
			for _, s := range u.slots {
				s.st.end, s.st.Reason = PhaseFailed, "stopped while handing over: "+reason
				if state == StateAborted {
					d.kill(s, s.old, now)
				}
			}
		case unitPending:
			for _, s := range u.slots {
				s.st.end = PhaseSkipped
			}
			d.release(u, d.plan.From)
		case unitSpawned:
			d.rollBack(u, now, reason)
		}
	}
}

// rollBack gives up on a unit before its switch: its new processes are
// stopped; its old ones, never unrouted, keep serving.
func (d *Deploy) rollBack(u *unit, now time.Time, why string) {
	u.state = unitRollingBack
	for _, s := range u.slots {
		if s.st.end == "" {
			s.st.end, s.st.Reason = PhaseFailed, "rolled back: "+why
		}
		d.kill(s, s.new, now)
	}
	d.advance(u, now) // nothing to wait for if no new process is alive
}

// kill has p stopped once, if it is still alive.
func (d *Deploy) kill(s *slot, p *proc, now time.Time) {
	if p == nil || p.stopped || p.exited {
		return
	}
	p.stopped, s.st.StopSentAt = true, now
	d.act.Stop(p.ref)
}

// known returns the process an event is about, or nil if the deploy does not
// track it (any more): unknown, already exited, or its cluster released.
func (d *Deploy) known(ref ProcRef) *proc {
	p := d.procs[ref]
	if p == nil || p.exited || p.slot.unit.state == unitSettled {
		return nil
	}
	return p
}

// NextDeadline returns when Tick next has work to do, if ever.
func (d *Deploy) NextDeadline() (time.Time, bool) {
	var next time.Time
	found := false
	if d.state == StatePending || d.done {
		return next, false
	}
	for _, s := range d.slots {
		if t, ok := d.deadline(s); ok && (!found || t.Before(next)) {
			next, found = t, true
		}
	}
	return next, found
}

// Owns reports whether cluster c (of the topology now routed) is the
// deploy's: from Start until its Release, supervision must leave it alone.
// An event can release clusters, so the manager hands a process's exit to
// supervision when, after Exited returns, the deploy does not own its cluster.
func (d *Deploy) Owns(c int) bool {
	if d.state == StatePending || d.done {
		return false
	}
	for _, u := range d.units {
		if u.state != unitSettled && (d.plan.reclustering() || u.slots[0].st.Cluster == c) {
			return true
		}
	}
	return false
}

// Resume reports whether this is a resume-handoff deploy (Plan.Resume).
func (d *Deploy) Resume() bool { return d.plan.Resume }

// Done reports whether the deploy has finished: every cluster released and
// every process it stopped confirmed gone.
func (d *Deploy) Done() bool { return d.done }

// Status returns a snapshot of the deploy's progress.
func (d *Deploy) Status() Status {
	st := Status{
		ID: d.plan.ID, Generation: d.plan.Gen, From: d.plan.From, To: d.plan.To,
		State: d.state, Reason: d.reason, Started: d.startedAt, Finished: d.finishedAt,
		Clusters: make([]ClusterStatus, 0, len(d.slots)),
	}
	if d.plan.Resume {
		st.Mode = "resume"
	}
	for _, s := range d.slots {
		c := s.st
		c.Phase = phaseOf(&s.st)
		if s.new != nil {
			ref := s.new.ref
			c.New = &ref
		}
		if s.old != nil {
			ref := s.old.ref
			c.Old = &ref
		}
		st.Clusters = append(st.Clusters, c)
	}
	return st
}
