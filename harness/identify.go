package harness

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"time"

	"github.com/sm-supervisor/sm/discord"
	"github.com/sm-supervisor/sm/ipc"
)

// identifyGrace is how much longer than the timeout_ms it sends the harness
// waits for an IDENTIFY reply, so that the manager's own timeout answer
// normally arrives first and no slot is granted to a request given up on.
const identifyGrace = 5 * time.Second

// grant is the payload of the manager's REPLY to IDENTIFY:
// {"granted":true,"shard":n,"bucket":b}.
type grant struct {
	Granted bool `json:"granted"`
	Shard   *int `json:"shard"`
	Bucket  int  `json:"bucket"`
}

// parseGrant reads an IDENTIFY reply payload.
func parseGrant(payload json.RawMessage) (grant, error) {
	var g grant
	if len(payload) == 0 {
		return g, errors.New("no payload")
	}
	err := json.Unmarshal(payload, &g)
	return g, err
}

// grants reports whether g lets shard identify: granted, and for that shard
// (a reply that names no shard is taken at its word).
func (g grant) grants(shard int) bool {
	return g.Granted && (g.Shard == nil || *g.Shard == shard)
}

// connectShards opens the gateway sessions of the first goal shards, in
// shard order and one after another: RESUME when the REGISTER reply handed
// over the shard's session, else IDENTIFY (asking the manager's gate first
// when it has one); then --connect-delay; then the shard is up and goes to
// the loop on up. It returns when done or when ctx ends.
func (s *sim) connectShards(ctx context.Context, goal int, up chan<- shardSession) {
	for i := range goal {
		sess, ok := s.openSession(ctx, s.env.ShardFirst+i)
		if !ok || !sleepCtx(ctx, s.opts.ConnectDelay) {
			return
		}
		select {
		case up <- sess:
		case <-ctx.Done():
			return
		}
	}
}

// regView is the connector's copy of simRegistration.
type regView struct {
	seq     uint64
	gate    bool
	resume  map[int]discord.ResumeState
	changed <-chan struct{}
}

// awaitRegistration returns the latest registration, waiting for the first:
// before it the harness cannot know whether to resume or to ask the gate.
func (s *sim) awaitRegistration(ctx context.Context) (regView, bool) {
	for {
		s.mu.Lock()
		r := regView{seq: s.reg.seq, gate: s.reg.gate, resume: s.reg.resume, changed: s.reg.changed}
		s.mu.Unlock()
		if r.seq > 0 {
			return r, true
		}
		select {
		case <-r.changed:
		case <-ctx.Done():
			return regView{}, false
		}
	}
}

// openSession decides how shard gets its session and, for an IDENTIFY behind
// the gate, waits for the grant. Each ask is decided afresh from the latest
// registration: a manager restart may hand over resume state, or have no gate.
func (s *sim) openSession(ctx context.Context, shard int) (shardSession, bool) {
	refused := false // the budget governor refused this shard at least once
	for {
		reg, ok := s.awaitRegistration(ctx)
		if !ok {
			return shardSession{}, false
		}
		if st, ok := reg.resume[shard]; ok {
			s.log.Info("resuming shard: no identify needed", "shard", shard, "seq", st.Seq)
			return shardSession{resumed: true, sessionID: st.SessionID, seq: st.Seq, resumeURL: st.ResumeURL}, true
		}
		if !reg.gate {
			return newSession(shard), true
		}
		granted := s.askIdentify(ctx, shard, reg, &refused)
		if ctx.Err() != nil {
			return shardSession{}, false
		}
		if granted {
			return newSession(shard), true
		}
	}
}

