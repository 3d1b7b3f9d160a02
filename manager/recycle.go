package manager

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/discord"
	"github.com/sm-supervisor/sm/generation"
	"github.com/sm-supervisor/sm/recycle"
	"github.com/sm-supervisor/sm/supervise"
)

// Recycling (docs/deploys.md#recycling): every recycle.interval the loop
// hands the routed processes to a sampler goroutine, which reads their RSS
// from /proc and the heap and lag their last heartbeat reported; the samples
// come back as evRecycleSamples, the recycle.Policy judges them, and a
// cluster it sends off is replaced by a one-cluster deploy at the generation
// it runs (generation.Plan.Recycle): the deploy's four steps, its handoff,
// its zero gap.
//
// All of it is loop-owned.
type recycling struct {
	on      bool
	resume  bool // recycle.mode = "resume"
	policy  *recycle.Policy
	every   time.Duration
	nextAt  time.Time // when the next sampling is due
	out     bool      // a sampler goroutine is out
	runs    map[int]*recycleRun
	status  map[*slot]*RecycleStatus
	heldLog map[int]string // the hold last logged per cluster: logged once per change
	seq     int            // recycles started, for their ids
}

// recycleRun is one recycle in flight.
type recycleRun struct {
	d      *generation.Deploy
	slot   *slot
	st     *RecycleStatus
	oldPID int
}

// RecycleStatus is what STATUS, the feed and the page show of a cluster's
// recycling: the recycle running or the last one, and why a due one waits.
type RecycleStatus struct {
	// Recycling: a fresh process is replacing the cluster's now.
	Recycling bool `json:"recycling"`
	// Reason is the limit the running or last recycle was for: rss, heap or lag.
	Reason string `json:"reason,omitempty"`
	// Detail is what was measured: "rss 301 MiB over 256 MiB for 1m0s".
	Detail string `json:"detail,omitempty"`
	// State is the running or last recycle's: running, succeeded, failed or aborted.
	State    string    `json:"state,omitempty"`
	Started  time.Time `json:"started,omitzero"`
	Finished time.Time `json:"finished,omitzero"`
	// OldPID and NewPID are the replaced process and its replacement.
	OldPID int `json:"old_pid,omitempty"`
	NewPID int `json:"new_pid,omitempty"`
	// Held says why a cluster over a limit is not being recycled: a deploy
	// runs, recycle.max_parallel, the cooldown, or the session-start budget.
	Held string `json:"held,omitempty"`
	// HeldDetail is the measurement behind a Held recycle.
	HeldDetail string `json:"held_detail,omitempty"`
}

// newRecycling is the [recycle] table's machinery, off unless enabled.
func newRecycling(c config.Recycle) recycling {
	r := recycling{
		on: c.Enabled, resume: c.Mode == "resume", every: c.Interval.Duration,
		runs: map[int]*recycleRun{}, status: map[*slot]*RecycleStatus{}, heldLog: map[int]string{},
	}
	r.policy = recycle.New(recycle.Limits{
		MaxRSS: c.MaxRSS, MaxHeap: c.MaxHeap, MaxLag: c.MaxLag.Duration,
		Sustain: c.Sustain.Duration, MaxParallel: c.MaxParallel, Cooldown: c.Cooldown.Duration,
	})
	return r
}

// recycleTarget is one process for the sampler: what to read and for whom.
type recycleTarget struct {
	cluster int
	seq     uint64
	pid     int
	beat    json.RawMessage // its last heartbeat payload (immutable once stored)
}

// recycleTick starts a sampling round when one is due and none is out.
func (m *Manager) recycleTick(now time.Time) {
	r := &m.rec
	if !r.on || r.out || now.Before(r.nextAt) {
		return
	}
	r.nextAt = now.Add(r.every)
	table := m.table()
	var targets []recycleTarget
	for c, p := range table.procs {
		if p != nil && p.pid() > 0 {
			targets = append(targets, recycleTarget{cluster: c, seq: p.seq, pid: p.pid(), beat: p.beat})
		}
	}
	r.out = true
	m.stopWG.Add(1)
	go func() {
		defer m.stopWG.Done()
		m.post(evRecycleSamples{samples: sampleProcesses(targets, time.Now())})
	}()
}

// recycleSampled takes a sampling round's readings and acts on the verdicts.
func (m *Manager) recycleSampled(samples []recycle.Sample) {
	r := &m.rec
	r.out = false
	if m.stopping.Load() {
		return // shutting down: nothing new starts
	}
	table := m.table()
	for _, s := range samples {
		// Only the process still routed there: a sample may be a re-clustering old.
		if s.Cluster < len(table.procs) && table.procs[s.Cluster] != nil && table.procs[s.Cluster].seq == s.Proc {
			r.policy.Observe(s)
		}
	}
	now := time.Now()
	gate := recycle.Gate{
		Deploying: m.dep != nil && !m.dep.Done(),
		Serving:   m.recycleServing,
		Budget:    m.recycleBudget,
	}
	if r.resume {
		gate.Budget = nil // resuming spends no session start
	}
	verdicts := r.policy.Decide(now, gate)
	held := map[int]bool{}
	for _, v := range verdicts {
		if v.Start {
			m.startRecycle(v, now)
			continue
		}
		held[v.Cluster] = true
		m.recycleHeld(table.slots[v.Cluster], v)
	}
	for c, s := range table.slots {
		if st := r.status[s]; !held[c] && st != nil && st.Held != "" {
			st.Held, st.HeldDetail = "", ""
			delete(r.heldLog, c)
			m.touch(s)
		}
	}
}

