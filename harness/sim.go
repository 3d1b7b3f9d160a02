package harness

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"runtime/debug"
	"sync"
	"time"

	"github.com/sm-supervisor/sm/discord"
	"github.com/sm-supervisor/sm/internal/activations"
	"github.com/sm-supervisor/sm/ipc"
)

// sim is the simulated bot. One loop goroutine owns the timers (heartbeats,
// gateway events, injected failures, shutdown) and applies each shard's
// connection; the connector goroutine opens the shards' sessions (asking the
// identify gate), and it, the client's goroutines and one goroutine per
// business op share simState and simRegistration under mu.
type sim struct {
	env   Env
	opts  SimOptions
	log   *slog.Logger
	now   func() time.Time
	start time.Time
	pid   int

	client     *ipc.Client
	registered chan Registration // the latest REGISTER reply, for the loop
	quiesce    chan struct{}     // closed by the first QUIESCE
	closeOnce  sync.Once

	opCtx  context.Context     // cancelled when the sim stops: cuts --op-delay short
	record *activations.Writer // --record; nil without
	host   string              // the record's host: SM_HOST_ID, else the hostname
	ops    sync.WaitGroup      // business ops in flight; Add only under mu while !quiescing

	mu  sync.Mutex
	st  simState
	reg simRegistration
	// ballast is what sim.grow allocated, held so that it stays resident.
	ballast [][]byte
}

// simRegistration is what the latest REGISTER reply says about opening
// gateway sessions, for the shard connector.
type simRegistration struct {
	seq     uint64 // registrations so far: 0 until the first
	gate    bool   // ask the identify gate before identifying
	resume  map[int]discord.ResumeState
	changed chan struct{} // closed by the next registration
}

// runSim runs the simulated bot until it has quiesced, crashed on purpose, its
// registration is refused or ctx is done.
func runSim(ctx context.Context, cfg Config) error {
	opCtx, cancelOps := context.WithCancel(context.Background())
	s := &sim{
		env:        cfg.Env,
		opts:       cfg.Sim,
		log:        cfg.Logger,
		now:        cfg.Now,
		start:      cfg.Now(),
		pid:        os.Getpid(),
		registered: make(chan Registration, 1),
		quiesce:    make(chan struct{}),
		opCtx:      opCtx,
		reg:        simRegistration{changed: make(chan struct{})},
	}
	if cfg.Sim.Record != "" {
		w, err := activations.Create(cfg.Sim.Record)
		if err != nil {
			cancelOps()
			return err
		}
		defer w.Close()
		s.record, s.host = w, cfg.Env.Host
		if s.host == "" {
			s.host, _ = os.Hostname()
		}
	}
	s.client = newClient(cfg, cfg.Logger, s.handle, s.registeredWith)

	clientCtx, stopClient := context.WithCancel(ctx)
	clientDone := make(chan struct{})
	var clientErr error
	go func() { clientErr = s.client.Run(clientCtx); close(clientDone) }()

	err := s.loop(ctx, cfg, clientDone, &clientErr)

	// Refuse new ops before waiting for the old: Add must not race Wait.
	s.mu.Lock()
	s.st.quiescing = true
	s.mu.Unlock()
	cancelOps()
	s.ops.Wait()
	stopClient()
	<-clientDone
	s.note(activations.Exit)
	return err
}

// note appends event to the --record file, if any.
func (s *sim) note(event string) {
	if s.record == nil {
		return
	}
	err := s.record.Append(activations.Record{Host: s.host, Cluster: s.env.Cluster, Generation: s.env.Generation,
		PID: s.pid, Event: event, UnixNano: time.Now().UnixNano()})
	if err != nil {
		s.log.Error("record not written", "event", event, "err", err)
	}
}

