package mesh

import (
	"container/heap"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// This file is a discrete-event model of the lease protocol: one JetStream
// key-value server (compare-and-set on the last revision, entries expired by
// the server's own clock at most 250 ms late, as nats-server's expiry timer
// does), hosts that run Decide on drifting clocks, messages delayed, some by
// seconds, links cut and healed, hosts killed and restarted with a new boot id,
// and the cluster processes the hosts start and fence. It checks that no
// cluster ever runs on two hosts at once, and that, once the network is
// quiet, every cluster runs somewhere.

type span struct{ from, to time.Duration }

type simHostParams struct {
	id        string
	capacity  int
	driftPPM  int           // the host's clock runs this many millionths fast (or slow)
	outages   []span        // its link is down during these
	crashAt   time.Duration // 0: never; the manager and its clusters die
	restartAt time.Duration // 0: never; it comes back with a new boot id
}

type simParams struct {
	timing   Timing        // what the hosts use
	lease    time.Duration // the server's max age
	clusters int
	hosts    []simHostParams
	seed     uint64
	slow     float64       // chance a message takes up to 2 s
	quiet    time.Duration // no outage, crash or slow message after this
	end      time.Duration
	killMax  time.Duration // a fenced process is gone within this
}

type simResult struct {
	overlaps []string
	running  map[int][]string // at the end, by cluster: the hosts running it
	takes    int
	fences   int
}

type simEntry struct {
	holder Holder
	rev    uint64
	stored time.Duration
	gone   bool
}

type simRecord struct {
	capacity int
	stored   time.Duration
}

type simReq struct {
	host   *simHost
	kind   Kind // Take or Renew; 0 is a host record
	c      int
	rev    uint64
	sent   time.Time // on the host's clock
	ok     bool
	newRev uint64
}

type simHost struct {
	p        simHostParams
	me       Holder
	held     map[int]Held
	view     View
	inflight map[int]*simReq
	started  map[int]time.Duration // running processes: since when (server time)
	dead     bool
}

type simEvent struct {
	at  time.Duration
	seq int
	fn  func()
}

type eventQueue []simEvent

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	return q[i].at < q[j].at || q[i].at == q[j].at && q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(simEvent)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

type sim struct {
	p       simParams
	rnd     *rand.Rand
	now     time.Duration
	q       eventQueue
	nseq    int
	seq     uint64
	leases  map[int]*simEntry
	records map[string]simRecord
	runs    map[int][]struct {
		host       string
		start, end time.Duration
	}
	res simResult
}

var simEpoch = time.Unix(1_000_000, 0)

func (s *sim) at(d time.Duration, fn func()) {
	s.nseq++
	heap.Push(&s.q, simEvent{at: d, seq: s.nseq, fn: fn})
}

// clock is host h's monotonic clock at server time d.
func (h *simHost) clock(d time.Duration) time.Time {
	return simEpoch.Add(d + time.Duration(float64(d)*float64(h.p.driftPPM)/1e6))
}

// after is the server time at which host h's clock has advanced by d.
func (h *simHost) after(d time.Duration) time.Duration {
	return time.Duration(float64(d) / (1 + float64(h.p.driftPPM)/1e6))
}

func (h *simHost) linkUp(d time.Duration) bool {
	for _, o := range h.p.outages {
		if d >= o.from && d < o.to {
			return false
		}
	}
	return true
}

func (s *sim) delay() time.Duration {
	if s.now < s.p.quiet && s.rnd.Float64() < s.p.slow {
		return time.Duration(s.rnd.Int64N(int64(2 * time.Second)))
	}
	return time.Millisecond + time.Duration(s.rnd.Int64N(int64(20*time.Millisecond)))
}

func runSim(p simParams) simResult {
	s := &sim{
		p: p, rnd: rand.New(rand.NewPCG(p.seed, 7)),
		leases: map[int]*simEntry{}, records: map[string]simRecord{},
		runs: map[int][]struct {
			host       string
			start, end time.Duration
		}{},
	}
	s.res.running = map[int][]string{}
	var sweep func()
	sweep = func() {
		for _, e := range s.leases {
			if !e.gone && s.now-e.stored >= s.p.lease {
				s.seq++
				e.gone, e.rev = true, s.seq // the limit marker
			}
		}
		for id, r := range s.records {
			if s.now-r.stored >= s.p.lease {
				delete(s.records, id)
			}
		}
		s.at(s.now+250*time.Millisecond, sweep)
	}
	s.at(0, sweep)
	for i, hp := range p.hosts {
		s.boot(hp, fmt.Sprintf("%s-0", hp.id), time.Duration(i)*100*time.Millisecond)
	}
	for s.q.Len() > 0 {
		e := heap.Pop(&s.q).(simEvent)
		if e.at > p.end {
			break
		}
		s.now = e.at
		e.fn()
	}
	for c, rs := range s.runs {
		for _, r := range rs {
			if r.end < 0 {
				s.res.running[c] = append(s.res.running[c], r.host)
			}
		}
		slices.SortFunc(rs, func(a, b struct {
			host       string
			start, end time.Duration
		}) int {
			return int(a.start - b.start)
		})
		for i := 1; i < len(rs); i++ {
			prevEnd := rs[i-1].end
			if prevEnd < 0 || prevEnd > rs[i].start {
				s.res.overlaps = append(s.res.overlaps, fmt.Sprintf("cluster %d: %s ran %v..%v, %s from %v",
					c, rs[i-1].host, rs[i-1].start, prevEnd, rs[i].host, rs[i].start))
			}
		}
	}
	return s.res
}

func (s *sim) boot(hp simHostParams, boot string, first time.Duration) {
	h := &simHost{p: hp, me: Holder{Host: hp.id, Boot: boot}, held: map[int]Held{},
		inflight: map[int]*simReq{}, started: map[int]time.Duration{}}
	h.view.Clusters = s.p.clusters
	if hp.crashAt > 0 && first < hp.crashAt {
		s.at(hp.crashAt, func() {
			h.dead = true
			for c := range h.started {
				s.stop(h, c, 0)
			}
			if hp.restartAt > 0 {
				next := hp
				next.crashAt, next.restartAt = 0, 0
				s.at(hp.restartAt, func() { s.boot(next, hp.id+"-1", hp.restartAt) })
			}
		})
	}
	var tick func()
	tick = func() {
		if h.dead {
			return
		}
		s.tick(h)
		s.at(s.now+h.after(s.p.timing.Renew/4), tick)
	}
	s.at(first, tick)
}

// tick is one pass of a host's loop: give up on requests past Op, refresh the
// view, announce itself, and carry out what Decide says.
func (s *sim) tick(h *simHost) {
	now := h.clock(s.now)
	for c, r := range h.inflight {
		if now.Sub(r.sent) >= s.p.timing.Op {
			delete(h.inflight, c)
		}
	}
	if h.linkUp(s.now) {
		snap := View{Clusters: s.p.clusters, Leases: map[int]Lease{}}
		for c, e := range s.leases {
			snap.Leases[c] = Lease{Holder: e.holder, Rev: e.rev, Gone: e.gone}
		}
		for id, r := range s.records {
			snap.Hosts = append(snap.Hosts, Capacity{Host: id, Max: r.capacity})
		}
		s.at(s.now+s.delay(), func() {
			if !h.dead && h.linkUp(s.now) {
				h.view = snap
			}
		})
	}
	s.send(h, &simReq{host: h, sent: now})
	for _, a := range Decide(h.me, s.p.timing, now, h.view, h.held) {
		switch a.Kind {
		case Fence:
			delete(h.held, a.Cluster)
			s.res.fences++
			if _, ok := h.started[a.Cluster]; ok {
				s.stop(h, a.Cluster, time.Duration(s.rnd.Int64N(int64(s.p.killMax)+1)))
			}
		case Take, Renew:
			if h.inflight[a.Cluster] != nil {
				continue
			}
			r := &simReq{host: h, kind: a.Kind, c: a.Cluster, rev: a.Rev, sent: now}
			h.inflight[a.Cluster] = r
			s.send(h, r)
		}
	}
}

func (s *sim) send(h *simHost, r *simReq) {
	if !h.linkUp(s.now) {
		return
	}
	s.at(s.now+s.delay(), func() {
		if !h.linkUp(s.now) {
			return
		}
		s.apply(r)
		s.at(s.now+s.delay(), func() {
			if !h.dead && h.linkUp(s.now) {
				s.answer(h, r)
			}
		})
	})
}

// apply is the server: a host record is a plain put; a take without a
// revision is a create (allowed over a marker), anything else an update at
// the last revision.
func (s *sim) apply(r *simReq) {
	if r.kind == 0 {
		s.records[r.host.me.Host] = simRecord{capacity: r.host.p.capacity, stored: s.now}
		return
	}
	e := s.leases[r.c]
	switch {
	case r.kind == Take && r.rev == 0 && e != nil && !e.gone:
		return
	case (r.kind == Renew || r.rev != 0) && (e == nil || e.rev != r.rev):
		return
	}
	s.seq++
	s.leases[r.c] = &simEntry{holder: r.host.me, rev: s.seq, stored: s.now}
	r.ok, r.newRev = true, s.seq
}

func (s *sim) answer(h *simHost, r *simReq) {
	if r.kind == 0 || h.inflight[r.c] != r {
		return // abandoned past Op: the host never learns it succeeded
	}
	delete(h.inflight, r.c)
	if !r.ok {
		return
	}
	switch r.kind {
	case Take:
		h.held[r.c] = Held{Rev: r.newRev, Sent: r.sent}
		s.res.takes++
		if _, ok := h.started[r.c]; !ok {
			h.started[r.c] = s.now
			s.runs[r.c] = append(s.runs[r.c], struct {
				host       string
				start, end time.Duration
			}{h.me.String(), s.now, -1})
		}
	case Renew:
		if _, ok := h.held[r.c]; ok {
			h.held[r.c] = Held{Rev: r.newRev, Sent: r.sent}
		}
	}
}

// stop ends host h's process of cluster c after kill.
func (s *sim) stop(h *simHost, c int, kill time.Duration) {
	delete(h.started, c)
	rs := s.runs[c]
	for i := range rs {
		if rs[i].host == h.me.String() && rs[i].end < 0 {
			rs[i].end = s.now + kill
		}
	}
}

// simTotals counts what the randomized runs did, to show they fence.
var simTotals struct {
	sync.Mutex
	runs, takes, fences int
}

// TestLeaseSimulated runs random meshes through outages, slow messages,
// drifting clocks, crashes and restarts.
func TestLeaseSimulated(t *testing.T) {
	t.Cleanup(func() {
		t.Logf("%d runs: %d leases taken, %d fenced", simTotals.runs, simTotals.takes, simTotals.fences)
		if simTotals.fences == 0 {
			t.Error("no run fenced a lease: the runs do not test fencing")
		}
	})
	rapid.Check(t, func(t *rapid.T) {
		lease := 10 * time.Second
		p := simParams{
			timing: TimingFor(lease), lease: lease,
			clusters: rapid.IntRange(1, 8).Draw(t, "clusters"),
			seed:     rapid.Uint64().Draw(t, "seed"),
			slow:     float64(rapid.IntRange(0, 10).Draw(t, "slow_percent")) / 100,
			quiet:    70 * time.Second,
			end:      70*time.Second + 4*lease,
			killMax:  100 * time.Millisecond,
		}
		capacity := 0
		for i := range rapid.IntRange(1, 4).Draw(t, "hosts") {
			hp := simHostParams{
				id:       fmt.Sprintf("h%d", i),
				capacity: rapid.IntRange(0, 4).Draw(t, "capacity"),
				driftPPM: rapid.IntRange(-1000, 1000).Draw(t, "drift_ppm"),
			}
			for range rapid.IntRange(0, 2).Draw(t, "outages") {
				from := time.Duration(rapid.IntRange(0, 60_000).Draw(t, "outage_ms")) * time.Millisecond
				hp.outages = append(hp.outages, span{from, from + time.Duration(rapid.IntRange(100, 25_000).Draw(t, "outage_len_ms"))*time.Millisecond})
			}
			if rapid.IntRange(0, 3).Draw(t, "crash") == 0 {
				hp.crashAt = time.Duration(rapid.IntRange(1, 50).Draw(t, "crash_s")) * time.Second
				if rapid.Bool().Draw(t, "restart") {
					hp.restartAt = hp.crashAt + time.Duration(rapid.IntRange(0, 15_000).Draw(t, "down_ms"))*time.Millisecond
				}
			}
			if hp.crashAt == 0 || hp.restartAt > 0 {
				capacity += cmpCap(hp.capacity, p.clusters)
			}
			p.hosts = append(p.hosts, hp)
		}
		for _, h := range p.hosts {
			for i := range h.outages {
				h.outages[i].to = min(h.outages[i].to, p.quiet)
			}
		}
		res := runSim(p)
		simTotals.Lock()
		simTotals.runs++
		simTotals.takes += res.takes
		simTotals.fences += res.fences
		simTotals.Unlock()
		if len(res.overlaps) > 0 {
			t.Fatalf("a cluster ran on two hosts at once: %v", res.overlaps)
		}
		running := 0
		for c := range p.clusters {
			switch len(res.running[c]) {
			case 0:
			case 1:
				running++
			default:
				t.Fatalf("at the end cluster %d runs on %v", c, res.running[c])
			}
		}
		if want := min(capacity, p.clusters); running < want {
			t.Fatalf("at the end %d clusters run, %v; the live hosts have room for %d", running, res.running, want)
		}
	})
}

func cmpCap(capacity, clusters int) int {
	if capacity == 0 {
		return clusters
	}
	return min(capacity, clusters)
}

// TestLeaseSimulatedCatchesLateFence shows the model can fail: a holder that
// fences a quarter lease after the lease expired (instead of a quarter before)
// overlaps with the host that took its cluster over, and the right timing
// does not, in the same scenario.
func TestLeaseSimulatedCatchesLateFence(t *testing.T) {
	lease := 10 * time.Second
	scenario := func(tm Timing) simResult {
		return runSim(simParams{
			timing: tm, lease: lease, clusters: 2, seed: 1, quiet: 40 * time.Second, end: 80 * time.Second,
			killMax: 10 * time.Millisecond,
			hosts: []simHostParams{
				{id: "a", outages: []span{{20 * time.Second, 40 * time.Second}}},
				{id: "b"},
			},
		})
	}
	late := TimingFor(lease)
	late.Margin = -lease / 4
	if res := scenario(late); len(res.overlaps) == 0 {
		t.Fatalf("fencing after the lease expired went unnoticed: %+v", res)
	}
	res := scenario(TimingFor(lease))
	if len(res.overlaps) > 0 {
		t.Fatalf("overlap with the right timing: %v", res.overlaps)
	}
	if res.fences == 0 || len(res.running[0]) != 1 || len(res.running[1]) != 1 {
		t.Fatalf("the cut-off host fenced %d leases and the clusters end on %v; want a fence and one host each", res.fences, res.running)
	}
}
