package manager

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sm-supervisor/sm/internal/jsonscan"
	"github.com/sm-supervisor/sm/ipc"
	"github.com/sm-supervisor/sm/mesh"
)

// Cross-host routing (docs/multihost.md). A request for a cluster another
// host holds is forwarded to that host over NATS (mesh/forward.go is the
// wire format), where it runs as if a client of that host had sent it; the
// reply comes back to this host, which answers its client with the client's
// own id. Only this host answers the client, so exactly one REPLY holds
// across hosts: the pending request is claimed once, by the reply, its
// deadline, the owner's absence or a failure.

// router is a manager's part of cross-host routing; nil on a single host.
type router struct {
	m      *Manager
	nc     *nats.Conn
	me     mesh.Holder
	name   string
	repSub string // this boot's reply subject
	owners *mesh.Owners
	max    int // mesh.max_forwards

	subs       []*nats.Subscription
	stopOwners context.CancelFunc

	fmu sync.Mutex          // guards fwd and dl
	fwd map[uint64]*pending // requests forwarded to other hosts, by forward id
	// dl times the forwards with the default timeout, as Manager.dl does
	// the requests sent to local processes (deadline.go): one timer, not one
	// per request.
	dl  deadlines
	seq atomic.Uint64

	dropped *prometheus.CounterVec // garbage and impostors, by reason

	// Each subscription's handler runs on one goroutine of its own, and
	// holds back what it sends until no message is left for it: the frames
	// it hands local processes and clients (batch) and the NATS messages
	// it sends (out).
	reqBatch, repBatch ipc.Batch
	reqOut, repOut     natsOut
	// lastOp and lastTarget are onRequests's interned strings (intern).
	lastOp, lastTarget string
}

// Reasons a message or record is dropped (sm_mesh_dropped_total).
const (
	dropFormat  = "bad_format"      // not our wire format, cut short, or a payload that is no JSON
	dropUnknown = "unknown_forward" // a reply for a forward id not in flight (late, after its deadline, or made up)
	dropBoot    = "wrong_boot"      // a reply from another boot than the one the request went to
)

// natsOut gathers the records bound for each subject until flush: then
// each subject's leave as one NATS message. A message is let go early once
// it holds maxBatch records, so that the receiver works on the first part
// of a long batch while the rest is on its way: one message per 64
// requests in flight made the hop lock-step (all out, all back). Used by
// one goroutine at a time.
type natsOut struct {
	outs []outMsg
	n    int // outs in use; the rest keep their buffers for reuse
}

// outMsg is one NATS message being gathered.
type outMsg struct {
	subj string
	host string // for requests: the host they go to
	kind byte
	recs int
	buf  []byte
}

// maxBatch is the most records one NATS message carries.
const maxBatch = 16

// msg returns the message being gathered for subject, started as kind from me.
func (o *natsOut) msg(subject, host string, kind byte, me mesh.Holder) *outMsg {
	for i := range o.n {
		if m := &o.outs[i]; m.subj == subject {
			return m
		}
	}
	if o.n == len(o.outs) {
		o.outs = append(o.outs, outMsg{})
	}
	m := &o.outs[o.n]
	o.n++
	m.subj, m.host, m.kind, m.recs = subject, host, kind, 0
	m.buf = mesh.AppendHeader(m.buf[:0], kind, me)
	return m
}

// added counts a record appended to m, and lets m go at maxBatch.
func (o *natsOut) added(r *router, m *outMsg) {
	if m.recs++; m.recs < maxBatch {
		return
	}
	r.publish(m)
	m.recs = 0
	m.buf = mesh.AppendHeader(m.buf[:0], m.kind, r.me)
}

// flush publishes what was gathered.
func (o *natsOut) flush(r *router) {
	for i := range o.n {
		if m := &o.outs[i]; m.recs > 0 {
			r.publish(m)
		}
		o.outs[i].subj = ""
	}
	o.n = 0
}

