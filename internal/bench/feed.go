package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/coder/websocket"

	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/ipc"
)

// feedOptions shape the feed scenario: many subscribers on the manager's
// public status WebSocket while its clusters heartbeat. Zero fields take the
// defaults of defaultFeedOptions, except the binaries, which are required.
type feedOptions struct {
	ManagerBin string // sm-manager binary
	HarnessBin string // cluster-harness binary

	Clusters    int           // one-shard clusters, each heartbeating
	Subscribers int           // WebSockets on /ws, each read continuously
	Heartbeat   time.Duration // the manager's heartbeat.interval
	Warmup      time.Duration // after the last subscriber is connected, before the window
	Duration    time.Duration // the measured window
	IdleSample  time.Duration // the baseline: the manager with no subscriber
	Dialers     int           // WebSocket handshakes at once while connecting

	// ManagerCPUProfile, if set, is where the manager writes a CPU profile of
	// its whole life (its hidden -cpuprofile flag), for go tool pprof.
	ManagerCPUProfile string

	// Progress receives a line per step; nil discards them.
	Progress io.Writer
}

// defaultFeedOptions are the feed scenario's defaults (issue 4's benchmark).
var defaultFeedOptions = feedOptions{
	Clusters:    64,
	Subscribers: 1000,
	Heartbeat:   time.Second,
	Warmup:      3 * time.Second,
	Duration:    20 * time.Second,
	IdleSample:  5 * time.Second,
	Dialers:     16,
}

func (o feedOptions) withDefaults() feedOptions {
	d := defaultFeedOptions
	orDefault(&o.Clusters, d.Clusters)
	orDefault(&o.Subscribers, d.Subscribers)
	orDefault(&o.Heartbeat, d.Heartbeat)
	orDefault(&o.Warmup, d.Warmup)
	orDefault(&o.Duration, d.Duration)
	orDefault(&o.IdleSample, d.IdleSample)
	orDefault(&o.Dialers, d.Dialers)
	orDefaultIfZero(&o.Progress, io.Discard)
	return o
}

// feedReport is what the feed scenario measured.
type feedReport struct {
	Scenario    string  `json:"scenario"` // "feed"
	Clusters    int     `json:"clusters"`
	Subscribers int     `json:"subscribers"`
	HeartbeatMS int64   `json:"heartbeat_interval_ms"`
	ConnectS    float64 `json:"connect_s"` // first dial to the last subscriber's snapshot
	WindowS     float64 `json:"window_s"`

	// Messages counts every message the subscribers received inside the
	// window, Heartbeats the heartbeat events among them.
	Messages   uint64  `json:"messages"`
	Heartbeats uint64  `json:"heartbeats"`
	MsgPerS    float64 `json:"msg_per_s"`
	// ExpectedPerS is subscribers × clusters / heartbeat interval: what the
	// heartbeats alone should deliver.
	ExpectedPerS float64 `json:"expected_per_s"`
	// KeepingUp: at least 97% of ExpectedPerS was delivered. When not, the
	// subscribers and the manager together could not move every event on
	// this machine and the latency is that of a growing backlog (held in the
	// manager's feed buffers and both kernels' socket buffers).
	KeepingUp bool `json:"keeping_up"`
	// Heartbeat events each subscriber received inside the window, least and most.
	PerSubscriberMin uint64 `json:"per_subscriber_min"`
	PerSubscriberMax uint64 `json:"per_subscriber_max"`

	// Heartbeat-to-subscriber latency: a subscriber's receive time minus the
	// event's "at" (when the manager read the heartbeat), over every heartbeat
	// event every subscriber received inside the window.
	P50US  float64 `json:"p50_us"`
	P99US  float64 `json:"p99_us"`
	P999US float64 `json:"p999_us"`
	MaxUS  float64 `json:"max_us"`

	// Dropped counts subscribers the manager closed as too slow (1008);
	// ClosedEarly those whose feed ended otherwise before the run did;
	// BadMessages messages that were not a JSON event (or a first message
	// that was not the snapshot). All three must be zero.
	Dropped     uint64 `json:"dropped"`
	ClosedEarly uint64 `json:"closed_early"`
	BadMessages uint64 `json:"bad_messages"`
	FirstError  string `json:"first_error,omitempty"`

	// The manager with no subscriber (same run, before they connect) and
	// with all of them, inside the window. CPU is in percent of one core,
	// from /proc/<pid>/task/*/schedstat; RSS is VmRSS at the end of each, and
	// the peak of one-second samples inside the window.
	IdleCPUPercent     float64 `json:"idle_manager_cpu_percent"`
	IdleRSSKiB         int64   `json:"idle_manager_rss_kib"`
	ManagerCPUPercent  float64 `json:"manager_cpu_percent"`
	ManagerRSSKiB      int64   `json:"manager_rss_kib"`
	ManagerPeakRSSKiB  int64   `json:"manager_peak_rss_kib"`
	ManagerCPUUSPerMsg float64 `json:"manager_cpu_us_per_msg"` // (load − idle) CPU per message delivered
	// BenchCPUPercent is this process (the subscribers) inside the window;
	// OthersCPUPercent every other process on the machine but the manager.
	BenchCPUPercent  float64 `json:"bench_cpu_percent"`
	OthersCPUPercent float64 `json:"others_cpu_percent"`
}

