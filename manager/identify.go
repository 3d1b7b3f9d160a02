package manager

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/sm-supervisor/sm/discord"
	"github.com/sm-supervisor/sm/ipc"
	"github.com/sm-supervisor/sm/supervise"
)

// The identify gate, the session-start budget and resume state: what keeps a
// crash loop from spending Discord's daily identify budget (docs/discord.md).
// All of it is loop-owned.

// identReq is one cluster's IDENTIFY waiting for its slot.
type identReq struct {
	c      *conn
	p      *proc
	id     string
	ticket discord.Ticket
	timer  *time.Timer
	shard  int
}

// discordState is the manager's view of Discord's limits.
type discordState struct {
	gate      *discord.Gate[*identReq]
	gateTimer *time.Timer
	budget    discord.Budget
	blocking  bool // the budget refuses restarts: logged once per change
	gateway   *discord.GatewayBot
	granted   uint64

	resume      *discord.ResumeStore
	resumeSaved uint64 // the store version last written
}

func (m *Manager) initDiscord(gw *discord.GatewayBot) {
	d := &m.disc
	d.budget.Floor = m.cfg.Discord.BudgetFloor
	d.resume = discord.NewResumeStore(m.cfg.Discord.ResumeMaxAge.Duration)
	d.gate = discord.NewGate[*identReq](m.maxConcurrency(gw), m.cfg.Discord.IdentifySpacing.Duration)
	if gw != nil {
		m.observeGateway(*gw)
	}
}

// maxConcurrency is the number of identify buckets: configured, else
// Discord's answer, else 1.
func (m *Manager) maxConcurrency(gw *discord.GatewayBot) int {
	switch {
	case m.cfg.Discord.MaxConcurrency > 0:
		return m.cfg.Discord.MaxConcurrency
	case gw != nil && gw.SessionStartLimit.MaxConcurrency > 0:
		return gw.SessionStartLimit.MaxConcurrency
	default:
		return 1
	}
}

// observeGateway takes a fresh /gateway/bot answer: the budget's count and
// the bucket count, and reports a changed shard recommendation.
func (m *Manager) observeGateway(gw discord.GatewayBot) {
	d := &m.disc
	if prev := d.gateway; prev != nil && prev.TotalShards() != gw.TotalShards() {
		m.log.Warn("Discord's recommended shard count changed; a DEPLOY with total_shards = \"auto\" applies it",
			"was", prev.TotalShards(), "now", gw.TotalShards(), "running", m.Topology().Total)
	}
	d.gateway = &gw
	d.budget.Observe(gw.SessionStartLimit, gw.Fetched)
	d.gate.SetMaxConcurrency(m.maxConcurrency(&gw))
	m.budgetChanged(time.Now())
}

// budgetChanged logs, loudly and once, when the governor starts or stops
// refusing restarts.
func (m *Manager) budgetChanged(now time.Time) {
	d := &m.disc
	st := d.budget.State(now)
	if st.Blocking != d.blocking {
		d.blocking = st.Blocking
		if st.Blocking {
			m.log.Error("IDENTIFY BUDGET BELOW FLOOR: crash-looping clusters will not be granted identifies until Discord's reset",
				"remaining", st.Remaining, "floor", st.Floor, "reset_at", st.ResetAt)
		} else {
			m.log.Info("identify budget above floor again", "remaining", st.Remaining)
		}
	}
	m.feedDiscordDirty = true
}

