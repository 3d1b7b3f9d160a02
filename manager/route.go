package manager

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sm-supervisor/sm/generation"
	"github.com/sm-supervisor/sm/ipc"
	"github.com/sm-supervisor/sm/mesh"
	"github.com/sm-supervisor/sm/supervise"
)

// routeTable is an immutable snapshot of who serves each cluster; the loop
// publishes a new one whenever routing changes. Its slots are those of its
// topology: a re-clustering deploy publishes a table with new slots.
type routeTable struct {
	topo  generation.Topology
	procs []*proc // routed process per cluster, nil while it has none
	slots []*slot
}

// newRouteTable is a table for topo with no process routed and new slots at
// generation gen, supervised by rules.
func newRouteTable(topo generation.Topology, gen int64, rules *supervise.Rules) *routeTable {
	t := &routeTable{topo: topo, procs: make([]*proc, topo.Clusters()), slots: make([]*slot, topo.Clusters())}
	for i := range t.slots {
		t.slots[i] = newSlot(topo, i, gen, rules)
	}
	return t
}

// with returns a copy of t with cluster routed to p (nil: none).
func (t *routeTable) with(cluster int, p *proc) *routeTable {
	procs := append([]*proc(nil), t.procs...)
	procs[cluster] = p
	return &routeTable{topo: t.topo, procs: procs, slots: t.slots}
}

// pending is one request on its way: waiting for its cluster, or forwarded and
// waiting for the reply. Exactly one path completes it (claim).
type pending struct {
	mid    atomic.Uint64 // the id the cluster sees, once forwarded
	from   *conn
	origID string
	f      *ipc.Frame           // the request (op, target, payload)
	to     atomic.Pointer[proc] // set once forwarded
	// deadline is when the request fails. A request with a timer of its own
	// (a shorter timeout_ms, a broadcast part, one that waited for its
	// cluster) is timed by it; any other, once forwarded, by the shared
	// deadline list (deadline.go).
	deadline time.Time
	timer    *time.Timer
	// The deadline list's links, guarded by Manager.pmu.
	listed     bool
	prev, next *pending
	bc         *broadcast
	bcIdx      int                 // the cluster, for a part of a broadcast
	topo       generation.Topology // the topology bcIdx is of
	done       atomic.Bool
	queued     time.Time
	// batch is the forwarding reader's (conn.out) while forward runs on its
	// goroutine, so the request leaves with the others read with it; nil once
	// the request waits, since it then leaves from another goroutine. nout
	// is the same for what leaves over NATS to other hosts (meshroute.go).
	batch *ipc.Batch
	nout  *natsOut

	// Cross-host routing (meshroute.go). remote marks a request another
	// host forwarded here, never forwarded on; rem, set on those that want a
	// reply, is where it goes. On one this host
	// forwarded: cluster is its cluster, via the boot it went to and fid its
	// forward id while in flight, tries the retries after a MOVED.
	remote  bool
	rem     *remoteOrigin
	cluster int
	tries   int
	via     atomic.Pointer[mesh.Holder]
	fid     atomic.Uint64
}

func (p *pending) claim() bool {
	if !p.done.CompareAndSwap(false, true) {
		return false
	}
	if p.timer != nil {
		p.timer.Stop()
	}
	return true
}

// broadcast gathers the per-cluster results of a "*" request into one REPLY.
type broadcast struct {
	from    *conn
	origID  string
	mu      sync.Mutex
	results []bcResult
	left    int
}

type bcResult struct {
	cluster int
	payload json.RawMessage
	err     *ipc.Error
}

// requestTimeout is the deadline of f: requests.timeout, shortened by the
// frame's timeout_ms if it asks for less.
func (m *Manager) requestTimeout(f *ipc.Frame) time.Duration {
	d := m.cfg.Requests.Timeout.Duration
	if f.TimeoutMS > 0 {
		if t := time.Duration(f.TimeoutMS) * time.Millisecond; t < d {
			d = t
		}
	}
	return d
}