func (o *natsOut) empty() bool { return o.n == 0 }

// publish sends m (nats.go copies it). Requests carry this boot's reply
// subject, so that NATS answers "no responders" when their host's manager
// is gone; a request message that cannot leave at all (the connection is
// down, and nothing is buffered while it is: mesh.Connect) fails the
// requests in flight to its host now rather than at their deadline.
func (r *router) publish(m *outMsg) {
	if m.kind != mesh.KindRequests {
		_ = r.nc.Publish(m.subj, m.buf)
		return
	}
	if err := r.nc.PublishMsg(&nats.Msg{Subject: m.subj, Reply: r.repSub, Data: m.buf}); err != nil {
		r.failVia(m.host, "NATS is not reachable from this host ("+err.Error()+")")
	}
}

// newRouter makes m's router and starts its watch of the leases, which
// stop ends.
func newRouter(m *Manager, nc *nats.Conn, me mesh.Holder, st *mesh.Store) *router {
	ctx, cancel := context.WithCancel(context.Background())
	r := &router{stopOwners: cancel, owners: st.WatchOwners(ctx, m.table().topo.Clusters(), m.log), m: m, nc: nc, me: me, name: m.cfg.Mesh.Name, repSub: mesh.ReplySubject(m.cfg.Mesh.Name, me),
		max: m.cfg.Mesh.MaxForwards, fwd: map[uint64]*pending{}, dropped: m.metrics.meshDropped}
	for _, why := range []string{dropFormat, dropUnknown, dropBoot} {
		r.dropped.WithLabelValues(why)
	}
	return r
}

// start subscribes to this host's request subject and this boot's reply
// subject.
func (r *router) start() error {
	for _, s := range []struct {
		subj string
		fn   func(*nats.Subscription, *nats.Msg)
	}{{mesh.ReqSubject(r.name, r.me.Host), r.onRequests}, {r.repSub, r.onReplies}} {
		sub, err := r.nc.Subscribe(s.subj, func(msg *nats.Msg) { s.fn(msg.Sub, msg) })
		if err != nil {
			return err
		}
		_ = sub.SetPendingLimits(-1, 256<<20)
		r.subs = append(r.subs, sub)
	}
	return r.nc.Flush()
}

// stop unsubscribes, so that no more requests come in, and ends the watch.
func (r *router) stop() {
	for _, s := range r.subs {
		_ = s.Unsubscribe()
	}
	r.stopOwners()
	<-r.owners.Done()
}

// idle reports whether sub, from inside its handler, has nothing more
// queued: the moment to let what was held back go. nats.go counts the
// message being handled as pending until its handler returns.
func idle(sub *nats.Subscription) bool {
	n, _, err := sub.Pending()
	return err != nil || n <= 1
}

func (r *router) drop(why string) { r.dropped.WithLabelValues(why).Inc() }

// hop decides where a request for cluster c, which this host does not run,
// goes (mesh.FirstHop). A request another host forwarded here never goes on:
// if it is not starting here, its sender learns it moved.
func (m *Manager) hop(c int, p *pending) mesh.Hop {
	r := m.router
	if r == nil {
		return mesh.Hop{Kind: mesh.HopFail, Why: "it is not held by this host"}
	}
	owner, ok := r.owners.Owner(c)
	if p.remote && (!ok || owner != r.me) {
		return mesh.Hop{Kind: mesh.HopFail, Why: "moved"}
	}
	return mesh.FirstHop(r.me, false, owner, ok)
}

// routeAway carries out a hop other than local for p, bound for cluster c.
func (m *Manager) routeAway(c int, p *pending, h mesh.Hop) {
	switch {
	case p.remote:
		if p.claim() && p.rem != nil {
			m.router.answer(p.nout, p.rem, mesh.Reply{ID: p.rem.id, Status: mesh.StatusMoved})
		}
	case h.Kind == mesh.HopForward:
		m.router.send(h.To, c, p)
	default:
		m.fail(p, ipc.Errorf(ipc.CodeUnavailable, "cluster %d is not reachable: %s", c, h.Why))
	}
}