// Broken describes what the run got wrong ("" when nothing): a drop, an
// early close, a bad message, or a subscriber that heard no heartbeat.
func (r *feedReport) Broken() string {
	var why []string
	if r.Dropped > 0 {
		why = append(why, fmt.Sprintf("%d subscribers dropped as too slow", r.Dropped))
	}
	if r.ClosedEarly > 0 {
		why = append(why, fmt.Sprintf("%d subscribers' feeds ended early (first: %s)", r.ClosedEarly, r.FirstError))
	}
	if r.BadMessages > 0 {
		why = append(why, fmt.Sprintf("%d bad messages (first: %s)", r.BadMessages, r.FirstError))
	}
	if r.Heartbeats == 0 || r.PerSubscriberMin == 0 {
		why = append(why, fmt.Sprintf("a subscriber received no heartbeat in the window (total %d)", r.Heartbeats))
	}
	return strings.Join(why, ", ")
}

// runFeed runs the feed scenario: a manager with o.Clusters heartbeating
// clusters, sampled idle, then o.Subscribers WebSockets on its status feed,
// each reading every event, for a warm-up and a measured window. It returns
// an error when a process or a connection fails; drops and early closes are in
// the report (see Broken).
func runFeed(ctx context.Context, o feedOptions) (rep *feedReport, err error) {
	o = o.withDefaults()
	if o.ManagerBin == "" || o.HarnessBin == "" {
		return nil, errors.New("feed: need the sm-manager and cluster-harness binaries")
	}
	sc, err := newScratch("sm-bench-feed-", "feed.log", "")
	if err != nil {
		return nil, err
	}
	defer func() { err = sc.close(err) }()

	addr, err := freeLoopbackAddr()
	if err != nil {
		return nil, err
	}
	cfg, err := managerConfig(sc.dir, o.Clusters, simHarness(o.HarnessBin))
	if err != nil {
		return nil, err
	}
	cfg.Status.Listen = addr
	cfg.Admin.Listen = ""
	cfg.Heartbeat.Interval = config.Duration{Duration: o.Heartbeat}
	cfg.Heartbeat.Timeout = config.Duration{Duration: max(cfg.Heartbeat.Timeout.Duration, 5*o.Heartbeat)}
	cfg.Limits.MaxSubscribers = max(cfg.Limits.MaxSubscribers, o.Subscribers+64)
	if err := cfg.Validate(); err != nil {
		return nil, err
	}

	fmt.Fprintf(o.Progress, "feed: starting sm-manager with %d clusters, heartbeat every %v, status feed on %s\n", o.Clusters, o.Heartbeat, addr)
	mgr, err := startAttached(ctx, o.ManagerBin, sc.dir, cfg, sc.log, cpuProfileFlags(o.ManagerCPUProfile)...)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, mgr.shutdown()) }()
	start := time.Now()
	if _, err := mgr.ready(ctx, ipc.TargetAll, readyTimeout(o.Clusters)); err != nil {
		return nil, err
	}
	fmt.Fprintf(o.Progress, "feed: %d clusters ready after %.1fs; idle baseline (no subscriber) for %v\n", o.Clusters, time.Since(start).Seconds(), o.IdleSample)

	rep = &feedReport{
		Scenario: "feed", Clusters: o.Clusters, Subscribers: o.Subscribers, HeartbeatMS: o.Heartbeat.Milliseconds(),
		ExpectedPerS: float64(o.Subscribers) * float64(o.Clusters) / o.Heartbeat.Seconds(),
	}
	if err := sleep(ctx, idleSettle); err != nil {
		return rep, err
	}
	idle, err := sampleManager(ctx, mgr.pid(), o.IdleSample)
	if err != nil {
		return rep, err
	}
	rep.IdleCPUPercent, rep.IdleRSSKiB = idle.cpuPercent(), idle.rssKiB

	run := newFeedRun(o.Subscribers)
	defer run.close()
	fmt.Fprintf(o.Progress, "feed: connecting %d subscribers to ws://%s/ws\n", o.Subscribers, addr)
	connectStart := time.Now()
	if err := run.connect(ctx, "ws://"+addr+"/ws", o.Dialers); err != nil {
		return rep, fmt.Errorf("feed: %w", mgr.proc.why(err))
	}
	rep.ConnectS = time.Since(connectStart).Seconds()
	fmt.Fprintf(o.Progress, "feed: %d subscribers connected in %.1fs; %v warm-up, then %v measured\n", o.Subscribers, rep.ConnectS, o.Warmup, o.Duration)

	open := time.Now().Add(o.Warmup)
	w := &feedWindow{open: open, end: open.Add(o.Duration)}
	run.window.Store(w)
	if err := sleep(ctx, time.Until(open)); err != nil {
		return rep, err
	}
	load, err := sampleManager(ctx, mgr.pid(), o.Duration)
	if err != nil {
		return rep, err
	}
	// Events received up to the window's end still count: give the readers
	// a moment to take what was on the wire, then stop them.
	if err := sleep(ctx, 100*time.Millisecond); err != nil {
		return rep, err
	}
	run.stop()

	rep.WindowS = w.end.Sub(w.open).Seconds()
	rep.ManagerCPUPercent, rep.ManagerRSSKiB, rep.ManagerPeakRSSKiB = load.cpuPercent(), load.rssKiB, load.peakRSSKiB
	rep.BenchCPUPercent, rep.OthersCPUPercent = load.benchPercent(), load.othersPercent()
	run.fill(rep)
	if rep.Messages > 0 {
		extra := (rep.ManagerCPUPercent - rep.IdleCPUPercent) / 100 * rep.WindowS
		rep.ManagerCPUUSPerMsg = max(0, extra*1e6/float64(rep.Messages))
	}
	return rep, nil
}

