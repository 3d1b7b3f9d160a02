// Package manager is sm-manager's core: it serves the Unix socket protocol,
// spawns and supervises one process per cluster, and routes business ops
// between registered connections.
//
// One goroutine, the event loop, owns every cluster's supervision state; reader
// goroutines (one per connection) post events to it. The request hot path does
// not go through the loop: it reads a routing table the loop publishes
// atomically and completes requests through a mutex-guarded pending table.
package manager

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sm-supervisor/sm/backoff"
	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/discord"
	"github.com/sm-supervisor/sm/generation"
	"github.com/sm-supervisor/sm/ipc"
	"github.com/sm-supervisor/sm/supervise"
)

// Options are a Manager's collaborators; only Config is required.
type Options struct {
	Config *config.Config
	// Spawner starts cluster processes (default supervise.ExecSpawner).
	Spawner supervise.Spawner
	// Logger receives structured logs (default: discard).
	Logger *slog.Logger
	// Rand returns uniform numbers in [0, 1) for backoff jitter.
	Rand func() float64
	// Registry receives the manager's Prometheus metrics; nil keeps them unexported.
	Registry prometheus.Registerer
	// Gateway is Discord's /gateway/bot answer at start, if a token is
	// configured: it sizes the identify gate and the session-start budget.
	Gateway *discord.GatewayBot
	// FetchGateway asks /gateway/bot again, at each DEPLOY (nil: never).
	FetchGateway func(ctx context.Context) (discord.GatewayBot, error)
}

// Manager supervises the clusters of one bot and routes their messages.
type Manager struct {
	cfg     *config.Config
	spawner supervise.Spawner
	log     *slog.Logger
	rules   supervise.Rules // what every cluster's supervision judges by
	connOpt ipc.Options
	uids    map[int]bool

	// routes is the routing table in force, with the slots of its topology.
	routes atomic.Pointer[routeTable]

	events chan event
	done   chan struct{} // closed when Run has finished with the event loop

	procSeq atomic.Uint64
	// liveProcs is len(m.procs), for the accept loop's connection limit;
	// clients counts the connections registered as clients, which
	// limits.max_connections bounds.
	liveProcs, clients atomic.Int64
	reqSeq             atomic.Uint64
	connSeq            atomic.Uint64

	// Lock order. proc.sendMu (read for a send, write for QUIESCE) is taken
	// before pmu and before a connection's queue lock (ipc.Conn's); cmu
	// before a connection's queue lock (to refuse it). slot.mu is held with
	// no other lock but other slots' (all of the old table's in switchTable,
	// in cluster order); pmu, beatBox.mu, hub.mu, Subscription.mu and
	// router.fmu with none at all. A function whose name ends in Locked is called with the
	// lock guarding what it touches held: pmu for the pending table and the
	// deadline list, slot.mu for a slot's waiting requests.

	pmu     sync.Mutex          // guards pending and dl
	pending map[uint64]*pending // forwarded requests by the id the cluster sees
	dl      deadlines           // forwarded requests' deadlines, oldest first (deadline.go)

	cmu      sync.Mutex // guards conns
	conns    map[*conn]struct{}
	connWG   sync.WaitGroup
	stopping atomic.Bool // set once shutdown starts: new requests are refused

	// Loop-owned.
	procs     map[uint64]*proc   // every process not yet confirmed exited
	specs     map[int64]spec     // what each generation runs
	gen       int64              // the newest generation
	stopWG    sync.WaitGroup     // goroutines stopping processes
	dep       *generation.Deploy // the running or last deploy
	depLogged *generation.Deploy // the deploy whose end was logged
	next      *routeTable        // the table a re-clustering deploy is building
	// exitHeld: exits a resume-handoff deploy hears of once the process's
	// connection is read to its end (exit.go).
	exitHeld map[*proc][]*generation.Deploy

	metrics          *metrics
	mesh             *meshState // nil on a single host (mesh.go)
	router           *router    // cross-host routing; nil on a single host (meshroute.go)
	disc             discordState
	handoff          handoffs  // QUIESCED handoffs for the next ACTIVATE (handoff.go)
	rec              recycling // memory and lag recycling (recycle.go)
	feedDiscordDirty bool
	discLast         []byte
	fetchGateway     func(ctx context.Context) (discord.GatewayBot, error)
	reshard          *ReshardStatus // the [reshard] schedule's state; nil when off (reshard.go)
	feed             hub            // the state feed's subscribers
	dirty            []*slot        // clusters whose state changed during this loop event
	depPublished     *generation.Deploy
	depPublishedDone bool
	depLast          []byte
	// depFed: the deploy was fed an event (its status can change only
	// then) since flushFeed last looked at it.
	depFed bool

	restarted  bool      // a state file was found: this manager replaced one that died
	started    time.Time // when Run started
	stateDirty bool      // the state file is behind
	stateSaved time.Time
	// resumeSavedAt is when resume state was last considered for writing.
	resumeSavedAt time.Time
}