// loop is the bot's life, one timer or message at a time.
func (s *sim) loop(ctx context.Context, cfg Config, clientDone <-chan struct{}, clientErr *error) error {
	n := s.env.Shards()
	goal := connectGoal(n, s.opts.FailReady)

	heartbeat := time.NewTicker(s.opts.HeartbeatInterval)
	defer heartbeat.Stop()
	// The connector opens the shards' sessions one after another and hands
	// each to the loop once connected; it stops when the bot quiesces or hangs.
	up := make(chan shardSession)
	connectCtx, stopConnecting := context.WithCancel(ctx)
	var connector sync.WaitGroup
	connector.Go(func() { s.connectShards(connectCtx, goal, up) })
	defer func() { stopConnecting(); connector.Wait() }()
	var events <-chan time.Time
	if s.opts.EventInterval > 0 {
		ticker := time.NewTicker(s.opts.EventInterval)
		defer ticker.Stop()
		events = ticker.C
	}
	crash := after(s.opts.CrashAfter)
	hang := after(s.opts.HangAfter)

	quiesce := s.quiesce
	var (
		drained  chan struct{}    // closed once in-flight ops are done, while quiescing
		deadline <-chan time.Time // bound on the drain after a signal
	)
	startQuiesce := func(why string, bounded bool) {
		if drained == nil {
			s.mu.Lock()
			s.st.quiescing = true
			inFlight := s.st.inFlight
			s.mu.Unlock()
			s.log.Info("quiescing: refusing new ops, finishing in-flight ones", "why", why, "in_flight", inFlight)
			stopConnecting() // a leaving process opens no more sessions
			d := make(chan struct{})
			go func() { s.ops.Wait(); close(d) }()
			drained = d
			quiesce = nil
		}
		if bounded && deadline == nil {
			deadline = time.After(cfg.ShutdownTimeout)
		}
	}

	for {
		select {
		case <-ctx.Done():
			return nil

		case <-clientDone:
			// With Reconnect set, the client ends before ctx only when refused.
			return *clientErr

		case reg := <-s.registered:
			heartbeat.Reset(reg.HeartbeatInterval(s.opts.HeartbeatInterval))
			s.heartbeat()

		case <-heartbeat.C:
			s.heartbeat()

		case sess := <-up:
			s.mu.Lock()
			s.st.shardUp(sess)
			connected := s.st.connected
			s.mu.Unlock()
			s.log.Debug("shard connected", "shard", s.env.ShardFirst+connected-1, "resumed", sess.resumed, "seq", sess.seq)
			if isReady(connected, n) {
				s.log.Info("all shards connected: ready", "shards", n)
				s.heartbeat() // at once, so a deploy need not wait an interval
			}

		case <-events:
			s.mu.Lock()
			if !s.st.hung {
				s.st.gatewayEvent(s.opts.EventBuffer)
			}
			s.mu.Unlock()

		case <-crash:
			s.log.Error("simulated crash (--crash-after)", "exit_code", CrashExitCode)
			return &ExitError{Code: CrashExitCode, Reason: "simulated crash (--crash-after)"}

		case <-hang:
			s.mu.Lock()
			s.st.hung = true
			s.mu.Unlock()
			s.log.Warn("simulated hang (--hang-after): no more heartbeats or answers")
			stopConnecting()
			hang = nil

		case <-quiesce:
			startQuiesce(ipc.OpQuiesce, false)

		case sig := <-cfg.Signals:
			s.mu.Lock()
			hung := s.st.hung
			s.mu.Unlock()
			switch {
			case hung:
				// A hung process cannot run its handler; the signal kills it.
				return &ExitError{Code: signalExitCode(sig), Reason: "hung process got " + sig.String()}
			case s.opts.IgnoreQuiesce:
				s.log.Warn("ignoring signal (--ignore-quiesce)", "signal", sig.String())
			default:
				startQuiesce(sig.String(), true)
			}

		case <-drained:
			st := s.snapshot()
			if err := sendAndFlush(s.client, &ipc.Frame{Op: ipc.OpQuiesced, Resume: s.resumeJSON(st)}); err != nil {
				s.log.Warn("QUIESCED may not have reached the manager", "err", err)
			}
			s.log.Info("quiesced: exiting")
			return nil

		case <-deadline:
			s.mu.Lock()
			inFlight := s.st.inFlight
			s.mu.Unlock()
			s.log.Warn("shutdown timeout: abandoning in-flight ops", "in_flight", inFlight, "timeout", cfg.ShutdownTimeout)
			return nil
		}
	}
}

