package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/sm-supervisor/sm/ipc"
)

// chaosOptions shape the chaos scenario. Zero fields take the defaults of
// defaultChaosOptions, except the binaries (required) and ConnectDelay.
type chaosOptions struct {
	ManagerBin string
	HarnessBin string

	Clusters  int
	Duration  time.Duration // how long the faults go on
	KillEvery time.Duration // a random ready cluster is SIGKILLed this often
	// StopFor is how long one cluster is held SIGSTOPped: longer than the
	// heartbeat timeout, so the manager must kill and replace it (0: the
	// heartbeat timeout + stop grace + 1s).
	StopFor time.Duration
	// CrashFlags are the harness flags of the crash-looping cluster (the
	// last one), set through its SM_HARNESS_FLAGS_<n>.
	CrashFlags string

	// The manager's config, shortened so that a bounded run sees every fault
	// through: heartbeat.interval and .timeout, restart.stop_grace and
	// .backoff_max, requests.timeout.
	HeartbeatInterval time.Duration
	HeartbeatTimeout  time.Duration
	StopGrace         time.Duration
	BackoffMax        time.Duration
	RequestTimeout    time.Duration

	rollLoadOptions
	ConnectDelay time.Duration // the harness's --connect-delay

	// Slack widens each down window the feed shows back in time: an error
	// reply and the feed event of the death that caused it travel on two
	// connections, in either order.
	Slack time.Duration
	// Recover bounds the wait, after the faults, for every cluster to be ready
	// again (and the crash-looping one to be in crash_loop).
	Recover time.Duration
	Seed    uint64 // for the choice of clusters to kill (0: from the clock)

	// LogPath, if set, keeps the manager's and clusters' log there (else it
	// goes with the temp dir, its tail added to a scenario error).
	LogPath string

	Progress io.Writer
}

// defaultChaosOptions are the chaos scenario's defaults (issue 7).
var defaultChaosOptions = chaosOptions{
	Clusters:          8,
	Duration:          60 * time.Second,
	KillEvery:         2 * time.Second,
	CrashFlags:        "--crash-after=300ms",
	HeartbeatInterval: 250 * time.Millisecond,
	HeartbeatTimeout:  2 * time.Second,
	StopGrace:         time.Second,
	BackoffMax:        2 * time.Second,
	RequestTimeout:    5 * time.Second,
	rollLoadOptions:   rollLoadOptions{InFlight: 32, Conns: 2, Targets: "mix", PayloadBytes: 64},
	ConnectDelay:      50 * time.Millisecond,
	Slack:             time.Second,
	Recover:           30 * time.Second,
}

func (o chaosOptions) withDefaults() chaosOptions {
	d := defaultChaosOptions
	orDefault(&o.Clusters, d.Clusters)
	o.rollLoadOptions.withDefaults(d.rollLoadOptions)
	orDefault(&o.Duration, d.Duration)
	orDefault(&o.KillEvery, d.KillEvery)
	orDefault(&o.HeartbeatInterval, d.HeartbeatInterval)
	orDefault(&o.HeartbeatTimeout, d.HeartbeatTimeout)
	orDefault(&o.StopGrace, d.StopGrace)
	orDefault(&o.BackoffMax, d.BackoffMax)
	orDefault(&o.RequestTimeout, d.RequestTimeout)
	orDefault(&o.Slack, d.Slack)
	orDefault(&o.Recover, d.Recover)
	if o.StopFor <= 0 {
		o.StopFor = o.HeartbeatTimeout + o.StopGrace + time.Second
	}
	orDefaultIfZero(&o.CrashFlags, d.CrashFlags)
	if o.Seed == 0 {
		o.Seed = uint64(time.Now().UnixNano())
	}
	orDefaultIfZero(&o.Progress, io.Discard)
	return o
}

// Errors a request may get while its cluster is down, and only then.
var chaosAllowed = []string{ipc.CodeUnavailable, ipc.CodeTimeout, ipc.CodeBusy}

// chaosAction is one fault the scenario caused.
type chaosAction struct {
	Kind    string // kill, stop, cont
	Cluster int
	PID     int
	At      time.Time
}