// New validates opts and returns a manager ready to Run. With [mesh] set it
// also connects to the mesh's NATS server and opens its buckets, and fails
// if it cannot (docs/multihost.md); Run closes that connection when it
// returns, so a manager New returned must be Run.
func New(opts Options) (*Manager, error) {
	cfg := opts.Config
	if cfg == nil {
		return nil, errors.New("manager: no config")
	}
	sp, err := specOf(cfg)
	if err != nil {
		return nil, fmt.Errorf("manager: %w", err)
	}
	m := &Manager{
		cfg:     cfg,
		specs:   map[int64]spec{1: sp},
		gen:     1,
		handoff: newHandoffs(),
		rec:     newRecycling(cfg.Recycle),
		spawner: opts.Spawner,
		log:     opts.Logger,
		rules: supervise.Rules{
			Policy: supervise.RestartPolicy{
				Backoff: backoff.Policy{
					Min:    cfg.Restart.BackoffMin.Duration,
					Max:    cfg.Restart.BackoffMax.Duration,
					Jitter: cfg.Restart.Jitter,
				},
				Intensity: cfg.Restart.Intensity,
				Period:    cfg.Restart.Period.Duration,
			},
			StartTimeout:     cfg.Heartbeat.StartTimeout.Duration,
			HeartbeatTimeout: cfg.Heartbeat.Timeout.Duration,
			// Bounded everywhere, not only in deploys: a process that never
			// exits after QUIESCE is stopped.
			QuiesceTimeout:  cfg.Deploy.QuiesceTimeout.Duration,
			DisconnectGrace: disconnectGrace,
			Rand:            opts.Rand,
		},
		connOpt: ipc.Options{
			MaxFrameBytes: cfg.Limits.MaxFrameBytes,
			MaxQueue:      cfg.Limits.MaxQueue,
			MaxQueueBytes: cfg.Limits.MaxQueueBytes,
			WriteTimeout:  cfg.Limits.WriteTimeout.Duration,
		},
		uids:     allowedUIDs(cfg.AllowedUIDs),
		events:   make(chan event, 1024),
		done:     make(chan struct{}),
		pending:  make(map[uint64]*pending),
		conns:    make(map[*conn]struct{}),
		procs:    make(map[uint64]*proc),
		exitHeld: map[*proc][]*generation.Deploy{},
		feed:     hub{subs: make(map[*Subscription]struct{}), max: cfg.Limits.MaxSubscribers},
	}
	if m.spawner == nil {
		m.spawner = supervise.ExecSpawner{}
	}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	if m.rules.Rand == nil {
		m.rules.Rand = rand.Float64
	}
	topo := cfg.Topology.Generation()
	if err := topo.Validate(); err != nil {
		return nil, fmt.Errorf("manager: %w", err)
	}
	m.routes.Store(newRouteTable(topo, 1, &m.rules))
	m.metrics = newMetrics(opts.Registry, m)
	m.fetchGateway = opts.FetchGateway
	m.initDiscord(opts.Gateway)
	if cfg.Mesh.Enabled() {
		if err := m.joinMesh(); err != nil {
			return nil, fmt.Errorf("manager: %w", err)
		}
	}
	return m, nil
}

// spec is what a generation's processes run.
type spec struct {
	argv []string
	env  []string
	dir  string
}

// CheckConfig applies to cfg the rule a DEPLOY applies to the file it reads
// (refused with bad_config), for sm-manager -check: the cluster command must
// resolve (see supervise.ResolveCommand) to a file this process may execute.
// A manager starts on a config that breaks it, as before: its spawns fail,
// and say so in STATUS, so that a command on a mount not there yet is no
// reason to leave re-adopted clusters unsupervised.
func CheckConfig(cfg *config.Config) error {
	sp, err := specOf(cfg)
	if err != nil {
		return err
	}
	if err := supervise.CheckExecutable(sp.argv[0]); err != nil {
		return fmt.Errorf("cluster.command: %w", err)
	}
	return nil
}

// specOf resolves the cluster command of cfg.
func specOf(cfg *config.Config) (spec, error) {
	base := "."
	if cfg.Path != "" {
		base = filepath.Dir(cfg.Path)
	}
	argv, err := supervise.ResolveCommand(cfg.Cluster.Command, base)
	if err != nil {
		return spec{}, fmt.Errorf("cluster.command: %w", err)
	}
	sp := spec{argv: argv, dir: cfg.Cluster.Dir}
	for k, v := range cfg.Cluster.Env {
		sp.env = append(sp.env, k+"="+v)
	}
	return sp, nil
}