// registeredWith is the client's OnConnect: it records what the REGISTER
// reply says about sessions for the connector and hands the reply to the loop.
func (s *sim) registeredWith(_ *ipc.Client, reply *ipc.Frame) {
	reg := logRegistration(s.log, s.env, reply)
	resume, problems := reg.Resumable(s.env)
	for _, p := range problems {
		s.log.Warn("ignored resume state from the manager", "problem", p)
	}
	if reg.Identify != nil {
		s.log.Info("the manager's identify gate", "gate", reg.Identify.Gate,
			"spacing_ms", reg.Identify.SpacingMS, "max_concurrency", reg.Identify.MaxConcurrency)
	}
	s.mu.Lock()
	s.reg.seq++
	s.reg.gate = reg.GateOn()
	s.reg.resume = resume
	close(s.reg.changed)
	s.reg.changed = make(chan struct{})
	// A restarted manager says active:true for a process its predecessor
	// recorded as activated. That record is made when the ACTIVATE is queued,
	// so a manager killed just then leaves a process that never read it and
	// would otherwise buffer dispatches for ever: the reply stands for it.
	flushed := int64(-1)
	if reg.Active != nil && *reg.Active {
		flushed = s.st.activate()
	}
	s.mu.Unlock()
	if flushed >= 0 {
		s.note(activations.Activate)
		s.log.Info("activated by the REGISTER reply (active:true): dispatching gateway events", "flushed", flushed)
	}
	offer(s.registered, reg)
}

// snapshot is a copy of the bot's state.
func (s *sim) snapshot() simState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st.snapshot()
}

// heartbeat sends HEARTBEAT with the current stats, unless the bot is hung.
func (s *sim) heartbeat() {
	st := s.snapshot()
	if st.hung {
		return
	}
	payload, err := json.Marshal(buildStats(s.env, st, s.now().Sub(s.start), memoryBytes()))
	if err != nil {
		s.log.Error("encode heartbeat", "err", err)
		return
	}
	f := &ipc.Frame{
		Op:      ipc.OpHeartbeat,
		Ready:   ipc.Bool(isReady(st.connected, s.env.Shards())),
		Resume:  s.resumeJSON(st),
		Payload: payload,
	}
	if err := s.client.Send(f); err != nil {
		s.log.Debug("heartbeat not sent", "err", err)
	}
}

// resumeJSON is the "resume" field for st: one entry per connected shard,
// nil (left out) with none.
func (s *sim) resumeJSON(st simState) json.RawMessage {
	states := st.resumeStates(s.env)
	if len(states) == 0 {
		return nil
	}
	b, err := json.Marshal(states)
	if err != nil {
		s.log.Error("encode resume state", "err", err)
		return nil
	}
	return b
}

// stats is the bot's current Stats.
func (s *sim) stats() Stats {
	return buildStats(s.env, s.snapshot(), s.now().Sub(s.start), memoryBytes())
}

// handle receives every frame from the manager on the client's read goroutine,
// so it never blocks: business ops run in their own goroutines.
func (s *sim) handle(c *ipc.Client, f *ipc.Frame) {
	s.mu.Lock()
	hung := s.st.hung
	s.mu.Unlock()
	if hung {
		return // a hung process reads nothing and answers nothing
	}
	switch f.Op {
	case ipc.OpReply:
		if g, err := parseGrant(f.Payload); err == nil && g.Granted {
			// The connector gave up on this IDENTIFY (its deadline passed)
			// just before the slot came: the slot is lost.
			s.log.Warn("dropped an identify grant that came after its request was given up", "id", f.ID, "payload", f.Payload)
			return
		}
		s.log.Debug("dropped a REPLY to no request of ours", "id", f.ID)
	case ipc.OpActivate:
		s.mu.Lock()
		flushed := s.st.activate()
		s.mu.Unlock()
		if flushed >= 0 {
			s.note(activations.Activate)
			s.log.Info("activated: dispatching gateway events", "flushed", flushed)
		}
	case ipc.OpQuiesce:
		if s.opts.IgnoreQuiesce {
			s.log.Warn("ignoring QUIESCE (--ignore-quiesce)")
			return
		}
		// Refuse at once: the next frame on this goroutine may be a new op.
		s.mu.Lock()
		s.st.quiescing = true
		s.mu.Unlock()
		s.closeOnce.Do(func() { close(s.quiesce) })
	case ipc.OpRegister, ipc.OpHeartbeat, ipc.OpQuiesced, ipc.OpDeploy, ipc.OpIdentify:
		s.reply(c, f, nil, ipc.Errorf(ipc.CodeUnknownOp, "%s is for the manager, not a cluster", f.Op))
	default:
		s.serve(c, f)
	}
}