// inbound is a request another host forwarded here, allocated at once.
type inbound struct {
	p pending
	f ipc.Frame
	o remoteOrigin
}

// intern returns b as a string, the one in *last if it is the same: a
// batch's requests mostly share their op and target, and this spares a
// string each. Only onRequests's goroutine uses last.
func (r *router) intern(last *string, b []byte) string {
	if string(b) != *last {
		*last = string(b)
	}
	return *last
}

// remoteOrigin is where the reply to a request another host forwarded here goes.
type remoteOrigin struct {
	to string // the sender's reply subject (per boot)
	id uint64 // its forward id
}

// send forwards p, bound for cluster c, to host to.
func (r *router) send(to mesh.Holder, c int, p *pending) {
	m := r.m
	left := time.Until(p.deadline)
	if left <= 0 {
		m.expire(p)
		return
	}
	wantsReply := p.origID != "" || p.bc != nil
	var fid uint64
	if wantsReply {
		r.fmu.Lock()
		if len(r.fwd) >= r.max {
			r.fmu.Unlock()
			m.fail(p, ipc.Errorf(ipc.CodeUnavailable, "%d requests already forwarded to other hosts await their replies (mesh.max_forwards)", r.max))
			return
		}
		fid = r.seq.Add(1)
		p.cluster = c
		p.via.Store(&to)
		p.fid.Store(fid)
		r.fwd[fid] = p
		if p.timer == nil {
			r.dl.push(p, r.sweep)
		}
		r.fmu.Unlock()
		if p.done.Load() {
			r.forget(p) // the deadline passed while we were registering it
			return
		}
	}
	rec := mesh.Request{ID: fid, Cluster: c, Deadline: uint64(left / time.Microsecond),
		Op: []byte(p.f.Op), Target: []byte(p.f.Target), Payload: p.f.Payload}
	if p.bc != nil {
		rec.Flags = mesh.FlagPart
	}
	out := p.nout
	if out == nil {
		out = &natsOut{}
		defer out.flush(r)
	}
	msg := out.msgTo(r, to.Host)
	msg.buf = mesh.AppendRequest(msg.buf, rec)
	out.added(r, msg)
	m.metrics.forwarded.Inc()
	if !wantsReply {
		p.claim()
	}
}

// forget takes p off the forward table.
func (r *router) forget(p *pending) {
	fid := p.fid.Load()
	if fid == 0 {
		return
	}
	r.fmu.Lock()
	if r.fwd[fid] == p {
		delete(r.fwd, fid)
	}
	r.dl.unlink(p)
	r.fmu.Unlock()
}

// sweep is the forwards' shared deadline timer.
func (r *router) sweep() {
	r.fmu.Lock()
	due := r.dl.due(time.Now(), func(p *pending) {
		if fid := p.fid.Load(); r.fwd[fid] == p {
			delete(r.fwd, fid)
		}
	})
	r.fmu.Unlock()
	for _, p := range due {
		r.m.expire(p)
	}
}

// answer sends the reply to a request another host forwarded here: held
// back in out, or sent at once with out nil.
func (r *router) answer(out *natsOut, o *remoteOrigin, rep mesh.Reply) {
	if out == nil {
		out = &natsOut{}
		defer out.flush(r)
	}
	msg := out.msg(o.to, "", mesh.KindReplies, r.me)
	msg.buf = mesh.AppendReply(msg.buf, rep)
	out.added(r, msg)
}

// answerResult is answer for a result or an error.
func (r *router) answerResult(out *natsOut, o *remoteOrigin, payload json.RawMessage, e *ipc.Error) {
	rep := mesh.Reply{ID: o.id, Status: mesh.StatusOK, Payload: payload}
	if e != nil {
		rep = mesh.Reply{ID: o.id, Status: mesh.StatusError, Code: []byte(e.Code), Message: []byte(e.Message)}
	}
	r.answer(out, o, rep)
}