// recycleServing reports whether cluster c has a process a recycle can hand
// off from: ready, ACTIVE, routed, and no deploy's.
func (m *Manager) recycleServing(c int) bool {
	t := m.table()
	if c >= len(t.slots) {
		return false
	}
	p, s := t.procs[c], t.slots[c]
	if p == nil || s.sup.Owned() {
		return false
	}
	v := p.view()
	return v.State == supervise.StateReady && v.Activated
}

// recycleBudget is the session-start budget's consent: the new process
// identifies every shard of the cluster, and a recycle is no reason to go
// below discord.budget_floor, which is kept for deploys and first starts.
func (m *Manager) recycleBudget(c int) (bool, string) {
	s := m.table().slots[c]
	shards := s.last - s.first + 1
	n, known := m.disc.budget.Grantable(discord.ReasonRestart, time.Now())
	if known && n < shards {
		return false, fmt.Sprintf("%d session starts left above discord.budget_floor (%d), the new process's %d shards need %d", n, m.disc.budget.Floor, shards, shards)
	}
	return true, ""
}

// recycleHeld records and logs (once per change) why a due recycle waits.
func (m *Manager) recycleHeld(s *slot, v recycle.Verdict) {
	r := &m.rec
	st := r.status[s]
	if st == nil {
		st = &RecycleStatus{}
		r.status[s] = st
	}
	if st.Held != v.Held {
		m.touch(s)
	}
	st.Held, st.HeldDetail = v.Held, v.Detail
	if r.heldLog[v.Cluster] != v.Held {
		r.heldLog[v.Cluster] = v.Held
		m.log.Info("recycle held", "cluster", v.Cluster, "reason", string(v.Reason), "detail", v.Detail, "held", v.Held)
	}
}

// startRecycle replaces cluster v.Cluster's process by a fresh one of its
// generation, through a one-cluster deploy.
func (m *Manager) startRecycle(v recycle.Verdict, now time.Time) {
	r := &m.rec
	table := m.table()
	s, p := table.slots[v.Cluster], table.procs[v.Cluster]
	r.seq++
	plan := generation.Plan{
		ID:  "recycle-" + strconv.Itoa(r.seq),
		Gen: p.gen, From: table.topo, To: table.topo, Current: m.genRoutes(table),
		Clusters: []int{v.Cluster}, MaxParallel: 1, Recycle: true,
		ReadyTimeout:   m.cfg.Deploy.ReadyTimeout.Duration,
		QuiesceTimeout: m.cfg.Deploy.QuiesceTimeout.Duration,
		Resume:         r.resume,
	}
	d, err := generation.NewDeploy(plan, time.Now, actuator{m: m, resume: r.resume})
	if err != nil {
		m.log.Error("recycle not started", "cluster", v.Cluster, "err", err)
		return
	}
	st := &RecycleStatus{Recycling: true, Reason: string(v.Reason), Detail: v.Detail, State: "running", Started: now, OldPID: p.pid()}
	r.status[s] = st
	r.runs[v.Cluster] = &recycleRun{d: d, slot: s, st: st, oldPID: p.pid()}
	delete(r.heldLog, v.Cluster)
	r.policy.Started(v.Cluster)
	m.metrics.recycles.WithLabelValues(string(v.Reason)).Inc()
	m.log.Info("recycle started", "cluster", v.Cluster, "generation", p.gen, "pid", p.pid(), "reason", string(v.Reason), "detail", v.Detail, "recycle", plan.ID)
	s.sup.Take(now)
	d.Start()
	m.touch(s)
	m.publishRecycle(v.Cluster, p.gen, st)
}

// recycleProgress ends the recycles whose deploy is done: the cluster is
// released (the deploy did that), the policy's cooldown starts.
func (m *Manager) recycleProgress() {
	r := &m.rec
	for c, run := range r.runs {
		if run.st.NewPID == 0 {
			// Known from the spawn on: STATUS shows it while the recycle runs,
			// and after it even if the fresh process died.
			if ds := run.d.Status(); len(ds.Clusters) == 1 && ds.Clusters[0].New != nil {
				if np := m.procs[ds.Clusters[0].New.Seq]; np != nil {
					run.st.NewPID = np.pid()
				}
			}
		}
		if !run.d.Done() {
			continue
		}
		delete(r.runs, c)
		ds := run.d.Status()
		now := time.Now()
		st := run.st
		st.Recycling, st.State, st.Finished = false, string(ds.State), ds.Finished
		if ds.State != generation.StateSucceeded {
			st.Detail = st.Detail + "; " + ds.Reason
		}
		r.policy.Finished(c, now)
		for _, s := range m.table().slots {
			if s.sup.Owned() && !m.owned(s.id) {
				m.do(s, s.sup.Release(now))
			}
		}
		m.log.Info("recycle finished", "cluster", c, "state", ds.State, "reason", ds.Reason,
			"old_pid", st.OldPID, "new_pid", st.NewPID, "took", ds.Finished.Sub(ds.Started).Round(time.Millisecond))
		m.touch(run.slot)
		m.publishRecycle(c, ds.Generation, st)
	}
	for s := range r.status {
		if s.retiredNow() {
			delete(r.status, s) // re-clustered away
		}
	}
}