// identify handles an IDENTIFY from a cluster. The REPLY comes when its slot
// is due, or at once with budget_refused, forbidden, bad_frame, busy, or
// later with timeout or cancelled.
func (m *Manager) identify(c *conn, f *ipc.Frame) {
	now := time.Now()
	p := c.proc
	switch {
	case p == nil:
		c.replyErr(f.ID, ipc.CodeForbidden, "IDENTIFY is for cluster connections")
		return
	case f.ID == "":
		c.replyErr("", ipc.CodeBadFrame, "IDENTIFY needs an id: its REPLY is the grant")
		return
	case f.Shard == nil || *f.Shard < p.slot.first || *f.Shard > p.slot.last:
		c.replyErr(f.ID, ipc.CodeBadFrame, "IDENTIFY needs a shard of this cluster (%d-%d)", p.slot.first, p.slot.last)
		return
	case !p.state().Before(supervise.StateQuiescing):
		c.replyErr(f.ID, ipc.CodeForbidden, "the process is being stopped")
		return
	case p.identWaiting[*f.Shard]:
		// One ask per shard at a time: a bot that asks again before its
		// grant would otherwise spend the budget twice.
		c.replyErr(f.ID, ipc.CodeBusy, "an IDENTIFY for shard %d is already waiting", *f.Shard)
		return
	}
	if ok, why := m.disc.budget.Allow(p.reason, now); !ok {
		m.metrics.identifyRefused.Inc()
		c.replyErr(f.ID, ipc.CodeBudgetRefused, "%s", why)
		return
	}
	r := &identReq{c: c, p: p, id: f.ID, shard: *f.Shard}
	t, err := m.disc.gate.Ask(r.shard, now, r)
	if err != nil {
		c.replyErr(f.ID, ipc.CodeBadFrame, "%v", err)
		return
	}
	r.ticket = t
	if p.identWaiting == nil {
		p.identWaiting = map[int]bool{}
	}
	p.identWaiting[r.shard] = true
	timeout := m.cfg.Discord.IdentifyTimeout.Duration
	if f.TimeoutMS > 0 {
		timeout = min(timeout, time.Duration(f.TimeoutMS)*time.Millisecond)
	}
	r.timer = time.AfterFunc(timeout, func() { m.post(evIdentifyExpire{r: r}) })
	m.armGate(now)
}

// identifyExpired is r's deadline: withdrawn from the gate, it times out.
func (m *Manager) identifyExpired(r *identReq) {
	if m.disc.gate.Cancel(r.ticket) {
		delete(r.p.identWaiting, r.shard)
		r.c.replyErr(r.id, ipc.CodeTimeout, "no identify slot for shard %d within the deadline", r.shard)
		m.armGate(time.Now())
	}
}

// identifyCancel handles an IDENTIFY_CANCEL: it withdraws the sending
// process's waiting asks for a shard, so that a library that gave up waiting
// spends no session start. Each withdrawn IDENTIFY gets its one REPLY,
// cancelled; the IDENTIFY_CANCEL's REPLY counts them. A grant that came
// first was spent: 0 withdrawn.
func (m *Manager) identifyCancel(c *conn, f *ipc.Frame) {
	p := c.proc
	switch {
	case p == nil:
		c.replyErr(f.ID, ipc.CodeForbidden, "IDENTIFY_CANCEL is for cluster connections")
		return
	case f.Shard == nil || *f.Shard < p.slot.first || *f.Shard > p.slot.last:
		c.replyErr(f.ID, ipc.CodeBadFrame, "IDENTIFY_CANCEL needs a shard of this cluster (%d-%d)", p.slot.first, p.slot.last)
		return
	}
	shard := *f.Shard
	withdrawn := m.disc.gate.CancelIf(func(g discord.Grant[*identReq]) bool { return g.Meta.p == p && g.Shard == shard })
	for _, g := range withdrawn {
		r := g.Meta
		r.timer.Stop()
		delete(p.identWaiting, shard)
		r.c.replyErr(r.id, ipc.CodeCancelled, "the IDENTIFY for shard %d was withdrawn by IDENTIFY_CANCEL", shard)
	}
	if len(withdrawn) > 0 {
		m.armGate(time.Now())
	}
	c.reply(f.ID, fmt.Appendf(nil, `{"withdrawn":%d}`, len(withdrawn)))
}

// gateDue grants the slots that are due: each one checked against the
// budget again (it may have run low while the request waited) and spent.
// In a mesh the slots are claimed from the shared gate first.
func (m *Manager) gateDue() {
	if m.mesh != nil {
		m.meshGateDue()
		return
	}
	now := time.Now()
	for _, g := range m.disc.gate.Due(now) {
		r := g.Meta
		r.timer.Stop()
		delete(r.p.identWaiting, r.shard)
		if !r.p.state().Before(supervise.StateQuiescing) {
			// Told to stop while it waited: its shard must not connect now.
			r.c.replyErr(r.id, ipc.CodeForbidden, "the process is being stopped")
			continue
		}
		if ok, why := m.disc.budget.Allow(r.p.reason, now); !ok {
			m.metrics.identifyRefused.Inc()
			r.c.replyErr(r.id, ipc.CodeBudgetRefused, "%s", why)
			continue
		}
		m.disc.budget.Spend(now)
		m.disc.granted++
		m.metrics.identifyGranted.Inc()
		r.c.reply(r.id, grantPayload(g))
	}
	m.budgetChanged(now)
	m.armGate(now)
}