// chaosReport is everything the chaos scenario saw.
type chaosReport struct {
	rollHead
	Clusters    int     `json:"clusters"`
	DurationS   float64 `json:"duration_s"`
	KillEveryMS float64 `json:"kill_every_ms"`
	Seed        uint64  `json:"seed"`
	InFlight    int     `json:"in_flight"`
	Targets     string  `json:"targets"`

	Kills    int          `json:"kills"`
	SigStop  chaosStop    `json:"sigstop"`
	Crash    chaosCrash   `json:"crash_loop"`
	NoReader chaosNoRead  `json:"non_reader"`
	Windows  chaosWindows `json:"down_windows"`

	// The load over the whole run.
	figures
	// Error replies inside a down window of their cluster (allowed), by
	// code, and the ones outside any (each a failure).
	ErrorsInWindows map[string]uint64 `json:"errors_in_down_windows"`
	ErrorsOutside   uint64            `json:"errors_outside_down_windows"`
	OutsideSamples  []string          `json:"outside_samples,omitempty"`

	RecoveredAfterS float64 `json:"recovered_after_s"` // end of the faults → every cluster ready again
	Serving         bool    `json:"serving"`           // every cluster but the crash-looping one answered a ping at the end
	rollTail
}

// chaosStop is the SIGSTOPped cluster.
type chaosStop struct {
	Cluster  int     `json:"cluster"`
	PID      int     `json:"pid"`
	ForS     float64 `json:"for_s"`
	Replaced bool    `json:"replaced"` // the manager killed it and routed a new process
	// ReplacedAfterS is SIGSTOP → a new process routed (seen on the feed).
	ReplacedAfterS float64 `json:"replaced_after_s"`
}

// chaosCrash is the crash-looping cluster.
type chaosCrash struct {
	Cluster   int    `json:"cluster"`
	Flags     string `json:"flags"`
	Restarts  int    `json:"restarts"`
	CrashLoop bool   `json:"crash_loop"` // STATUS says so at the end
	State     string `json:"state"`
}

// chaosNoRead is the client that stops reading.
type chaosNoRead struct {
	Sent         int     `json:"sent"`
	CutOff       bool    `json:"cut_off"`
	CutOffAfterS float64 `json:"cut_off_after_s"`
	Error        string  `json:"error,omitempty"`
}

// chaosWindows sums up the down windows the errors were checked against.
type chaosWindows struct {
	Count     int     `json:"count"`
	LongestMS float64 `json:"longest_ms"`
	SlackMS   float64 `json:"slack_ms"`
}