// onRequests runs the requests another host forwarded here, each as if a
// client of this host had sent it.
func (r *router) onRequests(sub *nats.Subscription, msg *nats.Msg) {
	defer func() {
		if idle(sub) {
			r.reqBatch.Flush()
			r.reqOut.flush(r)
		}
	}()
	kind, from, rest, err := mesh.ParseHeader(msg.Data)
	if err != nil || kind != mesh.KindRequests {
		r.drop(dropFormat)
		return
	}
	m := r.m
	replyTo := mesh.ReplySubject(r.name, from)
	for len(rest) > 0 {
		var q mesh.Request
		if q, rest, err = mesh.NextRequest(rest); err != nil {
			r.drop(dropFormat)
			return
		}
		if !utf8.Valid(q.Op) || !utf8.Valid(q.Target) || len(q.Op) == 0 || !validJSON(q.Payload) {
			r.drop(dropFormat)
			continue
		}
		now := time.Now()
		// One allocation for the request, its frame and where it came from.
		in := &inbound{}
		p, f := &in.p, &in.f
		f.Op, f.Target = r.intern(&r.lastOp, q.Op), r.intern(&r.lastTarget, q.Target)
		if len(q.Payload) > 0 {
			f.Payload = q.Payload // the message's own bytes, not reused
		}
		p.f, p.queued, p.deadline = f, now, now.Add(time.Duration(q.Deadline)*time.Microsecond)
		p.batch, p.nout, p.cluster, p.remote = &r.reqBatch, &r.reqOut, q.Cluster, true
		if q.ID != 0 {
			in.o = remoteOrigin{to: replyTo, id: q.ID}
			p.rem = &in.o
		}
		if m.stopping.Load() {
			m.fail(p, ipc.Errorf(ipc.CodeShuttingDown, "the manager on host %s is shutting down", r.me.Host))
			continue
		}
		table := m.table()
		if q.Cluster >= len(table.procs) {
			m.fail(p, ipc.Errorf(ipc.CodeUnknownTarget, "cluster %d is not in host %s's topology", q.Cluster, r.me.Host))
			continue
		}
		// No timer of its own: the shared list times it once it is sent
		// (its deadline, the sender's less the way here, is about in send
		// order), and one that waits for its cluster gets one. Its expiry
		// only forgets it: the sending host answers the timeout.
		if q.Flags&mesh.FlagPart != 0 && !table.procs[q.Cluster].usable() && !table.slots[q.Cluster].remote.Load() {
			m.fail(p, ipc.Errorf(ipc.CodeUnavailable, "cluster %d has no ready process", q.Cluster))
			continue
		}
		m.dispatch(table, q.Cluster, p)
	}
}

// onReplies completes the requests this boot forwarded with their replies.
func (r *router) onReplies(sub *nats.Subscription, msg *nats.Msg) {
	defer func() {
		if idle(sub) {
			r.repBatch.Flush()
			r.repOut.flush(r)
		}
	}()
	if len(msg.Data) == 0 && msg.Header.Get("Status") == "503" {
		host, _ := strings.CutPrefix(msg.Header.Get("Nats-Subject"), r.name+".req.")
		r.failVia(host, "its manager does not answer (no responders)")
		return
	}
	kind, from, rest, err := mesh.ParseHeader(msg.Data)
	if err != nil || kind != mesh.KindReplies {
		r.drop(dropFormat)
		return
	}
	m := r.m
	for len(rest) > 0 {
		var rep mesh.Reply
		if rep, rest, err = mesh.NextReply(rest); err != nil {
			r.drop(dropFormat)
			return
		}
		if rep.Status == mesh.StatusOK && !validJSON(rep.Payload) {
			r.drop(dropFormat)
			continue
		}
		r.fmu.Lock()
		p := r.fwd[rep.ID]
		switch {
		case p == nil:
			r.fmu.Unlock()
			r.drop(dropUnknown)
			continue
		case *p.via.Load() != from:
			r.fmu.Unlock()
			r.drop(dropBoot)
			continue
		}
		delete(r.fwd, rep.ID)
		r.dl.unlink(p)
		r.fmu.Unlock()
		switch rep.Status {
		case mesh.StatusMoved:
			r.retry(p, from)
		case mesh.StatusOK:
			if p.claim() {
				m.deliverVia(&r.repBatch, &r.repOut, p, rep.Payload, nil)
			}
		default:
			if p.claim() {
				m.deliverVia(&r.repBatch, &r.repOut, p, nil, &ipc.Error{Code: string(rep.Code), Message: string(rep.Message)})
			}
		}
	}
}

