package manager

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/sm-supervisor/sm/discord"
	"github.com/sm-supervisor/sm/ipc"
	"github.com/sm-supervisor/sm/mesh"
	"github.com/sm-supervisor/sm/supervise"
)

// In a mesh, Discord's limits are the bot's, not the host's
// (docs/multihost.md): the identify gate claims each bucket's slot from the
// mesh's shared gate before it grants, every grant spends through the shared
// budget, and resume state is written behind to the shared store, which a
// host that takes a cluster over reads before it spawns it. The loop never
// waits on NATS: each request runs on a goroutine of its own and its answer
// comes back as an event (evIdentifyClaimed, evMeshResume). If the shared
// gate cannot be asked, nothing is granted: the claims are retried.

// claimRetryOnError is how soon a bucket claims again after the shared gate
// did not answer (NATS unreachable, or slow past the mesh's request bound).
const claimRetryOnError = 250 * time.Millisecond

// meshDiscord is a mesh host's part of the shared gate, budget and resume
// store.
type meshDiscord struct {
	store   *mesh.DiscordStore
	me      mesh.Holder
	floor   int
	spacing time.Duration
	hold    time.Duration // mesh.IdentifyHold
	window  time.Duration // mesh.GrantWindow
	maxAge  time.Duration // discord.resume_max_age
	flush   time.Duration // the longest the writer's last flush may take
	log     *slog.Logger

	ctx    context.Context // ended by stop: every request in flight gives up
	cancel context.CancelFunc
	wg     sync.WaitGroup // the requests' goroutines
	writer *resumeWriter

	// Loop-owned.
	reachable               bool      // the shared gate answered the last claim
	since                   time.Time // when reachable last changed
	won, busy, late, failed uint64
	take                    map[int]uint64            // per cluster: the count of its hold decisions, which a resume read in flight must match
	fetched                 map[int]bool              // per cluster: its resume read is in, meshHold may spawn it
	held                    map[int]bool              // clusters whose resume state this host writes behind
	pushed                  map[int]mesh.ResumePushed // per shard: what was last handed to the writer
}

// openMeshDiscord opens the mesh's Discord buckets (refusing, with
// mesh.ErrDiscordMismatch, a host whose identify_spacing or resume_max_age
// differ from the mesh's) and settles the budget: this host's /gateway/bot
// answer, unless another host's newer one is there; without an answer, the
// mesh's. Part of joining: ctx bounds it.
func (m *Manager) openMeshDiscord(ctx context.Context, st *mesh.Store) (*meshDiscord, error) {
	d := m.cfg.Discord
	store, err := mesh.OpenDiscord(ctx, st, m.cfg.Mesh.Name, mesh.DiscordSettings{
		Spacing: d.IdentifySpacing.Duration, ResumeMaxAge: d.ResumeMaxAge.Duration,
	})
	if err != nil {
		return nil, err
	}
	var rec mesh.BudgetRecord
	found := false
	if bs := m.disc.budget.State(time.Now()); bs.Known {
		obs := mesh.RecordOf(bs)
		obs.MaxConcurrency = m.disc.gate.MaxConcurrency()
		rec, err = store.ObserveBudget(ctx, obs)
		found = true
	} else {
		rec, found, err = store.Budget(ctx)
	}
	if err != nil {
		return nil, err
	}
	if found {
		m.disc.budget.Restore(rec.State())
		m.budgetChanged(time.Now())
		m.meshBuckets(rec.MaxConcurrency)
	}
	return &meshDiscord{
		store: store, floor: d.BudgetFloor, spacing: d.IdentifySpacing.Duration,
		hold: mesh.IdentifyHold(d.IdentifySpacing.Duration), window: mesh.GrantWindow(d.IdentifySpacing.Duration),
		maxAge: d.ResumeMaxAge.Duration, flush: st.Timing.Renew, log: m.log,
		reachable: true, since: time.Now(),
		take: map[int]uint64{}, fetched: map[int]bool{}, held: map[int]bool{}, pushed: map[int]mesh.ResumePushed{},
	}, nil
}