// forward routes a business op to the process serving its target.
func (m *Manager) forward(from *conn, f *ipc.Frame) {
	if m.stopping.Load() {
		m.metrics.failed.WithLabelValues(ipc.CodeShuttingDown).Inc()
		from.replyErr(f.ID, ipc.CodeShuttingDown, "manager is shutting down")
		return
	}
	table := m.routes.Load()
	cluster, err := table.topo.Resolve(f.Target)
	if err != nil {
		if f.ID != "" || errors.Is(err, generation.ErrUnknownTarget) {
			m.metrics.failed.WithLabelValues(ipc.CodeUnknownTarget).Inc()
			from.replyErr(f.ID, ipc.CodeUnknownTarget, "%v", err)
		}
		return
	}
	timeout := m.requestTimeout(f)
	if cluster == generation.All {
		m.broadcast(from, f, table, timeout)
		return
	}
	now := time.Now()
	p := &pending{from: from, origID: f.ID, f: f, queued: now, batch: &from.out, nout: &from.nout, deadline: now.Add(timeout)}
	if timeout != m.cfg.Requests.Timeout.Duration {
		m.arm(p) // the list holds only the default timeout, in deadline order
	}
	m.dispatch(table, cluster, p)
}

// redispatch routes a request that waited in a slot retired by re-clustering
// again, by its target, under the table in force now.
func (m *Manager) redispatch(p *pending) {
	table := m.table()
	if p.bc != nil {
		if table.topo != p.topo {
			m.fail(p, ipc.Errorf(ipc.CodeUnavailable, "cluster %d was re-clustered away", p.bcIdx))
			return
		}
		m.dispatch(table, p.bcIdx, p)
		return
	}
	cluster, err := table.topo.Resolve(p.f.Target)
	if err != nil || cluster == generation.All {
		m.fail(p, ipc.Errorf(ipc.CodeUnknownTarget, "target %q is not in the new topology", p.f.Target))
		return
	}
	m.dispatch(table, cluster, p)
}

// arm starts a timer of p's own for its deadline.
func (m *Manager) arm(p *pending) {
	p.timer = time.AfterFunc(time.Until(p.deadline), func() { m.expire(p) })
}

// dispatch sends p to cluster's routed process or, while it has none, queues
// it (bounded by limits.max_waiting and by p's deadline).
func (m *Manager) dispatch(table *routeTable, cluster int, p *pending) {
	if pr := table.procs[cluster]; pr.usable() {
		m.send(pr, p)
		return
	}
	s := table.slots[cluster]
	s.mu.Lock()
	if s.retired {
		s.mu.Unlock()
		m.redispatch(p)
		return
	}
	// Routing changes are published under the slot's lock, so this look is final.
	if pr := m.table().procs[cluster]; pr.usable() {
		s.mu.Unlock()
		m.send(pr, p)
		return
	}
	if s.remote.Load() {
		// Held by another host, or being taken by this one (then it waits
		// here like any request for a cluster starting).
		if h := m.hop(cluster, p); h.Kind != mesh.HopLocal {
			s.mu.Unlock()
			m.routeAway(cluster, p, h)
			return
		}
	}
	if s.waitingLiveLocked() >= m.cfg.Limits.MaxWaiting {
		s.mu.Unlock()
		m.fail(p, ipc.Errorf(ipc.CodeBusy, "cluster %d is restarting and %d requests already wait for it (limits.max_waiting)", cluster, m.cfg.Limits.MaxWaiting))
		return
	}
	p.batch, p.nout = nil, nil
	if p.timer == nil {
		m.arm(p) // the list only times forwarded requests
	}
	s.waiting = append(s.waiting, p)
	s.mu.Unlock()
}

// send forwards p to pr with a manager-wide id, so ids of different senders
// never collide at the cluster.
func (m *Manager) send(pr *proc, p *pending) {
	// The read lock orders this send before a QUIESCE of pr: a request never
	// reaches a process after it was told to stop taking work.
	pr.sendMu.RLock()
	defer pr.sendMu.RUnlock()
	if pr.sendClosed {
		defer m.redispatch(p) // after RUnlock: routing has moved on
		return
	}
	c := pr.conn.Load()
	out := ipc.Frame{Op: p.f.Op, Target: p.f.Target, Payload: p.f.Payload}
	wantsReply := p.origID != "" || p.bc != nil || p.rem != nil
	if wantsReply {
		m.pmu.Lock()
		if len(m.pending) >= m.cfg.Limits.MaxPending {
			m.pmu.Unlock()
			m.fail(p, ipc.Errorf(ipc.CodeBusy, "%d requests in flight (limits.max_pending)", m.cfg.Limits.MaxPending))
			return
		}
		mid := m.reqSeq.Add(1)
		p.to.Store(pr)
		p.mid.Store(mid)
		m.pending[mid] = p
		if p.timer == nil {
			m.pushDeadlineLocked(p)
		}
		m.pmu.Unlock()
		if p.done.Load() {
			m.forget(p) // the deadline passed while we were registering it
			return
		}
		// Formatted on the stack: out does not outlive this call.
		var idb [13]byte
		out.ID = string(strconv.AppendUint(idb[:0], mid, 36))
	}
	err := ipc.ErrClosed
	if c != nil {
		// A request may be refused, but must not get the cluster cut off: its
		// queue also carries everyone else's requests and what it is owed.
		err = p.batch.TrySendFrame(c.c, &out)
	}
	switch {
	case errors.Is(err, ipc.ErrBusy):
		m.fail(p, ipc.Errorf(ipc.CodeBusy, "cluster %d is not keeping up with its requests", pr.cluster))
		return
	case errors.Is(err, ipc.ErrFrameTooLarge):
		m.fail(p, ipc.Errorf(ipc.CodeFrameTooLarge, "the forwarded request exceeds limits.max_frame_bytes"))
		return
	case err != nil:
		m.fail(p, ipc.Errorf(ipc.CodeUnavailable, "cluster %d connection lost", pr.cluster))
		return
	}
	m.metrics.forwarded.Inc()
	if !wantsReply {
		p.claim() // fire-and-forget: delivered
	}
}