// runChaos runs the chaos scenario: a manager with o.Clusters clusters under a
// closed-loop load to every cluster, and for o.Duration: a random ready
// cluster SIGKILLed every o.KillEvery, one cluster SIGSTOPped past the
// heartbeat timeout then SIGCONTinued, one cluster crash-looping from the
// start, and a client that sends requests and never reads. It returns an
// error when a process or the scenario itself fails; broken invariants are in
// the report's Failures.
func runChaos(ctx context.Context, o chaosOptions) (rep *chaosReport, err error) {
	o = o.withDefaults()
	if o.ManagerBin == "" || o.HarnessBin == "" {
		return nil, errors.New("chaos: need the sm-manager and cluster-harness binaries")
	}
	if o.Clusters < 4 {
		return nil, fmt.Errorf("chaos: %d clusters: needs at least 4 (one stopped, one crash-looping, two to kill)", o.Clusters)
	}
	if o.Duration*7/10 < o.StopFor {
		return nil, fmt.Errorf("chaos: a %v run cannot hold a cluster stopped for %v from 30%% of it: make --duration longer or --stop-for shorter", o.Duration, o.StopFor)
	}
	crashC, stopC := o.Clusters-1, 0
	rep = &chaosReport{
		rollHead: newRollHead("chaos"),
		Clusters: o.Clusters, DurationS: o.Duration.Seconds(), KillEveryMS: millis(o.KillEvery), Seed: o.Seed,
		InFlight: o.InFlight, Targets: o.Targets,
		SigStop: chaosStop{Cluster: stopC, ForS: o.StopFor.Seconds()},
		Crash:   chaosCrash{Cluster: crashC, Flags: o.CrashFlags},
	}
	lanes, err := loadLanes(o.Clusters, 1, o.InFlight, o.Targets)
	if err != nil {
		return nil, err
	}
	run, err := newRollRun("chaos", o.LogPath, &rep.Failures)
	if err != nil {
		return nil, err
	}
	defer func() { err = run.close(err) }()

	cfg, err := rollConfig(run.scratch.dir, o.Clusters, 1, []string{o.HarnessBin, "--simulate", "--connect-delay=" + o.ConnectDelay.String()})
	if err != nil {
		return nil, err
	}
	cfg.Heartbeat.Interval.Duration = o.HeartbeatInterval
	cfg.Heartbeat.Timeout.Duration = o.HeartbeatTimeout
	cfg.Restart.StopGrace.Duration = o.StopGrace
	cfg.Restart.BackoffMax.Duration = o.BackoffMax
	cfg.Requests.Timeout.Duration = o.RequestTimeout
	cfg.Cluster.Env["SM_HARNESS_FLAGS_"+strconv.Itoa(crashC)] = o.CrashFlags
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("chaos: manager config: %w", err)
	}
	fmt.Fprintf(o.Progress, "chaos: starting sm-manager with %d clusters (cluster %d crash-looping: %s)\n", o.Clusters, crashC, o.CrashFlags)
	if err := run.startFleet(ctx, o.ManagerBin, cfg, startTimeout+time.Duration(o.Clusters)*200*time.Millisecond, crashC); err != nil {
		return rep, err
	}
	err = run.startLoad(ctx, o.Progress, "chaos", o.Targets, laneLoadOptions{
		lanes: lanes, conns: o.Conns, payload: echoPayload(o.PayloadBytes), errPause: 20 * time.Millisecond,
	})
	if err != nil {
		return rep, err
	}
	fleet, watcher, load := run.fleet, run.watcher, run.load

	fmt.Fprintf(o.Progress, "chaos: faults for %v: kill -9 every %v, SIGSTOP of cluster %d for %v, a client that stops reading (seed %d)\n",
		o.Duration, o.KillEvery, stopC, o.StopFor, o.Seed)
	actions, noRead, err := runFaults(ctx, o, fleet, watcher, stopC, crashC)
	faultsEnd := time.Now()
	for _, a := range actions {
		switch a.Kind {
		case "kill":
			rep.Kills++
		case "stop":
			rep.SigStop.PID = a.PID
		}
	}
	rep.NoReader = noRead
	rep.LoadAvgEnd = loadAverage()
	if err != nil {
		return rep, err
	}

	drain := o.RequestTimeout + 5*time.Second
	fmt.Fprintf(o.Progress, "chaos: %d kills done; stopping the load, waiting up to %v for the last replies\n", rep.Kills, drain)
	var errs, lost []errorReply
	rep.figures, errs, lost = load.finish(drain)

	// Every cluster comes back; the crash-looping one is in crash_loop.
	fmt.Fprintf(o.Progress, "chaos: waiting up to %v for every cluster to be ready again\n", o.Recover)
	final, werr := fleet.waitStatus(ctx, o.Recover, "every cluster ready again and cluster "+strconv.Itoa(crashC)+" in crash_loop",
		func(st *rollStatus) bool {
			return allReady(st, crashC) && crashC < len(st.Clusters) && st.Clusters[crashC].CrashLoop
		})
	if werr != nil {
		if ctx.Err() != nil {
			return rep, werr
		}
		rep.fail("%v", werr)
	} else {
		rep.RecoveredAfterS = time.Since(faultsEnd).Seconds()
	}
	if final != nil && crashC < len(final.Clusters) {
		c := final.Clusters[crashC]
		rep.Crash.Restarts, rep.Crash.CrashLoop, rep.Crash.State = c.Restarts, c.CrashLoop, c.State
	}
	// The manager still serves: every cluster answers.
	rep.Serving = true
	for c := range o.Clusters {
		if c == crashC {
			continue
		}
		if _, err := fleet.ping(ctx, c); err != nil {
			rep.Serving = false
			rep.fail("cluster %d does not answer a ping after the faults: %v", c, err)
		}
	}
	if rep.Procs, err = fleet.checkProcs(ctx); err != nil {
		return rep, err
	}

	// The SIGSTOPped process was killed and replaced.
	changes := watcher.routeChanges()
	if stopAt, ok := actionAt(actions, "stop"); ok {
		for _, ch := range changes {
			if ch.Cluster == stopC && ch.Routed && ch.PID != rep.SigStop.PID && ch.At.After(stopAt) {
				rep.SigStop.Replaced, rep.SigStop.ReplacedAfterS = true, ch.At.Sub(stopAt).Seconds()
				break
			}
		}
		if ourCluster(rep.SigStop.PID, cfg.Socket) {
			rep.SigStop.Replaced = false
			rep.fail("the SIGSTOPped process %d is still alive", rep.SigStop.PID)
		}
	}

	// Every error reply must fall in a down window of its cluster.
	windows := downWindows(changes, actions, o.Slack, time.Now())
	for _, ws := range windows {
		for _, w := range ws {
			rep.Windows.Count++
			rep.Windows.LongestMS = max(rep.Windows.LongestMS, millis(w.To.Sub(w.From)))
		}
	}
	rep.Windows.SlackMS = millis(o.Slack)
	var outside []errorReply
	rep.ErrorsInWindows, outside = classifyErrors(errs, windows)
	rep.ErrorsOutside = uint64(len(outside))
	for i, e := range outside {
		if i == 10 {
			break
		}
		rep.OutsideSamples = append(rep.OutsideSamples, fmt.Sprintf("cluster %d (%s): %s %q, sent %s, replied %s",
			e.Cluster, e.Target, e.Code, e.Message, e.Sent.Format("15:04:05.000"), e.Replied.Format("15:04:05.000")))
	}
	for _, l := range lost {
		if len(rep.OutsideSamples) >= 20 {
			break
		}
		rep.OutsideSamples = append(rep.OutsideSamples, fmt.Sprintf("cluster %d (%s): lost, sent %s", l.Cluster, l.Target, l.Sent.Format("15:04:05.000")))
	}
	rep.FeedDrops = watcher.dropCount()
	rep.check(watcher.failed(), load.failure())
	return rep, nil
}