// serve runs one business op, unless the bot is quiescing: in its own
// goroutine with --op-delay, on the reading goroutine without (an op with no
// delay cannot block, and a goroutine per request was a quarter of the
// harness's CPU under load: creating it, and growing its stack for the reply).
func (s *sim) serve(c *ipc.Client, f *ipc.Frame) {
	s.mu.Lock()
	if s.st.quiescing {
		s.mu.Unlock()
		s.reply(c, f, nil, ipc.Errorf(ipc.CodeUnavailable, "cluster %d generation %d is quiescing", s.env.Cluster, s.env.Generation))
		return
	}
	s.st.inFlight++
	s.ops.Add(1)
	s.mu.Unlock()
	if s.opts.OpDelay <= 0 {
		s.finish(c, f)
		return
	}
	go s.finish(c, f)
}

// finish does the op serve admitted and answers it.
func (s *sim) finish(c *ipc.Client, f *ipc.Frame) {
	defer s.ops.Done() // after the reply: QUIESCED must follow every reply
	payload, perr := s.work(f)
	s.mu.Lock()
	s.st.inFlight--
	s.st.requestsHandled++
	hung := s.st.hung
	s.mu.Unlock()
	if !hung {
		s.reply(c, f, payload, perr)
	}
}

// work is the op itself, taking --op-delay unless the bot is stopping.
func (s *sim) work(f *ipc.Frame) (json.RawMessage, *ipc.Error) {
	if s.opts.OpDelay > 0 {
		t := time.NewTimer(s.opts.OpDelay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-s.opCtx.Done():
			return nil, ipc.Errorf(ipc.CodeUnavailable, "cluster %d is shutting down", s.env.Cluster)
		}
	}
	switch f.Op {
	case OpSimGrow:
		return s.grow(f.Payload)
	case OpSimLag:
		return s.lag(f.Payload)
	}
	return answer(s.env, s.pid, f, s.stats)
}

// grow is sim.grow: allocate and touch the bytes asked for, or free all.
func (s *sim) grow(payload json.RawMessage) (json.RawMessage, *ipc.Error) {
	var req struct {
		Bytes *int64 `json:"bytes"`
	}
	if json.Unmarshal(payload, &req) != nil || req.Bytes == nil || *req.Bytes < 0 || *req.Bytes > maxGrowBytes {
		return nil, ipc.Errorf(CodeBadRequest, "sim.grow: payload must be {\"bytes\":N}, 0 <= N <= %d", maxGrowBytes)
	}
	var chunk []byte
	if n := *req.Bytes; n > 0 {
		chunk = make([]byte, n)
		for i := 0; i < len(chunk); i += 4096 {
			chunk[i] = 1 // a page never written is never resident
		}
	}
	s.mu.Lock()
	if chunk == nil {
		s.ballast = nil
	} else {
		s.ballast = append(s.ballast, chunk)
	}
	total := 0
	for _, b := range s.ballast {
		total += len(b)
	}
	s.mu.Unlock()
	if chunk == nil {
		debug.FreeOSMemory()
	}
	s.log.Info("sim.grow", "bytes", *req.Bytes, "ballast_bytes", total)
	return marshal(map[string]int{"ballast_bytes": total})
}

// lag is sim.lag: the event-loop lag the heartbeats report from now on.
func (s *sim) lag(payload json.RawMessage) (json.RawMessage, *ipc.Error) {
	var req struct {
		MS *int64 `json:"ms"`
	}
	if json.Unmarshal(payload, &req) != nil || req.MS == nil || *req.MS < 0 {
		return nil, ipc.Errorf(CodeBadRequest, "sim.lag: payload must be {\"ms\":N}, N >= 0")
	}
	s.mu.Lock()
	s.st.lagMS = *req.MS
	s.mu.Unlock()
	s.log.Info("sim.lag", "loop_lag_ms", *req.MS)
	return marshal(map[string]int64{"loop_lag_ms": *req.MS})
}

// reply answers f if it asked for an answer.
func (s *sim) reply(c *ipc.Client, f *ipc.Frame, payload json.RawMessage, perr *ipc.Error) {
	if err := c.Reply(f.ID, payload, perr); err != nil {
		s.log.Warn("reply not sent", "op", f.Op, "id", f.ID, "err", err)
	}
}

// after is time.After for d > 0, and a channel that never fires otherwise.
func after(d time.Duration) <-chan time.Time {
	if d <= 0 {
		return nil
	}
	return time.After(d)
}