func (m *Manager) forget(p *pending) {
	if m.router != nil {
		m.router.forget(p)
	}
	mid := p.mid.Load()
	if mid == 0 {
		return
	}
	m.pmu.Lock()
	if m.pending[mid] == p {
		m.unpendLocked(mid, p)
	}
	m.pmu.Unlock()
}

// completeReply routes a cluster's REPLY back to the request's sender. f and
// its payload may be the reader's (ipc.Decoder.DecodeReply): nothing here
// keeps them past the call.
func (m *Manager) completeReply(c *conn, f *ipc.Frame) {
	mid, err := strconv.ParseUint(f.ID, 36, 64)
	var p *pending
	if err == nil && c.proc != nil {
		m.pmu.Lock()
		p = m.pending[mid]
		// Only the process the request went to may answer it.
		if p != nil && p.to.Load() == c.proc {
			m.unpendLocked(mid, p)
		} else {
			p = nil
		}
		m.pmu.Unlock()
	}
	if p == nil {
		c.replyErr("", ipc.CodeUnknownID, "REPLY for unknown request id %q", f.ID)
		return
	}
	if !p.claim() {
		return
	}
	m.deliverVia(&c.out, &c.nout, p, f.Payload, f.Error)
}

// deliver hands a result to p's sender (or its broadcast).
func (m *Manager) deliver(p *pending, payload json.RawMessage, e *ipc.Error) {
	m.deliverVia(nil, nil, p, payload, e)
}

// deliverVia is deliver with the reply held back in b, or in no if it goes
// to another host (nil: sent at once).
func (m *Manager) deliverVia(b *ipc.Batch, no *natsOut, p *pending, payload json.RawMessage, e *ipc.Error) {
	if e != nil {
		m.metrics.failed.WithLabelValues(e.Code).Inc()
	}
	if p.rem != nil {
		m.router.answerResult(no, p.rem, payload, e)
		return
	}
	if p.bc != nil {
		// Kept until the last part: a copy, since a reply's payload may be
		// a view into its reader's buffer.
		p.bc.set(p.bcIdx, bytes.Clone(payload), e)
		return
	}
	if p.origID == "" {
		return
	}
	replyTo(b, p.from, p.origID, payload, e)
	m.metrics.latency.Observe(time.Since(p.queued).Seconds())
}

// replyTo sends a REPLY; one that would exceed the frame limit (a cluster's
// payload near the limit plus a longer id, or a broadcast's sum) becomes a
// frame_too_large error, so the sender still gets exactly one REPLY.
func replyTo(b *ipc.Batch, c *conn, id string, payload json.RawMessage, e *ipc.Error) {
	err := b.SendFrame(c.c, &ipc.Frame{Op: ipc.OpReply, ID: id, Payload: payload, Error: e})
	if errors.Is(err, ipc.ErrFrameTooLarge) {
		c.send(ipc.ReplyError(id, ipc.Errorf(ipc.CodeFrameTooLarge, "the reply (%d payload bytes) exceeds limits.max_frame_bytes", len(payload))))
	}
}

// fail completes p with an error, once.
func (m *Manager) fail(p *pending, e *ipc.Error) {
	if !p.claim() {
		return
	}
	m.forget(p)
	m.deliver(p, nil, e)
}