// meshBuckets settles the gate's bucket count with the mesh's, n (0: not
// known): a host with no count of its own (no /gateway/bot answer, no
// discord.max_concurrency) takes it; one whose count differs says so, since
// the shared gate then spaces the wrong shards.
func (m *Manager) meshBuckets(n int) {
	mine := m.disc.gate.MaxConcurrency()
	switch {
	case n <= 0 || n == mine:
	case m.cfg.Discord.MaxConcurrency == 0 && m.disc.gateway == nil:
		m.disc.gate.SetMaxConcurrency(n)
		m.log.Info("mesh: identify buckets as the mesh's budget says", "max_concurrency", n)
	default:
		m.log.Warn("mesh: this host's identify bucket count differs from the mesh's: two hosts may identify shards of one bucket too close together; set discord.max_concurrency alike on every host",
			"max_concurrency", mine, "mesh", n)
	}
}

// start starts the resume writer; me is this boot, named in its grants.
func (md *meshDiscord) start(me mesh.Holder) {
	md.me = me
	md.ctx, md.cancel = context.WithCancel(context.Background())
	md.writer = newResumeWriter(md.store, md.log)
	md.wg.Go(func() { md.writer.run(md.flush) })
}

// stop ends the requests in flight and lets the writer write what it has
// (at most md.flush), before the agent releases the leases: a host that
// takes a cluster over then reads the sessions its QUIESCED reported.
func (md *meshDiscord) stop() {
	md.cancel()
	md.writer.stop()
	md.wg.Wait()
}

// goRequest runs fn on a goroutine of its own, with the context stop ends.
func (md *meshDiscord) goRequest(fn func(ctx context.Context)) {
	md.wg.Go(func() { fn(md.ctx) })
}

// claimResult is the shared gate's answer to a claim of a bucket's slot.
type claimResult struct {
	id     discord.ClaimID
	reason discord.Reason // of the request that headed the bucket when claimed
	// Exactly one of the three: another host's grant holds the slot, the
	// slot was won (then spent says whether the budget answered), or the
	// gate could not be asked (err; claimed says if the slot was won first).
	busy    *mesh.BusyError
	claimed bool
	claim   mesh.IdentifyClaim
	spent   bool
	spend   mesh.Spend
	err     error
}

// claim asks the shared gate for bucket's slot, for a grant to shard, and
// spends one start for reason if it is won.
func (md *meshDiscord) claim(ctx context.Context, id discord.ClaimID, bucket, shard int, reason discord.Reason) claimResult {
	r := claimResult{id: id, reason: reason}
	cl, err := md.store.ClaimIdentify(ctx, bucket, md.me, shard)
	if errors.As(err, &r.busy) {
		return r
	}
	if err != nil {
		r.err = err
		return r
	}
	r.claimed, r.claim = true, cl
	r.spend, r.err = md.store.SpendBudget(ctx, r.reason, md.floor)
	r.spent = r.err == nil // a spend that timed out may have been stored: it is not refunded
	return r
}

// meshGateDue is gateDue in a mesh: each bucket whose slot is due is
// claimed from the shared gate; the grant comes with the answer.
func (m *Manager) meshGateDue() {
	md := m.mesh.disc
	now := time.Now()
	for _, c := range m.disc.gate.Claims(now) {
		id, bucket, shard, reason := c.ID, c.Bucket, c.Head.Shard, c.Head.Meta.p.reason
		md.goRequest(func(ctx context.Context) { m.post(evIdentifyClaimed{r: md.claim(ctx, id, bucket, shard, reason)}) })
	}
	m.armGate(now)
}

// claimHead is what decideClaim needs of the request that heads a claimed
// bucket when the answer comes.
type claimHead struct {
	ok       bool // somebody waits in the bucket (and the claim is still out)
	reason   discord.Reason
	stopping bool // its process is being stopped: its shard must not connect
}