// publishRecycle puts a recycle's start or end on the feed.
func (m *Manager) publishRecycle(cluster int, gen int64, st *RecycleStatus) {
	b, _ := json.Marshal(struct {
		Type    string `json:"type"`
		Cluster int    `json:"cluster"`
		Gen     int64  `json:"generation"`
		*RecycleStatus
	}{EventRecycle, cluster, gen, st})
	m.feed.publish(b)
}

// recycleRunning names a recycle in flight, if any: a DEPLOY waits for it.
func (m *Manager) recycleRunning() (int, bool) {
	for c := range m.rec.runs {
		return c, true
	}
	return 0, false
}

// recycleStatus is cluster slot s's recycling, for its ClusterStatus.
func (m *Manager) recycleStatus(s *slot) *RecycleStatus {
	if st := m.rec.status[s]; st != nil {
		c := *st
		return &c
	}
	return nil
}

// owned reports whether the running deploy or a recycle owns cluster c.
func (m *Manager) owned(c int) bool {
	if m.dep != nil && m.dep.Owns(c) {
		return true
	}
	for _, run := range m.rec.runs {
		if run.d.Owns(c) {
			return true
		}
	}
	return false
}

// deploys calls f with the running deploy and every recycle's: each event
// a deploy must hear goes to all of them (each ignores processes not its own).
func (m *Manager) deploys(f func(d *generation.Deploy)) {
	if m.dep != nil {
		f(m.dep)
		m.depFed = true
	}
	for _, run := range m.rec.runs {
		f(run.d)
	}
}

// sampleProcesses reads, for each target, the RSS of its process group from
// /proc and the heap and lag of its last heartbeat. It runs off the loop.
func sampleProcesses(targets []recycleTarget, now time.Time) []recycle.Sample {
	leaders := make(map[int]bool, len(targets))
	for _, t := range targets {
		leaders[t.pid] = true
	}
	groups := groupRSS(leaders)
	out := make([]recycle.Sample, 0, len(targets))
	for _, t := range targets {
		s := recycle.Sample{Cluster: t.cluster, Proc: t.seq, At: now, RSS: recycle.Unknown, Heap: recycle.Unknown, Lag: recycle.Unknown}
		if rss, ok := processRSS(t.pid); ok {
			s.RSS = rss + groups[t.pid]
		}
		s.Heap, s.Lag = beatFigures(t.beat)
		out = append(out, s)
	}
	return out
}

// beatFigures reads the optional heap_bytes and loop_lag_ms of a heartbeat
// payload (docs/protocol.md#heartbeat); what is absent or not a number is
// Unknown.
func beatFigures(beat json.RawMessage) (heap int64, lag time.Duration) {
	heap, lag = recycle.Unknown, recycle.Unknown
	if len(beat) == 0 || beat[0] != '{' {
		return
	}
	var f struct {
		Heap *float64 `json:"heap_bytes"`
		Lag  *float64 `json:"loop_lag_ms"`
	}
	if json.Unmarshal(beat, &f) != nil {
		return
	}
	if f.Heap != nil && *f.Heap >= 0 {
		heap = int64(*f.Heap)
	}
	if f.Lag != nil && *f.Lag >= 0 {
		lag = time.Duration(*f.Lag * float64(time.Millisecond))
	}
	return
}

var pageSize = int64(os.Getpagesize())

// processRSS is the resident memory of pid, from /proc/<pid>/statm (the
// figure VmRSS shows).
func processRSS(pid int) (int64, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/statm")
	if err != nil {
		return 0, false
	}
	f := bytes.Fields(b)
	if len(f) < 2 {
		return 0, false
	}
	pages, err := strconv.ParseInt(string(f[1]), 10, 64)
	if err != nil {
		return 0, false
	}
	return pages * pageSize, true
}

// groupRSS is, for each process group led by one of leaders, the RSS of its
// members other than the leader: a cluster is spawned as the leader of its
// own group (supervise.ExecSpawner), so a bridge's child counts towards its
// cluster.
func groupRSS(leaders map[int]bool) map[int]int64 {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	out := map[int]int64{}
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		b, err := os.ReadFile(d + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := bytes.Fields(b[i+1:])
		if len(f) < 3 {
			continue
		}
		pgrp, err := strconv.Atoi(string(f[2]))
		if err != nil || pgrp == pid || !leaders[pgrp] {
			continue
		}
		if rss, ok := processRSS(pid); ok {
			out[pgrp] += rss
		}
	}
	return out
}