// runFaults causes the faults for o.Duration and returns what it did.
func runFaults(ctx context.Context, o chaosOptions, fleet *rollFleet, w *feedWatcher, stopC, crashC int) ([]chaosAction, chaosNoRead, error) {
	rng := rand.New(rand.NewPCG(o.Seed, o.Seed^0x5eed))
	var actions []chaosAction
	socket := fleet.cfg.Socket
	signal := func(kind string, c, pid int, sig syscall.Signal) bool {
		if !ourCluster(pid, socket) {
			return false
		}
		at := time.Now()
		if err := syscall.Kill(pid, sig); err != nil {
			return false
		}
		actions = append(actions, chaosAction{Kind: kind, Cluster: c, PID: pid, At: at})
		return true
	}

	// The client that stops reading runs beside the rest.
	noReadCtx, cancelNoRead := context.WithCancel(ctx)
	defer cancelNoRead()
	noReadRes := make(chan chaosNoRead, 1)
	noReadStart := time.NewTimer(o.Duration * 15 / 100)
	defer noReadStart.Stop()
	noReadStarted := false
	var targets []string
	for c := range o.Clusters {
		targets = append(targets, strconv.Itoa(c))
	}

	start := time.Now()
	end := time.NewTimer(o.Duration)
	defer end.Stop()
	kill := time.NewTicker(o.KillEvery)
	defer kill.Stop()
	stopAt := time.NewTimer(o.Duration * 30 / 100)
	defer stopAt.Stop()
	var contAt <-chan time.Time
	stopped := 0 // pid held stopped

	cont := func() {
		if stopped != 0 {
			signal("cont", stopC, stopped, syscall.SIGCONT)
			stopped = 0
		}
	}
	defer cont()
	for {
		select {
		case <-ctx.Done():
			return actions, chaosNoRead{}, ctx.Err()
		case <-end.C:
			cont()
			var nr chaosNoRead
			if noReadStarted {
				select {
				case nr = <-noReadRes: // done already, as it should be
				case <-time.After(5 * time.Second):
					cancelNoRead()
					nr = <-noReadRes
				}
			}
			fmt.Fprintf(o.Progress, "chaos: faults over after %.1fs\n", time.Since(start).Seconds())
			return actions, nr, nil
		case <-noReadStart.C:
			noReadStarted = true
			go func() { noReadRes <- stopReading(noReadCtx, socket, targets, o.Duration) }()
		case <-stopAt.C:
			c, ok := w.cluster(stopC)
			if !ok || !c.Routed || c.State != "ready" || !signal("stop", stopC, c.PID, syscall.SIGSTOP) {
				stopAt.Reset(100 * time.Millisecond) // between lives: try again
				continue
			}
			stopped = c.PID
			fmt.Fprintf(o.Progress, "chaos: SIGSTOP cluster %d (pid %d) for %v\n", stopC, c.PID, o.StopFor)
			contAt = time.After(o.StopFor)
		case <-contAt:
			contAt = nil
			cont()
		case <-kill.C:
			var ready []rollCluster
			for id := range o.Clusters {
				if id == stopC || id == crashC {
					continue
				}
				if c, ok := w.cluster(id); ok && c.Routed && c.State == "ready" {
					ready = append(ready, c)
				}
			}
			if len(ready) == 0 {
				continue
			}
			c := ready[rng.IntN(len(ready))]
			signal("kill", c.ID, c.PID, syscall.SIGKILL)
		}
	}
}