// allowedUIDs is the set of peer uids the socket accepts: the configured list,
// or the manager's own uid when none is configured. Root is always allowed.
func allowedUIDs(list []int) map[int]bool {
	set := map[int]bool{0: true}
	if len(list) == 0 {
		set[os.Getuid()] = true
	}
	for _, u := range list {
		set[u] = true
	}
	return set
}

// Run spawns every cluster, serves ln until ctx is cancelled, then quiesces and
// stops every cluster (bounded by shutdown.timeout) and returns. A cancelled
// context is a clean stop and returns nil.
func (m *Manager) Run(ctx context.Context, ln net.Listener) error {
	acceptDone := make(chan struct{})
	go func() {
		defer close(acceptDone)
		m.accept(ln)
	}()
	m.started = time.Now()
	m.loadResume()
	m.restore()
	stopMesh := func(release bool) {}
	if m.mesh != nil {
		stopMesh = m.runMesh() // before Ensure: only held clusters spawn
	}
	now := time.Now()
	for _, s := range m.table().slots {
		m.do(s, s.sup.Ensure(now))
	}
	m.maybeSaveState(time.Now())
	waitReshard := m.runReshard(ctx)
	m.loop(ctx)
	waitReshard()
	m.stopping.Store(true)
	ln.Close()
	<-acceptDone
	m.shutdown()
	if len(m.procs) == 0 {
		m.removeState()
	} else {
		m.stateDirty = true
		m.maybeSaveState(time.Now().Add(stateSaveEvery))
	}
	close(m.done)
	m.feed.closeAll()
	// Answered before the connections close, so the answers go out.
	m.failAllPending()
	m.closeConns()
	m.connWG.Wait()
	m.stopWG.Wait()
	m.failAllPending() // anything a reader added meanwhile
	// Last: the leases are released once their processes are gone, and
	// renewed until then. A process the kernel never confirmed gone (stuck
	// past SIGKILL) keeps its lease unreleased: it expires a lease later.
	stopMesh(len(m.procs) == 0)
	return nil
}

// loop is the event loop: it owns supervision state until ctx is cancelled.
func (m *Manager) loop(ctx context.Context) {
	tick := time.NewTicker(m.tickEvery())
	defer tick.Stop()
	for {
		select {
		case ev := <-m.events:
			m.metrics.loopEvents.Inc()
			m.apply(ev)
		case now := <-tick.C:
			m.drainBeats()
			m.checkHeartbeats(now)
			m.deploys(func(d *generation.Deploy) {
				if !d.Done() {
					d.Tick()
				}
			})
			m.recycleTick(now)
		case <-ctx.Done():
			return
		}
		m.deployProgress()
		m.recycleProgress()
		m.flushFeed()
		m.maybeSaveState(time.Now())
	}
}

func (m *Manager) tickEvery() time.Duration {
	return max(m.cfg.Heartbeat.Interval.Duration/2, 10*time.Millisecond)
}

// disconnectGrace is how long a disconnected process may take to be seen
// exiting before it is stopped as a live one that lost its connection: a
// process that died closes its socket a moment before the kernel's exit
// notice reaches the loop.
const disconnectGrace = 100 * time.Millisecond

func (m *Manager) accept(ln net.Listener) {
	for {
		nc, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			m.log.Error("accept failed", "err", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		c, ok := m.addConn(nc)
		if !ok {
			continue
		}
		go func() {
			defer m.connWG.Done()
			m.serve(c)
		}()
	}
}

func (m *Manager) addConn(nc net.Conn) (*conn, bool) {
	c := &conn{id: m.connSeq.Add(1), c: ipc.NewConn(nc, m.connOpt)}
	m.cmu.Lock()
	defer m.cmu.Unlock()
	if m.stopping.Load() {
		c.refuse(ipc.CodeShuttingDown, "manager is shutting down")
		return nil, false
	}
	// Each supervised process is owed a connection on top of the limit, so
	// a large fleet never locks its own clusters (or a deploy's new
	// generation) out. This bounds connections not yet registered too; the
	// clients among them are held to the limit at REGISTER.
	if len(m.conns) >= m.cfg.Limits.MaxConnections+int(m.liveProcs.Load()) {
		m.log.Warn("connection refused: limits.max_connections reached", "conn", c.id)
		c.refuse(ipc.CodeBusy, "too many connections (limits.max_connections)")
		return nil, false
	}
	m.conns[c] = struct{}{}
	m.connWG.Add(1)
	return c, true
}

func (m *Manager) removeConn(c *conn) {
	m.cmu.Lock()
	delete(m.conns, c)
	m.cmu.Unlock()
}

func (m *Manager) closeConns() {
	m.cmu.Lock()
	defer m.cmu.Unlock()
	for c := range m.conns {
		c.c.Close()
	}
}

// Topology returns the shard topology in force.
func (m *Manager) Topology() generation.Topology { return m.table().topo }

func (m *Manager) table() *routeTable { return m.routes.Load() }