// feedWindow is the measured window; events received inside it are counted.
type feedWindow struct{ open, end time.Time }

func (w *feedWindow) holds(t time.Time) bool {
	return w != nil && !t.Before(w.open) && t.Before(w.end)
}

// feedRun is the subscribers of one run.
type feedRun struct {
	ctx    context.Context
	cancel context.CancelFunc
	hc     *http.Client
	window atomic.Pointer[feedWindow]
	subs   []*feedSub
	wg     sync.WaitGroup

	// Latencies go to a few histograms, each under its own lock, rather than
	// one per subscriber (a histogram is 58 KiB).
	hists [16]struct {
		sync.Mutex
		h histogram
	}

	mu       sync.Mutex
	firstErr string
}

// feedSub is one subscriber's counts; only its reader writes them until the
// run is stopped.
type feedSub struct {
	conn       *websocket.Conn
	messages   uint64 // inside the window
	heartbeats uint64 // inside the window
	bad        uint64
	dropped    bool
	closed     bool // ended before the run stopped it, not as too slow
}

func newFeedRun(n int) *feedRun {
	ctx, cancel := context.WithCancel(context.Background())
	return &feedRun{
		ctx: ctx, cancel: cancel, subs: make([]*feedSub, n),
		// Its own transport: the handshakes' connections are its, and nothing
		// is left idle in http.DefaultTransport afterwards.
		hc: &http.Client{Transport: &http.Transport{DisableCompression: true}},
	}
}