// stopReading is a client that sends echo requests (2000 a second, 1 KiB
// each, over targets) and never reads a reply. The manager must cut it off
// once its replies fill the connection's outbound queue. It returns when the
// connection breaks, or after bound.
func stopReading(ctx context.Context, socket string, targets []string, bound time.Duration) chaosNoRead {
	var res chaosNoRead
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		res.Error = err.Error()
		return res
	}
	defer nc.Close()
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	nc.SetDeadline(time.Now().Add(startTimeout))
	if _, err := nc.Write([]byte(`{"op":"REGISTER","id":"r","role":"client","name":"sm-bench-non-reader"}` + "\n")); err != nil {
		res.Error = err.Error()
		return res
	}
	line, err := bufio.NewReader(nc).ReadString('\n')
	if err == nil && strings.Contains(line, `"error"`) {
		err = fmt.Errorf("REGISTER refused: %s", line)
	}
	if err != nil {
		res.Error = err.Error()
		return res
	}
	nc.SetDeadline(time.Time{})
	payload := echoPayload(1024)
	var buf []byte
	start := time.Now()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; {
		select {
		case <-ctx.Done():
			res.Error = "not cut off before the end of the run"
			return res
		case <-tick.C:
		}
		if time.Since(start) > bound {
			res.Error = fmt.Sprintf("not cut off within %v", bound)
			return res
		}
		buf = buf[:0]
		for range 10 {
			i++
			buf = ipc.AppendFrame(buf, &ipc.Frame{Op: "echo", ID: strconv.Itoa(i), Target: targets[i%len(targets)], Payload: payload})
			buf = append(buf, '\n')
		}
		nc.SetWriteDeadline(time.Now().Add(2 * time.Second))
		if _, err := nc.Write(buf); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && ctx.Err() == nil {
				continue // the manager is slow to read: not cut off yet
			}
			if ctx.Err() != nil {
				res.Error = "not cut off before the end of the run"
				return res
			}
			res.CutOff, res.CutOffAfterS = true, time.Since(start).Seconds()
			return res
		}
		res.Sent += 10
	}
}

// downWindow is a time in which a cluster was down: dead, stopped or
// restarting.
type downWindow struct{ From, To time.Time }

// downWindows computes each cluster's down windows: every interval the feed
// showed it unrouted, widened back by slack; and from each fault the scenario
// caused to the cluster (at its own clock, before the manager can know) to
// the end of the unrouted interval that followed.
func downWindows(changes []routeChange, actions []chaosAction, slack time.Duration, end time.Time) map[int][]downWindow {
	out := map[int][]downWindow{}
	ivs := unroutedIntervals(changes, end)
	for _, iv := range ivs {
		out[iv.Cluster] = append(out[iv.Cluster], downWindow{From: iv.From.Add(-slack), To: iv.To})
	}
	for _, a := range actions {
		if a.Kind == "cont" {
			continue
		}
		// The death a fault caused is the cluster's first unrouted interval
		// that starts after it.
		w := downWindow{From: a.At, To: a.At.Add(slack)}
		var caused *unroutedInterval
		for i, iv := range ivs {
			if iv.Cluster == a.Cluster && !iv.From.Before(a.At) && iv.From.Sub(a.At) < faultEffectBound &&
				(caused == nil || iv.From.Before(caused.From)) {
				caused = &ivs[i]
			}
		}
		if caused != nil {
			w.To = caused.To
		}
		out[a.Cluster] = append(out[a.Cluster], w)
	}
	return out
}

// faultEffectBound bounds the time between a fault and the unrouting it
// causes: a SIGSTOP shows after the heartbeat timeout.
const faultEffectBound = 30 * time.Second