type claimAction int

const (
	claimRetry  claimAction = iota // no grant: the bucket claims again at retry
	claimGrant                     // grant the head; the bucket is free again at free
	claimRefuse                    // budget_refused to the head, with why
	claimForbid                    // forbidden to the head (stopping)
)

// claimOutcome is decideClaim's answer: what to do with the bucket and its
// head, and what to give back to the mesh.
type claimOutcome struct {
	action  claimAction
	retry   time.Time // claimRetry: when the bucket may claim again
	free    time.Time // otherwise: when the bucket may grant again
	why     string    // claimRefuse
	release bool      // give the slot back (nothing was granted in it)
	refund  bool      // give the start back (spent, not granted)
	late    bool      // the slot was won past the grant window
}

// decideClaim decides what a claim's answer r means for the bucket's head h
// at now. A slot is used only by a grant made within the grant window of
// the claim's send (else two grants on two hosts could be closer than the
// spacing); one not used is released and its start refunded. The head may
// have changed since the claim: it is checked against the budget as the
// spend found it (Before), with this host's floor.
func decideClaim(r claimResult, h claimHead, now time.Time, floor int, spacing, hold, window time.Duration) claimOutcome {
	undo := func(o claimOutcome) claimOutcome {
		o.release = r.claimed
		o.refund = r.spent && r.spend.Allowed && r.spend.Known
		return o
	}
	switch {
	case r.err != nil:
		return undo(claimOutcome{action: claimRetry, retry: now.Add(claimRetryOnError)})
	case r.busy != nil:
		return claimOutcome{action: claimRetry, retry: r.busy.Retry}
	case !h.ok:
		return undo(claimOutcome{action: claimRetry, retry: now})
	}
	allowed, why := true, ""
	if r.spend.Known {
		b := discord.Budget{Floor: floor}
		b.Restore(r.spend.Before.State())
		allowed, why = b.Allow(h.reason, now)
	}
	switch {
	case !r.spend.Allowed && h.reason == r.reason:
		return undo(claimOutcome{action: claimRefuse, free: now, why: r.spend.Why})
	case !allowed:
		return undo(claimOutcome{action: claimRefuse, free: now, why: why})
	case !r.spend.Allowed:
		// The budget refused the request the claim was for, and would take
		// the one there now: claim again for it.
		return undo(claimOutcome{action: claimRetry, retry: now})
	case now.Sub(r.claim.Sent) > window:
		return undo(claimOutcome{action: claimRetry, retry: now, late: true})
	case h.stopping:
		return undo(claimOutcome{action: claimForbid, free: now})
	}
	free := now.Add(spacing)
	if f := r.claim.Sent.Add(hold); f.After(free) {
		free = f // the mesh keeps the grant that long: no use claiming sooner
	}
	return claimOutcome{action: claimGrant, free: free}
}

// identifyClaimed acts on the shared gate's answer to a claim.
func (m *Manager) identifyClaimed(r claimResult) {
	md := m.mesh.disc
	now := time.Now()
	g, ok := m.disc.gate.ClaimHead(r.id)
	h := claimHead{ok: ok}
	if ok {
		h.reason, h.stopping = g.Meta.p.reason, !g.Meta.p.state().Before(supervise.StateQuiescing)
	}
	o := decideClaim(r, h, now, md.floor, md.spacing, md.hold, md.window)
	if md.count(r, o, now) {
		m.feedDiscordDirty = true
	}
	if o.action == claimRetry {
		m.disc.gate.Lost(r.id, o.retry)
	} else if g, ok := m.disc.gate.Won(r.id, now, o.free); !ok {
		o.release, o.refund = r.claimed, r.spent && r.spend.Allowed && r.spend.Known // cannot be: ClaimHead just said there is a head
	} else {
		req := g.Meta
		req.timer.Stop()
		delete(req.p.identWaiting, req.shard)
		switch o.action {
		case claimGrant:
			m.disc.granted++
			m.metrics.identifyGranted.Inc()
			req.c.reply(req.id, grantPayload(g))
		case claimRefuse:
			m.metrics.identifyRefused.Inc()
			req.c.replyErr(req.id, ipc.CodeBudgetRefused, "%s", o.why)
		case claimForbid:
			req.c.replyErr(req.id, ipc.CodeForbidden, "the process is being stopped")
		}
	}
	if o.release || o.refund {
		md.goRequest(func(ctx context.Context) { md.undo(ctx, r, o) })
	}
	if r.spent && r.spend.Known {
		rec := r.spend.Before // the refund brings the mesh's count back to about this
		if o.action == claimGrant {
			rec = r.spend.After
		}
		m.disc.budget.Restore(rec.State())
		m.budgetChanged(now)
	}
	m.armGate(now)
}