// grantPayload is an IDENTIFY's REPLY payload for grant g.
func grantPayload(g discord.Grant[*identReq]) []byte {
	return fmt.Appendf(nil, `{"granted":true,"shard":%d,"bucket":%d}`, g.Shard, g.Bucket)
}

// armGate sets the timer for the gate's next due slot.
func (m *Manager) armGate(now time.Time) {
	d := &m.disc
	next, ok := d.gate.Next()
	if !ok {
		if d.gateTimer != nil {
			d.gateTimer.Stop()
		}
		return
	}
	wait := max(0, next.Sub(now))
	if d.gateTimer == nil {
		d.gateTimer = time.AfterFunc(wait, func() { m.post(evGateDue{}) })
		return
	}
	d.gateTimer.Reset(wait)
}

// cancelIdentifies drops the waiting IDENTIFYs of a process that is gone:
// nobody is left to answer, and their places go to the next waiters.
func (m *Manager) cancelIdentifies(p *proc) {
	dropped := m.disc.gate.CancelIf(func(g discord.Grant[*identReq]) bool { return g.Meta.p == p })
	for _, g := range dropped {
		g.Meta.timer.Stop()
	}
	p.identWaiting = nil
	if len(dropped) > 0 {
		m.armGate(time.Now())
	}
}

// takeResume records the resume state a cluster reported on HEARTBEAT or
// QUIESCED, for the shards it owns. Only a cluster's own process counts: a
// deploy's new generation, not yet serving, must not overwrite the sessions
// of the process that is.
func (m *Manager) takeResume(p *proc, raw json.RawMessage, now time.Time) {
	if len(raw) == 0 || !m.reportsResume(p) {
		return
	}
	if err := m.disc.resume.UpdateJSON(raw, p.slot.first, p.slot.last, p.slot.topo.Total, now); err != nil {
		m.log.Debug("resume state refused", "cluster", p.cluster, "err", err)
	}
}

// reportsResume reports whether p's resume state is its cluster's: p is the
// routed process, or, while none is routed (a replacement connecting its
// shards), the cluster's supervised one. After a deploy's switch that is the
// new generation, never the old one closing its sessions.
func (m *Manager) reportsResume(p *proc) bool {
	if m.routedNow(p) {
		return true
	}
	t := m.table()
	return p.cluster < len(t.slots) && t.slots[p.cluster] == p.slot && t.procs[p.cluster] == nil && p.isCurrent()
}

// resumeFor is what a process's REGISTER reply hands it: the latest resume
// state of its shards under its topology's shard count, unless it is a
// deploy's new generation (which must open sessions of its own while the old
// process still holds these) or not its cluster's process (a survivor the
// restarted manager will quiesce: the serving process holds the sessions).
func (m *Manager) resumeFor(p *proc, now time.Time) []discord.ResumeState {
	if p.resumes {
		return m.disc.resume.Get(p.slot.first, p.slot.last, p.slot.topo.Total, now)
	}
	if p.reason == discord.ReasonDeploy || !p.isCurrent() {
		return nil
	}
	return m.disc.resume.Get(p.slot.first, p.slot.last, p.slot.topo.Total, now)
}

// registerFields adds to a cluster's REGISTER reply what a library needs to
// open its shards' sessions: how the process was started, its resume state,
// and the gateway information it would otherwise fetch from /gateway/bot.
func (m *Manager) registerFields(reply map[string]any, p *proc) {
	now := time.Now()
	reply["start"] = startOf(p.reason)
	rs := m.resumeFor(p, now)
	if len(rs) > 0 {
		reply["resume"] = rs
	}
	if gw := m.gatewayFor(p, len(rs), now); gw != nil {
		reply["gateway"] = gw
	}
}