// classifyErrors sorts error replies into those allowed (an allowed code, in
// a down window of their cluster), counted by code, and the rest.
func classifyErrors(errs []errorReply, windows map[int][]downWindow) (map[string]uint64, []errorReply) {
	in := map[string]uint64{}
	var outside []errorReply
	for _, e := range errs {
		ok := false
		if slices.Contains(chaosAllowed, e.Code) {
			for _, w := range windows[e.Cluster] {
				if !e.Sent.After(w.To) && !e.Replied.Before(w.From) {
					ok = true
					break
				}
			}
		}
		if ok {
			in[e.Code]++
		} else {
			outside = append(outside, e)
		}
	}
	return in, outside
}

func actionAt(actions []chaosAction, kind string) (time.Time, bool) {
	for _, a := range actions {
		if a.Kind == kind {
			return a.At, true
		}
	}
	return time.Time{}, false
}

// check lists the broken invariants in rep.Failures.
func (rep *chaosReport) check(feedErr, loadErr error) {
	if loadErr != nil {
		rep.fail("a load connection failed (the load must never be cut off): %v", loadErr)
	}
	rep.checkFeed(feedErr, "the down windows are incomplete")
	if rep.Lost > 0 {
		rep.fail("%d requests lost (no reply)", rep.Lost)
	}
	if rep.Duplicates > 0 {
		rep.fail("%d duplicate replies", rep.Duplicates)
	}
	if rep.Unknown > 0 {
		rep.fail("%d replies to unknown ids", rep.Unknown)
	}
	if rep.Sent != rep.OK+rep.ErrorCount()+rep.Lost {
		rep.fail("books do not balance: sent %d != ok %d + errors %d + lost %d", rep.Sent, rep.OK, rep.ErrorCount(), rep.Lost)
	}
	if rep.ErrorsOutside > 0 {
		rep.fail("%d error replies outside their cluster's down windows (or of a code other than %v): %v",
			rep.ErrorsOutside, chaosAllowed, rep.OutsideSamples)
	}
	if rep.OK == 0 {
		rep.fail("load: no request succeeded")
	}
	if rep.Kills == 0 {
		rep.fail("no cluster was killed")
	}
	if rep.SigStop.PID == 0 {
		rep.fail("no cluster was SIGSTOPped")
	} else if !rep.SigStop.Replaced {
		rep.fail("the SIGSTOPped cluster %d (pid %d) was not replaced", rep.SigStop.Cluster, rep.SigStop.PID)
	}
	if !rep.Crash.CrashLoop {
		rep.fail("cluster %d (%s) is not in crash_loop at the end (state %q, %d restarts)", rep.Crash.Cluster, rep.Crash.Flags, rep.Crash.State, rep.Crash.Restarts)
	}
	if !rep.NoReader.CutOff {
		rep.fail("the client that stopped reading was not cut off: %s", rep.NoReader.Error)
	}
	rep.checkProcs()
}