// count keeps the shared gate's counters and its reachability, logging a
// change of the latter once; it reports whether that changed.
func (md *meshDiscord) count(r claimResult, o claimOutcome, now time.Time) bool {
	switch {
	case r.err != nil:
		md.failed++
	case r.busy != nil:
		md.busy++
	default:
		md.won++
		if o.late {
			md.late++
			md.log.Info("mesh: an identify slot was won too late to grant in; given back", "late_by", now.Sub(r.claim.Sent)-md.window)
		}
	}
	reachable := r.err == nil
	if reachable == md.reachable {
		return false
	}
	md.reachable, md.since = reachable, now
	if reachable {
		md.log.Info("mesh: the shared identify gate answers again: identifies are granted")
	} else {
		md.log.Warn("mesh: the shared identify gate cannot be asked: no identify is granted until it answers", "err", r.err)
	}
	return true
}

// undo gives back what a claim won and did not use.
func (md *meshDiscord) undo(ctx context.Context, r claimResult, o claimOutcome) {
	if o.release {
		if err := md.store.ReleaseIdentify(ctx, r.claim); err != nil {
			md.log.Debug("mesh: identify slot not released; it expires by itself", "err", err)
		}
	}
	if o.refund {
		if err := md.store.RefundBudget(ctx, r.spend); err != nil {
			md.log.Warn("mesh: a session start spent for an identify not granted was not given back", "err", err)
		}
	}
}

// MeshGateStatus is the shared identify gate in STATUS's discord object, in
// a mesh only.
type MeshGateStatus struct {
	// Reachable: the shared gate answered this host's last claim. While it
	// is false this host grants no identify; it asks again every 250 ms.
	Reachable bool      `json:"reachable"`
	Since     time.Time `json:"since"` // when Reachable last changed
	// ClaimsWon counts bucket slots this host won; ClaimsBusy the claims
	// that found another host's grant; ClaimsLate the slots won too late
	// to grant in (past the grant window), given back; ClaimsFailed the
	// claims the gate did not answer.
	ClaimsWon    uint64 `json:"claims_won"`
	ClaimsBusy   uint64 `json:"claims_busy"`
	ClaimsLate   uint64 `json:"claims_late"`
	ClaimsFailed uint64 `json:"claims_failed"`
	// GrantWindowMS and HoldMS are the shared gate's timing
	// (docs/multihost.md): a slot won is granted within the window of its
	// claim, and kept from other hosts for the hold.
	GrantWindowMS int64 `json:"grant_window_ms"`
	HoldMS        int64 `json:"hold_ms"`
}

func (m *Manager) meshGateStatus() *MeshGateStatus {
	if m.mesh == nil || m.mesh.disc == nil {
		return nil
	}
	md := m.mesh.disc
	return &MeshGateStatus{Reachable: md.reachable, Since: md.since, ClaimsWon: md.won, ClaimsBusy: md.busy,
		ClaimsLate: md.late, ClaimsFailed: md.failed, GrantWindowMS: md.window.Milliseconds(), HoldMS: md.hold.Milliseconds()}
}