func (r *feedRun) noteErr(format string, args ...any) {
	r.mu.Lock()
	if r.firstErr == "" {
		r.firstErr = fmt.Sprintf(format, args...)
	}
	r.mu.Unlock()
}

// connect opens every subscriber, dialers at a time; each is connected once
// its snapshot has arrived, and is then read by a goroutine of its own.
func (r *feedRun) connect(ctx context.Context, url string, dialers int) error {
	next := make(chan int)
	errc := make(chan error, dialers)
	var wg sync.WaitGroup
	for range dialers {
		wg.Go(func() {
			for i := range next {
				if err := r.dial(ctx, url, i); err != nil {
					errc <- fmt.Errorf("subscriber %d: %w", i, err)
					return
				}
			}
		})
	}
	var err error
feed:
	for i := range r.subs {
		select {
		case next <- i:
		case err = <-errc:
			break feed
		case <-ctx.Done():
			err = ctx.Err()
			break feed
		}
	}
	close(next)
	wg.Wait()
	if err == nil {
		select {
		case err = <-errc:
		default:
		}
	}
	return err
}

func (r *feedRun) dial(ctx context.Context, url string, i int) error {
	dctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	c, resp, err := websocket.Dial(dctx, url, &websocket.DialOptions{HTTPClient: r.hc})
	if err != nil {
		if resp != nil {
			return fmt.Errorf("dial: HTTP %s: %w", resp.Status, err)
		}
		return fmt.Errorf("dial: %w", err)
	}
	c.SetReadLimit(16 << 20) // the snapshot of a big topology
	typ, msg, err := c.Read(dctx)
	if err == nil {
		var ev struct {
			Type string `json:"type"`
		}
		if typ != websocket.MessageText || json.Unmarshal(msg, &ev) != nil || ev.Type != "snapshot" {
			err = fmt.Errorf("first message is not a snapshot: %.120q", msg)
		}
	}
	if err != nil {
		c.CloseNow()
		return err
	}
	s := &feedSub{conn: c}
	r.subs[i] = s
	r.wg.Go(func() { r.read(s, i) })
	return nil
}

// heartbeatPrefix and atKey let the reader find a heartbeat's "at" without
// decoding the message (whose payload is the bot's, of any size): the
// manager writes the event's own fields first, in this order. Anything else
// is decoded with encoding/json.
var (
	heartbeatPrefix = []byte(`{"type":"heartbeat",`)
	atKey           = []byte(`,"at":"`)
)