// expire is p's deadline: a forwarded request times out; one still waiting
// for its cluster is unavailable.
func (m *Manager) expire(p *pending) {
	if !p.done.CompareAndSwap(false, true) {
		return
	}
	m.forget(p)
	if p.remote {
		return // the sending host times it out itself
	}
	if via := p.via.Load(); via != nil && p.fid.Load() != 0 {
		m.deliver(p, nil, ipc.Errorf(ipc.CodeTimeout, "cluster %d on host %s did not reply in time", p.cluster, via.Host))
		return
	}
	if to := p.to.Load(); to != nil {
		m.deliver(p, nil, ipc.Errorf(ipc.CodeTimeout, "cluster %d did not reply in time", to.cluster))
		return
	}
	m.deliver(p, nil, ipc.Errorf(ipc.CodeUnavailable, "target %q had no ready process before the deadline", p.f.Target))
}

// failProcPending fails every request forwarded to pr, which is gone: their
// replies can no longer come, so their senders learn now rather than at the deadline.
func (m *Manager) failProcPending(pr *proc) {
	var lost []*pending
	m.pmu.Lock()
	for id, p := range m.pending {
		if p.to.Load() == pr {
			m.unpendLocked(id, p)
			lost = append(lost, p)
		}
	}
	m.pmu.Unlock()
	for _, p := range lost {
		if p.claim() {
			m.deliver(p, nil, ipc.Errorf(ipc.CodeUnavailable, "cluster %d process exited before replying", pr.cluster))
		}
	}
}

func (m *Manager) failAllPending() {
	if m.router != nil {
		m.router.failAll(ipc.Errorf(ipc.CodeShuttingDown, "manager stopped"))
	}
	m.pmu.Lock()
	all := m.pending
	m.pending = make(map[uint64]*pending)
	m.clearDeadlinesLocked()
	m.pmu.Unlock()
	for _, p := range all {
		m.fail(p, ipc.Errorf(ipc.CodeShuttingDown, "manager stopped"))
	}
	for _, s := range m.table().slots {
		s.mu.Lock()
		w := s.waiting
		s.waiting = nil
		s.mu.Unlock()
		for _, p := range w {
			m.fail(p, ipc.Errorf(ipc.CodeShuttingDown, "manager stopped"))
		}
	}
}

// broadcast sends f to every cluster and answers once with all results. A
// cluster with no ready process answers unavailable at once rather than
// holding up the others until the deadline.
func (m *Manager) broadcast(from *conn, f *ipc.Frame, table *routeTable, timeout time.Duration) {
	n := len(table.procs)
	bc := &broadcast{from: from, origID: f.ID, results: make([]bcResult, n), left: n}
	for i, pr := range table.procs {
		now := time.Now()
		p := &pending{from: from, origID: f.ID, f: f, bc: bc, bcIdx: i, topo: table.topo, queued: now, deadline: now.Add(timeout)}
		bc.results[i].cluster = i
		if !pr.usable() {
			if table.slots[i].remote.Load() {
				// Another host's part: forwarded, with the parts bound
				// for the same host in one message.
				if h := m.hop(i, p); h.Kind == mesh.HopForward {
					p.nout = &from.nout
					m.arm(p)
					m.router.send(h.To, i, p)
					continue
				} else if h.Kind == mesh.HopFail {
					p.done.Store(true)
					bc.set(i, nil, ipc.Errorf(ipc.CodeUnavailable, "cluster %d is not reachable: %s", i, h.Why))
					continue
				}
			}
			p.done.Store(true)
			bc.set(i, nil, ipc.Errorf(ipc.CodeUnavailable, "cluster %d has no ready process", i))
			continue
		}
		m.arm(p)
		m.send(pr, p)
	}
}

func (b *broadcast) set(i int, payload json.RawMessage, e *ipc.Error) {
	b.mu.Lock()
	b.results[i].payload, b.results[i].err = payload, e
	b.left--
	last := b.left == 0
	b.mu.Unlock()
	if last && b.origID != "" {
		replyTo(nil, b.from, b.origID, b.encode(), nil)
	}
}

// encode renders {"results":[...]} by hand so each payload keeps its bytes.
func (b *broadcast) encode() json.RawMessage {
	out := []byte(`{"results":[`)
	for i, r := range b.results {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, `{"cluster":`...)
		out = strconv.AppendInt(out, int64(r.cluster), 10)
		if r.err != nil {
			e, _ := json.Marshal(r.err)
			out = append(out, `,"error":`...)
			out = append(out, e...)
		} else {
			out = append(out, `,"payload":`...)
			if len(r.payload) == 0 {
				out = append(out, "null"...)
			} else {
				out = append(out, r.payload...)
			}
		}
		out = append(out, '}')
	}
	return append(out, "]}"...)
}