// resumeFirst is meshHold's hook: a cluster this host just took is spawned
// only once its shards' resume state is read from the mesh (so that it
// RESUMEs the sessions of the host that ran it before); meshHold is called
// again when it is (resumeFetched). It reports whether meshHold must wait.
// Any hold decision makes a read still in flight moot.
func (m *Manager) resumeFirst(c int, held bool) bool {
	md := m.mesh.disc
	if held && md.fetched[c] {
		delete(md.fetched, c)
		md.held[c] = true
		return false
	}
	md.take[c]++
	delete(md.fetched, c)
	s := m.table().slots[c]
	if !held {
		if md.held[c] {
			delete(md.held, c)
			md.writer.drop(s.first, s.last)
			for sh := s.first; sh <= s.last; sh++ {
				delete(md.pushed, sh)
			}
		}
		return false
	}
	seq, first, last := md.take[c], s.first, s.last
	md.goRequest(func(ctx context.Context) {
		entries, err := md.store.Resume(ctx, first, last)
		m.post(evMeshResume{cluster: c, seq: seq, entries: entries, err: err})
	})
	return true
}

// resumeFetched takes the resume state read for cluster c's take: the
// newest of each shard's entries wins (discord.ResumeStore.Merge), and the
// writer writes the shards behind from the revisions read. A read that
// failed leaves the shards to this host's own store (a RESUME Discord
// refuses costs one round trip before the IDENTIFY).
func (m *Manager) resumeFetched(ev evMeshResume) {
	md := m.mesh.disc
	if md.take[ev.cluster] != ev.seq {
		return // let go, or taken again, since
	}
	s := m.table().slots[ev.cluster]
	if ev.err != nil {
		m.log.Warn("mesh: resume state of a cluster taken over not read: its shards identify unless this host has their sessions",
			"cluster", ev.cluster, "err", ev.err)
		md.writer.hold(s.first, s.last, nil)
	} else {
		now := time.Now()
		states := make([]discord.ResumeState, 0, len(ev.entries))
		for _, e := range ev.entries {
			states = append(states, e.State)
			md.pushed[e.State.Shard] = mesh.ResumePushed{State: e.State, At: now}
		}
		n := m.disc.resume.Merge(states)
		md.writer.hold(s.first, s.last, ev.entries)
		m.log.Info("mesh: resume state of a cluster taken over", "cluster", ev.cluster, "entries", len(ev.entries), "adopted", n)
	}
	md.fetched[ev.cluster] = true
	m.meshHold(ev.cluster, true, nil)
}

// meshResumeBehind hands the writer the resume state that is due (see
// mesh.ResumeDue) of every cluster this host holds, or with p only of p's:
// called once a second, and at p's QUIESCED.
func (m *Manager) meshResumeBehind(p *proc) {
	if m.mesh == nil || m.mesh.disc == nil || m.mesh.disc.writer == nil {
		return
	}
	md := m.mesh.disc
	now := time.Now()
	push := func(s *slot) {
		for _, st := range m.disc.resume.Get(s.first, s.last, s.topo.Total, now) {
			last, ok := md.pushed[st.Shard]
			if mesh.ResumeDue(last, ok, st, now, md.maxAge) {
				md.pushed[st.Shard] = mesh.ResumePushed{State: st, At: now}
				md.writer.put(st)
			}
		}
	}
	t := m.table()
	if p != nil {
		if c := p.slot.id; md.held[c] && c < len(t.slots) && t.slots[c] == p.slot {
			push(p.slot)
		}
		return
	}
	for c := range md.held {
		if c < len(t.slots) {
			push(t.slots[c])
		}
	}
}