// askIdentify asks the manager's gate once for a slot for shard. When the
// answer is no grant it has already waited as long as the answer asks for
// (or until a new registration), and the caller decides again.
func (s *sim) askIdentify(ctx context.Context, shard int, reg regView, refused *bool) bool {
	asked := time.Now()
	rctx, cancel := context.WithTimeout(ctx, s.opts.IdentifyTimeout+identifyGrace)
	reply, err := s.client.Request(rctx, &ipc.Frame{
		Op:        ipc.OpIdentify,
		Shard:     ipc.Int(shard),
		TimeoutMS: s.opts.IdentifyTimeout.Milliseconds(),
	})
	cancel()
	if ctx.Err() != nil {
		return false
	}
	log := s.log.With("shard", shard)
	if err == nil {
		g, perr := parseGrant(reply.Payload)
		if perr == nil && g.grants(shard) {
			s.setBudgetHeld(false)
			log.Info("identify granted", "bucket", g.Bucket, "waited", time.Since(asked).Round(time.Millisecond))
			return true
		}
		log.Warn("the IDENTIFY reply is no grant for this shard: asking again", "payload", reply.Payload, "err", perr, "retry", s.opts.IdentifyRetry)
		s.pause(ctx, reg.changed, s.opts.IdentifyRetry)
		return false
	}
	switch code := ipc.CodeOf(err); code {
	case ipc.CodeBudgetRefused, ipc.CodeForbidden:
		// budget_refused is the governor's word. A manager older than that
		// code said forbidden for it too; today's says forbidden only to a
		// process it is stopping, whose shard must stay down as well.
		s.setBudgetHeld(true)
		level := log.Warn
		if *refused {
			level = log.Debug
		}
		*refused = true
		level("the manager refused the identify: the shard stays down", "code", code, "err", err, "retry", s.opts.IdentifyRetry)
		s.pause(ctx, reg.changed, s.opts.IdentifyRetry)
	case ipc.CodeCancelled:
		// Withdrawn by an IDENTIFY_CANCEL (not one of the simulated bot's
		// own, which sends none): ask again.
		log.Info("the identify was withdrawn: asking again", "err", err)
		s.pause(ctx, reg.changed, s.opts.IdentifyRetry)
	case ipc.CodeTimeout:
		log.Info("no identify slot in time: asking again", "waited", time.Since(asked).Round(time.Millisecond))
		s.pause(ctx, reg.changed, s.opts.IdentifyRetry-time.Since(asked))
	case ipc.CodeUnknownTarget, ipc.CodeUnknownOp:
		log.Warn("the manager has no identify gate: identifying without asking", "err", err)
		s.mu.Lock()
		if s.reg.seq == reg.seq {
			s.reg.gate = false // until the next registration says otherwise
		}
		s.mu.Unlock()
	case ipc.CodeUnavailable, ipc.CodeShuttingDown:
		// The manager went away: ask the next one (a new registration ends
		// the pause at once).
		log.Debug("the manager is unavailable: asking again once registered", "err", err)
		s.pause(ctx, reg.changed, s.opts.IdentifyRetry)
	default:
		log.Warn("the identify gate failed: asking again", "err", err, "retry", s.opts.IdentifyRetry)
		s.pause(ctx, reg.changed, s.opts.IdentifyRetry)
	}
	return false
}

// setBudgetHeld marks whether the next shard is held down by the governor.
func (s *sim) setBudgetHeld(held bool) {
	s.mu.Lock()
	s.st.budgetHeld = held
	s.mu.Unlock()
}

// pause waits d, or less if a new registration comes (changed closes) or ctx
// ends.
func (s *sim) pause(ctx context.Context, changed <-chan struct{}, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-changed:
	case <-ctx.Done():
	}
}

// sleepCtx waits d unless ctx ends first, reporting whether it waited it all.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// newSession is the session an IDENTIFY opens for shard: a fresh session id
// (32 hex digits, as Discord's) and the READY event's sequence number, 1.
func newSession(shard int) shardSession {
	var b [16]byte
	rand.Read(b[:]) // never fails (crypto/rand, Go 1.24+)
	return shardSession{sessionID: hex.EncodeToString(b[:]), seq: 1, resumeURL: simResumeURL(shard)}
}