// gatewayInfo is GET /gateway/bot's answer as the manager gives it to one
// process, in Discord's own shape so a library can take it verbatim.
type gatewayInfo struct {
	URL string `json:"url"`
	// Shards is the shard count in force (the topology), not Discord's
	// recommendation: what the process must connect with.
	Shards            int              `json:"shards"`
	SessionStartLimit sessionStartInfo `json:"session_start_limit"`
}

type sessionStartInfo struct {
	Total int `json:"total"`
	// Remaining is what the governor would grant this process, plus the
	// shards it is handed resume state for: those RESUME and spend nothing,
	// and a library that refuses to start with fewer session starts than
	// shards must not refuse a process that will resume them.
	Remaining int `json:"remaining"`
	// ResetAfter is in milliseconds from the reply; 0 when unknown.
	ResetAfter     int64 `json:"reset_after"`
	MaxConcurrency int   `json:"max_concurrency"`
}

// gatewayFor is p's gateway information, nil without an answer from Discord
// (no token), when the manager has nothing true to say.
func (m *Manager) gatewayFor(p *proc, resumed int, now time.Time) *gatewayInfo {
	d := &m.disc
	if d.gateway == nil {
		return nil
	}
	grantable, _ := d.budget.Grantable(p.reason, now)
	st := d.budget.State(now)
	var resetAfter int64
	if !st.ResetAt.IsZero() {
		resetAfter = max(0, st.ResetAt.Sub(now).Milliseconds())
	}
	return &gatewayInfo{
		URL:    d.gateway.URL,
		Shards: p.slot.topo.Total,
		SessionStartLimit: sessionStartInfo{
			Total:          st.Total,
			Remaining:      grantable + resumed,
			ResetAfter:     resetAfter,
			MaxConcurrency: d.gate.MaxConcurrency(),
		},
	}
}

const resumeFileName = "resume-state.json"

// saveResume writes the resume store behind, when it changed.
func (m *Manager) saveResume() {
	m.meshResumeBehind(nil)
	d := &m.disc
	d.resume.Prune(time.Now()) // nothing older than resume_max_age is worth keeping
	if m.cfg.State.Dir == "" || d.resume.Version() == d.resumeSaved {
		return
	}
	d.resumeSaved = d.resume.Version()
	b, err := d.resume.Marshal()
	if err == nil {
		err = writeAtomic(filepath.Join(m.cfg.State.Dir, resumeFileName), b)
	}
	if err != nil {
		m.log.Error("cannot write resume state", "err", err)
	}
}

func (m *Manager) loadResume() {
	if m.cfg.State.Dir == "" {
		return
	}
	b, err := os.ReadFile(filepath.Join(m.cfg.State.Dir, resumeFileName))
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	if err == nil {
		err = m.disc.resume.Unmarshal(b)
	}
	if err != nil {
		m.log.Warn("ignoring resume state file", "err", err)
		return
	}
	m.disc.resumeSaved = m.disc.resume.Version()
}

// DiscordStatus is the Discord part of Status. It never holds the token.
type DiscordStatus struct {
	RecommendedShards int                 `json:"recommended_shards,omitempty"`
	MaxConcurrency    int                 `json:"max_concurrency"`
	IdentifySpacingMS int64               `json:"identify_spacing_ms"`
	IdentifyWaiting   int                 `json:"identify_waiting"`
	IdentifyGranted   uint64              `json:"identify_granted"`
	Budget            discord.BudgetState `json:"budget"`
	// Mesh is the shared identify gate, in a mesh only (docs/multihost.md).
	Mesh *MeshGateStatus `json:"mesh,omitempty"`
}

func (m *Manager) discordStatus(now time.Time) *DiscordStatus {
	d := &m.disc
	ds := &DiscordStatus{
		MaxConcurrency:    d.gate.MaxConcurrency(),
		IdentifySpacingMS: d.gate.Spacing().Milliseconds(),
		IdentifyWaiting:   d.gate.Len(),
		IdentifyGranted:   d.granted,
		Budget:            d.budget.State(now),
		Mesh:              m.meshGateStatus(),
	}
	if d.gateway != nil {
		ds.RecommendedShards = d.gateway.TotalShards()
	}
	return ds
}