// resumeWriter writes resume state behind to the mesh, off the loop: the
// latest entry per shard waits in pending, and one goroutine writes what is
// there, a few at a time. Each shard is written at the revision this host
// read or last wrote; a conflict means another host wrote it (it runs the
// shard now), and the shard is not written again until this host takes its
// cluster again.
type resumeWriter struct {
	store *mesh.DiscordStore
	log   *slog.Logger
	wake  chan struct{}
	quit  chan struct{}

	mu      sync.Mutex // guards the fields below
	pending map[int]discord.ResumeState
	shards  map[int]*shardWrite // the shards this host may write
}

// shardWrite is one writable shard's revision.
type shardWrite struct {
	rev   uint64
	known bool // rev is the entry's as last read or written (0: none)
	lost  bool // another host wrote it: not written again
}

// writeParallel bounds the writes in flight at once.
const writeParallel = 16

func newResumeWriter(store *mesh.DiscordStore, log *slog.Logger) *resumeWriter {
	return &resumeWriter{store: store, log: log, wake: make(chan struct{}, 1), quit: make(chan struct{}),
		pending: map[int]discord.ResumeState{}, shards: map[int]*shardWrite{}}
}

// hold makes shards first..last writable, from the entries read (nil: not
// read, so each is read before its first write).
func (w *resumeWriter) hold(first, last int, read map[int]mesh.ResumeEntry) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for s := first; s <= last; s++ {
		sw := &shardWrite{known: read != nil}
		if e, ok := read[s]; ok {
			sw.rev = e.Rev
		}
		w.shards[s] = sw
	}
}

// drop makes shards first..last unwritable and forgets what waits for them:
// this host let their cluster go.
func (w *resumeWriter) drop(first, last int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for s := first; s <= last; s++ {
		delete(w.shards, s)
		delete(w.pending, s)
	}
}

// put queues st, replacing what waits for its shard, if the shard is
// writable.
func (w *resumeWriter) put(st discord.ResumeState) {
	w.mu.Lock()
	if sw := w.shards[st.Shard]; sw == nil || sw.lost {
		w.mu.Unlock()
		return
	}
	w.pending[st.Shard] = st
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// stop makes run write what waits and return.
func (w *resumeWriter) stop() { close(w.quit) }

// run writes until stop, then writes what waits, within flush.
func (w *resumeWriter) run(flush time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for {
		select {
		case <-w.wake:
			w.writePending(ctx)
		case <-w.quit:
			fctx, fcancel := context.WithTimeout(ctx, flush)
			w.writePending(fctx)
			fcancel()
			return
		}
	}
}

// writePending writes what waits, a few shards at a time.
func (w *resumeWriter) writePending(ctx context.Context) {
	w.mu.Lock()
	batch := w.pending
	w.pending = map[int]discord.ResumeState{}
	w.mu.Unlock()
	var g errgroup.Group
	g.SetLimit(writeParallel)
	for _, st := range batch {
		g.Go(func() error {
			w.write(ctx, st)
			return nil
		})
	}
	_ = g.Wait()
}

func (w *resumeWriter) write(ctx context.Context, st discord.ResumeState) {
	w.mu.Lock()
	sw := w.shards[st.Shard]
	if sw == nil || sw.lost {
		w.mu.Unlock()
		return
	}
	rev, known := sw.rev, sw.known
	w.mu.Unlock()
	if !known {
		read, err := w.store.Resume(ctx, st.Shard, st.Shard)
		if err != nil {
			w.log.Debug("mesh: resume state not written behind", "shard", st.Shard, "err", err)
			return
		}
		rev = read[st.Shard].Rev
	}
	n, err := w.store.PutResume(ctx, st, rev)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.shards[st.Shard] != sw {
		return // dropped, or held anew, meanwhile
	}
	switch {
	case err == nil:
		sw.rev, sw.known = n, true
	case errors.Is(err, mesh.ErrConflict):
		sw.lost = true
		w.log.Info("mesh: another host wrote a shard's resume state: this host no longer writes it", "shard", st.Shard)
	default:
		sw.known = false // stored or not: read before the next write
		w.log.Debug("mesh: resume state not written behind", "shard", st.Shard, "err", err)
	}
}