// read reads s until the run stops or the feed ends.
func (r *feedRun) read(s *feedSub, i int) {
	var buf bytes.Buffer
	hist := &r.hists[i%len(r.hists)]
	for {
		// No context on the read: one would cost an AfterFunc per message.
		// stop ends the readers by closing their connections.
		typ, rd, err := s.conn.Reader(context.Background())
		if err == nil {
			buf.Reset()
			_, err = buf.ReadFrom(rd)
		}
		if err != nil {
			switch {
			case r.ctx.Err() != nil:
			case websocket.CloseStatus(err) == websocket.StatusPolicyViolation:
				s.dropped = true
				r.noteErr("subscriber %d dropped: %v", i, err)
			default:
				s.closed = true
				r.noteErr("subscriber %d: %v", i, err)
			}
			s.conn.CloseNow()
			return
		}
		now := time.Now()
		at, hb, ok := eventTime(buf.Bytes())
		if typ != websocket.MessageText || !ok {
			s.bad++
			r.noteErr("subscriber %d: bad message %.120q", i, buf.Bytes())
			continue
		}
		if !r.window.Load().holds(now) {
			continue
		}
		s.messages++
		if hb {
			s.heartbeats++
			hist.Lock()
			hist.h.Record(now.Sub(at))
			hist.Unlock()
		}
	}
}

// eventTime says whether msg is a heartbeat event and, if so, its "at". ok
// is false for a message that is not a JSON event.
func eventTime(msg []byte) (at time.Time, heartbeat, ok bool) {
	if bytes.HasPrefix(msg, heartbeatPrefix) {
		if i := bytes.Index(msg, atKey); i >= 0 {
			rest := msg[i+len(atKey):]
			if j := bytes.IndexByte(rest, '"'); j >= 0 {
				if t, err := time.Parse(time.RFC3339Nano, string(rest[:j])); err == nil {
					return t, true, true
				}
			}
		}
	}
	var ev struct {
		Type string    `json:"type"`
		At   time.Time `json:"at"`
	}
	if err := json.Unmarshal(msg, &ev); err != nil || ev.Type == "" {
		return time.Time{}, false, false
	}
	if ev.Type == "heartbeat" {
		return ev.At, true, !ev.At.IsZero()
	}
	return time.Time{}, false, true
}

// stop ends every reader and waits for them.
func (r *feedRun) stop() {
	r.cancel()
	for _, s := range r.subs {
		if s != nil {
			s.conn.CloseNow()
		}
	}
	r.wg.Wait()
}

// close stops the readers if they still run and lets the transport go.
func (r *feedRun) close() {
	r.stop()
	r.hc.CloseIdleConnections()
}

// fill adds the subscribers' counts to rep; the readers have stopped.
func (r *feedRun) fill(rep *feedReport) {
	var h histogram
	for i := range r.hists {
		h.Merge(&r.hists[i].h)
	}
	first := true
	for _, s := range r.subs {
		if s == nil {
			continue
		}
		rep.Messages += s.messages
		rep.Heartbeats += s.heartbeats
		rep.BadMessages += s.bad
		if s.dropped {
			rep.Dropped++
		}
		if s.closed {
			rep.ClosedEarly++
		}
		if first || s.heartbeats < rep.PerSubscriberMin {
			rep.PerSubscriberMin = s.heartbeats
		}
		rep.PerSubscriberMax = max(rep.PerSubscriberMax, s.heartbeats)
		first = false
	}
	if rep.WindowS > 0 {
		rep.MsgPerS = float64(rep.Messages) / rep.WindowS
	}
	rep.KeepingUp = rep.MsgPerS >= 0.97*rep.ExpectedPerS
	rep.P50US = micros(h.Quantile(0.50))
	rep.P99US = micros(h.Quantile(0.99))
	rep.P999US = micros(h.Quantile(0.999))
	rep.MaxUS = micros(h.Max())
	r.mu.Lock()
	rep.FirstError = r.firstErr
	r.mu.Unlock()
}