// WriteText prints the report for people.
func (rep *chaosReport) WriteText(w io.Writer) {
	fmt.Fprintf(w, "chaos: %d clusters for %.0f s under %d requests in flight (%s targets); %d CPUs (%s); %s; seed %d\n\n",
		rep.Clusters, rep.DurationS, rep.InFlight, rep.Targets, rep.CPUs, cpuModel(), rep.Date, rep.Seed)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "fault\twhat happened\t\n")
	fmt.Fprintf(tw, "kill -9 every %.0f ms\t%d clusters killed\t\n", rep.KillEveryMS, rep.Kills)
	fmt.Fprintf(tw, "SIGSTOP cluster %d for %.1f s\tpid %d, replaced: %v, new process routed %.2f s after the SIGSTOP\t\n",
		rep.SigStop.Cluster, rep.SigStop.ForS, rep.SigStop.PID, rep.SigStop.Replaced, rep.SigStop.ReplacedAfterS)
	fmt.Fprintf(tw, "cluster %d crash-looping (%s)\t%d restarts, crash_loop: %v, state %s\t\n",
		rep.Crash.Cluster, rep.Crash.Flags, rep.Crash.Restarts, rep.Crash.CrashLoop, rep.Crash.State)
	fmt.Fprintf(tw, "a client that stops reading\tsent %d requests, cut off: %v, after %.2f s %s\t\n",
		rep.NoReader.Sent, rep.NoReader.CutOff, rep.NoReader.CutOffAfterS, rep.NoReader.Error)
	tw.Flush()
	fmt.Fprintln(w)
	fmt.Fprintf(w, "load: %d sent over %.1f s, %.0f req/s; ok %d, errors %d, lost %d, duplicates %d, unknown %d; latency p50 %.2f ms, p99 %.2f ms, max %.0f ms\n",
		rep.Sent, rep.LoadS, rep.ReqPerS, rep.OK, rep.ErrorCount(), rep.Lost, rep.Duplicates, rep.Unknown, rep.P50US/1000, rep.P99US/1000, rep.MaxUS/1000)
	fmt.Fprintf(w, "errors inside their cluster's down windows: %s; outside: %d  (%d windows, longest %.0f ms, slack %.0f ms)\n",
		errorCodes(rep.ErrorsInWindows), rep.ErrorsOutside, rep.Windows.Count, rep.Windows.LongestMS, rep.Windows.SlackMS)
	fmt.Fprintf(w, "after the faults: every cluster ready again after %.1f s; manager serving: %v; cluster processes: %d live, %d zombies, %d orphans, %d strays\n",
		rep.RecoveredAfterS, rep.Serving, rep.Procs.Live, rep.Procs.Zombies, rep.Procs.Orphans, rep.Procs.Strays)
	fmt.Fprintf(w, "machine load average (1, 5, 15 min): %s at the start, %s at the end of the faults\n", rep.LoadAvgStart, rep.LoadAvgEnd)
	for _, f := range rep.Failures {
		fmt.Fprintf(w, "FAILED: %s\n", f)
	}
}

// WriteJSON prints the report as one JSON line.
func (rep *chaosReport) WriteJSON(w io.Writer) error {
	return json.NewEncoder(w).Encode(rep)
}

func runChaosCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o := defaultChaosOptions
	fs := newScenarioFlags("chaos", stderr, &o.ManagerBin, &o.HarnessBin)
	fs.IntVar(&o.Clusters, "clusters", o.Clusters, "clusters (at least 4): cluster 0 is SIGSTOPped, the last one crash-loops")
	fs.DurationVar(&o.Duration, "duration", o.Duration, "how long the faults go on")
	fs.DurationVar(&o.KillEvery, "kill-every", o.KillEvery, "kill -9 a random ready cluster this often")
	fs.DurationVar(&o.StopFor, "stop-for", 0, "how long cluster 0 is held SIGSTOPped (default: heartbeat timeout + stop grace + 1s)")
	fs.StringVar(&o.CrashFlags, "crash", o.CrashFlags, "harness flags of the crash-looping cluster, e.g. --exit-on-start=3")
	fs.DurationVar(&o.HeartbeatInterval, "heartbeat-interval", o.HeartbeatInterval, "the manager's heartbeat.interval")
	fs.DurationVar(&o.HeartbeatTimeout, "heartbeat-timeout", o.HeartbeatTimeout, "the manager's heartbeat.timeout")
	fs.DurationVar(&o.StopGrace, "stop-grace", o.StopGrace, "the manager's restart.stop_grace")
	fs.DurationVar(&o.BackoffMax, "backoff-max", o.BackoffMax, "the manager's restart.backoff_max (the crash loop's retry period)")
	fs.DurationVar(&o.RequestTimeout, "request-timeout", o.RequestTimeout, "the manager's requests.timeout")
	o.rollLoadOptions.flags(fs)
	fs.DurationVar(&o.ConnectDelay, "connect-delay", o.ConnectDelay, "the harness's --connect-delay")
	fs.DurationVar(&o.Slack, "slack", o.Slack, "down windows seen on the feed are widened back by this much")
	fs.DurationVar(&o.Recover, "recover", o.Recover, "bound on the wait for every cluster to be ready again after the faults")
	fs.Uint64Var(&o.Seed, "seed", 0, "seed of the choice of clusters to kill (default: from the clock; the report shows it)")
	fs.StringVar(&o.LogPath, "log", "", "keep the manager's and clusters' log in this file")
	var err error
	if o.Progress, err = fs.parse(args); err != nil {
		return err
	}
	rep, err := runChaos(ctx, o)
	return finishReport("chaos", stdout, rep, rep != nil && (rep.Sent > 0 || err == nil), err)
}