// retry routes a request whose owner said the cluster moved, once more,
// under the owners as the watch sees them now (mesh.Retry).
func (r *router) retry(p *pending, from mesh.Holder) {
	m := r.m
	c := p.cluster
	table := m.table()
	if c >= len(table.slots) || p.done.Load() {
		return
	}
	owner, ok := r.owners.Owner(c)
	h := mesh.Retry(r.me, from, p.tries, !table.slots[c].remote.Load(), owner, ok)
	p.tries++
	p.fid.Store(0)
	p.batch, p.nout = &r.repBatch, &r.repOut
	switch h.Kind {
	case mesh.HopLocal:
		if p.bc != nil && !table.procs[c].usable() {
			// A broadcast's part waits for no cluster, here as anywhere.
			m.fail(p, ipc.Errorf(ipc.CodeUnavailable, "cluster %d has no ready process", c))
			return
		}
		m.dispatch(table, c, p)
	case mesh.HopForward:
		r.send(h.To, c, p)
	default:
		m.fail(p, ipc.Errorf(ipc.CodeUnavailable, "cluster %d is not reachable: %s", c, h.Why))
	}
}

// failVia fails every request in flight to host: its manager is gone.
func (r *router) failVia(host, why string) {
	var lost []*pending
	r.fmu.Lock()
	for id, p := range r.fwd {
		if p.via.Load().Host == host {
			delete(r.fwd, id)
			r.dl.unlink(p)
			lost = append(lost, p)
		}
	}
	r.fmu.Unlock()
	for _, p := range lost {
		if p.claim() {
			r.m.deliver(p, nil, ipc.Errorf(ipc.CodeUnavailable, "cluster %d is on host %s, and %s", p.cluster, host, why))
		}
	}
}

// failAll fails every request in flight to another host (shutdown).
func (r *router) failAll(e *ipc.Error) {
	r.fmu.Lock()
	all := r.fwd
	r.fwd = map[uint64]*pending{}
	r.dl.clear()
	r.fmu.Unlock()
	for _, p := range all {
		r.m.fail(p, e)
	}
}

// validJSON reports whether b is one JSON value (or empty: no payload): the
// fast scanner first, encoding/json for what it gives up on (nesting past
// its depth). The frame it came in was checked against limits.max_json_depth
// on the host that read it.
func validJSON(b []byte) bool {
	if len(b) == 0 {
		return true
	}
	s := jsonscan.New(b)
	s.WS()
	if s.Value(1) {
		s.WS()
		return s.Done()
	}
	return json.Valid(b)
}

// flushNATS lets go what c's reader held back for other hosts.
func (m *Manager) flushNATS(c *conn) {
	if !c.nout.empty() {
		c.nout.flush(m.router)
	}
}

// msgTo returns the request message being gathered for host; its subject is
// made once per message, not per request.
func (o *natsOut) msgTo(r *router, host string) *outMsg {
	for i := range o.n {
		if m := &o.outs[i]; m.kind == mesh.KindRequests && m.host == host {
			return m
		}
	}
	return o.msg(mesh.ReqSubject(r.name, host), host, mesh.KindRequests, r.me)
}