// WriteText prints the report for people.
func (r *feedReport) WriteText(w io.Writer) {
	fmt.Fprintf(w, "feed: %d subscribers on the status WebSocket, %d clusters heartbeating every %v; %.0fs window; %d CPUs (%s)\n\n",
		r.Subscribers, r.Clusters, time.Duration(r.HeartbeatMS)*time.Millisecond, r.WindowS, runtime.NumCPU(), cpuModel())
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "manager\tCPU % of one core\tRSS MiB\tpeak RSS MiB\t")
	fmt.Fprintf(tw, "idle, no subscriber\t%.2f\t%.1f\t-\t\n", r.IdleCPUPercent, mib(r.IdleRSSKiB))
	fmt.Fprintf(tw, "%d subscribers\t%.2f\t%.1f\t%.1f\t\n", r.Subscribers, r.ManagerCPUPercent, mib(r.ManagerRSSKiB), mib(r.ManagerPeakRSSKiB))
	tw.Flush()
	fmt.Fprintf(w, "\nheartbeat → subscriber latency over %d events: p50 %s, p99 %s, p99.9 %s, max %s\n",
		r.Heartbeats, fmtUS(r.P50US), fmtUS(r.P99US), fmtUS(r.P999US), fmtUS(r.MaxUS))
	fmt.Fprintf(w, "delivered %.0f msg/s (heartbeats alone: %.0f expected); heartbeats per subscriber in the window %d–%d\n",
		r.MsgPerS, r.ExpectedPerS, r.PerSubscriberMin, r.PerSubscriberMax)
	if !r.KeepingUp {
		fmt.Fprintf(w, "NOT KEEPING UP: %.0f%% of the expected messages delivered; the latency above is that of a growing backlog\n",
			100*r.MsgPerS/r.ExpectedPerS)
	}
	fmt.Fprintf(w, "manager: %.2f µs CPU per message delivered (above idle), %.1f KiB RSS per subscriber (above idle)\n",
		r.ManagerCPUUSPerMsg, float64(r.ManagerRSSKiB-r.IdleRSSKiB)/float64(max(r.Subscribers, 1)))
	fmt.Fprintf(w, "dropped %d, closed early %d, bad messages %d; %d subscribers connected in %.1fs; bench CPU %.0f%%, others' CPU %.0f%%\n",
		r.Dropped, r.ClosedEarly, r.BadMessages, r.Subscribers, r.ConnectS, r.BenchCPUPercent, r.OthersCPUPercent)
}

// WriteJSON prints the report as one JSON line.
func (r *feedReport) WriteJSON(w io.Writer) error { return json.NewEncoder(w).Encode(r) }

func mib(kib int64) float64 { return float64(kib) / 1024 }

// fmtUS prints microseconds in the unit that reads best.
func fmtUS(us float64) string {
	if us >= 10000 {
		return fmt.Sprintf("%.1f ms", us/1000)
	}
	return fmt.Sprintf("%.0f µs", us)
}

func runFeedCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o := defaultFeedOptions
	fs := newScenarioFlags("feed", stderr, &o.ManagerBin, &o.HarnessBin)
	fs.IntVar(&o.Clusters, "clusters", o.Clusters, "one-shard clusters, each heartbeating")
	fs.IntVar(&o.Subscribers, "subscribers", o.Subscribers, "WebSocket subscribers on the status feed")
	fs.DurationVar(&o.Heartbeat, "heartbeat", o.Heartbeat, "the manager's heartbeat.interval")
	fs.DurationVar(&o.Warmup, "warmup", o.Warmup, "after the last subscriber connects, before the window")
	fs.DurationVar(&o.Duration, "duration", o.Duration, "measured window")
	fs.DurationVar(&o.IdleSample, "idle-sample", o.IdleSample, "how long the manager is sampled with no subscriber")
	fs.IntVar(&o.Dialers, "dialers", o.Dialers, "WebSocket handshakes at once while connecting")
	fs.StringVar(&o.ManagerCPUProfile, "manager-cpuprofile", "", "write a CPU profile of sm-manager to this file")
	var err error
	if o.Progress, err = fs.parse(args); err != nil {
		return err
	}
	rep, err := runFeed(ctx, o)
	return finishReport("feed", stdout, rep, rep != nil && rep.WindowS > 0, err)
}
