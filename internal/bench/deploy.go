package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/sm-supervisor/sm/generation"
)

// deployOptions shape the deploy scenario. Zero fields take the defaults of
// defaultDeployOptions, except the binaries (required), ConnectDelay and
// OpDelay (zero is a valid value).
type deployOptions struct {
	ManagerBin string
	HarnessBin string

	Clusters         int
	ShardsPerCluster int
	Deploys          int // rolling deploys of every cluster, back to back
	MaxParallel      int
	// Mode is DEPLOY's mode: "" (overlap, the default) or "resume", whose
	// gap per cluster the report gives.
	Mode string
	rollLoadOptions
	ConnectDelay  time.Duration // the harness's --connect-delay (per shard)
	OpDelay       time.Duration // the harness's --op-delay
	Settle        time.Duration // load before the first deploy and between deploys
	DeployTimeout time.Duration // bound on each deploy
	Drain         time.Duration // wait for the last replies before counting them lost

	// LogPath, if set, keeps the manager's and clusters' log there (else it
	// goes with the temp dir, its tail added to a scenario error).
	LogPath string

	Progress io.Writer
}

// defaultDeployOptions are the deploy scenario's defaults (issue 3's benchmark).
var defaultDeployOptions = deployOptions{
	Clusters:         16,
	ShardsPerCluster: 1,
	Deploys:          3,
	MaxParallel:      1,
	rollLoadOptions:  rollLoadOptions{InFlight: 64, Conns: 2, Targets: "mix", PayloadBytes: 64},
	ConnectDelay:     100 * time.Millisecond,
	Settle:           time.Second,
	DeployTimeout:    3 * time.Minute,
	Drain:            15 * time.Second,
}

func (o deployOptions) withDefaults() deployOptions {
	d := defaultDeployOptions
	orDefault(&o.Clusters, d.Clusters)
	orDefault(&o.ShardsPerCluster, d.ShardsPerCluster)
	orDefault(&o.Deploys, d.Deploys)
	orDefault(&o.MaxParallel, d.MaxParallel)
	o.rollLoadOptions.withDefaults(d.rollLoadOptions)
	orDefault(&o.Settle, d.Settle)
	orDefault(&o.DeployTimeout, d.DeployTimeout)
	orDefault(&o.Drain, d.Drain)
	orDefaultIfZero(&o.Progress, io.Discard)
	return o
}

// targetSwapOverhead is issue 3's target for the manager's own time per swap.
const targetSwapOverhead = 50 * time.Millisecond

// deployResult is one deploy's figures.
type deployResult struct {
	ID         string `json:"id"`
	Generation int64  `json:"generation"`
	State      string `json:"state"`
	Reason     string `json:"reason,omitempty"`
	// WallS is the deploy's own started → finished (the manager's clock);
	// ObservedS is DEPLOY sent → the bench saw it finished.
	WallS     float64 `json:"wall_s"`
	ObservedS float64 `json:"observed_s"`
	Swaps     int     `json:"swaps"` // clusters ACTIVATEd on the new generation
	// The manager's own time per swap, from the deploy's timestamps:
	// (routed_at − ready_at) + (activated_at − exited_at) + (spawned_at − the
	// activation that freed the slot, or the deploy's start).
	OverheadP50MS float64 `json:"overhead_p50_ms"`
	OverheadMaxMS float64 `json:"overhead_max_ms"`
	// The harness's share, for scale: the new process's start (spawned_at →
	// ready_at) and the old one's drain (quiesce_sent_at → exited_at).
	NewReadyP50MS float64 `json:"new_ready_p50_ms"`
	NewReadyMaxMS float64 `json:"new_ready_max_ms"`
	OldDrainP50MS float64 `json:"old_drain_p50_ms"`
	OldDrainMaxMS float64 `json:"old_drain_max_ms"`
	// ReadyLag is the manager receiving the ready heartbeat → ready_at: the
	// wait in its event loop, which the deploy's own timestamps cannot show.
	ReadyLagP50MS float64 `json:"ready_lag_p50_ms"`
	ReadyLagMaxMS float64 `json:"ready_lag_max_ms"`
	// StartOutside is the part of spawned_at → ready_at the new harness did
	// not count in its own uptime: the fork and exec, and the ready
	// heartbeat's way to the manager's loop.
	StartOutsideP50MS float64 `json:"start_outside_harness_p50_ms"`
	StartOutsideMaxMS float64 `json:"start_outside_harness_max_ms"`
	// Unrouted intervals (from the WATCH feed) overlapping the deploy.
	UnroutedIntervals int     `json:"unrouted_intervals"`
	MaxUnroutedMS     float64 `json:"max_unrouted_ms"`
	// Load is the load's books between DEPLOY and the deploy's end.
	Load books `json:"load"`
	// Gap, for a resume-handoff deploy: per cluster, QUIESCE sent to the old
	// process → the new one routed, the time its requests wait.
	GapP50MS float64 `json:"gap_p50_ms,omitempty"`
	GapMaxMS float64 `json:"gap_max_ms,omitempty"`

	overheads    []time.Duration
	gaps         []time.Duration
	startOutside []time.Duration
}

// deployReport is everything the deploy scenario measured.
type deployReport struct {
	rollHead
	Clusters         int            `json:"clusters"`
	ShardsPerCluster int            `json:"shards_per_cluster"`
	MaxParallel      int            `json:"max_parallel"`
	Mode             string         `json:"mode,omitempty"`
	InFlight         int            `json:"in_flight"`
	Targets          string         `json:"targets"`
	ConnectDelayMS   float64        `json:"connect_delay_ms"`
	Deploys          []deployResult `json:"deploys"`
	// The load over the whole run.
	figures
	// Over every swap of every deploy.
	Swaps         int     `json:"swaps"`
	OverheadP50MS float64 `json:"overhead_p50_ms"`
	OverheadMaxMS float64 `json:"overhead_max_ms"`
	// Over every swap: see deployResult.StartOutside.
	StartOutsideP50MS float64 `json:"start_outside_harness_p50_ms"`
	StartOutsideMaxMS float64 `json:"start_outside_harness_max_ms"`
	// Unrouted intervals anywhere in the loaded run (a deploy never unroutes;
	// a resume-handoff deploy does, for its gap).
	UnroutedIntervals int     `json:"unrouted_intervals"`
	MaxUnroutedMS     float64 `json:"max_unrouted_ms"`
	// Over every swap of a resume-handoff deploy: see deployResult.Gap.
	GapP50MS float64 `json:"gap_p50_ms,omitempty"`
	GapMaxMS float64 `json:"gap_max_ms,omitempty"`
	rollTail
}

// runDeploy runs the deploy scenario: a manager with o.Clusters clusters under a
// closed-loop load to every cluster, and o.Deploys rolling deploys of every
// cluster back to back, each to its end. It returns an error when a process or
// the scenario itself fails; broken invariants are in the report's Failures.
func runDeploy(ctx context.Context, o deployOptions) (rep *deployReport, err error) {
	o = o.withDefaults()
	if o.ManagerBin == "" || o.HarnessBin == "" {
		return nil, errors.New("deploy: need the sm-manager and cluster-harness binaries")
	}
	rep = &deployReport{
		rollHead: newRollHead("deploy"),
		Clusters: o.Clusters, ShardsPerCluster: o.ShardsPerCluster, MaxParallel: o.MaxParallel, Mode: o.Mode,
		InFlight: o.InFlight, Targets: o.Targets, ConnectDelayMS: millis(o.ConnectDelay),
	}
	lanes, err := loadLanes(o.Clusters, o.ShardsPerCluster, o.InFlight, o.Targets)
	if err != nil {
		return nil, err
	}
	run, err := newRollRun("deploy", o.LogPath, &rep.Failures)
	if err != nil {
		return nil, err
	}
	defer func() { err = run.close(err) }()

	harnessArgv := []string{o.HarnessBin, "--simulate",
		"--connect-delay=" + o.ConnectDelay.String(), "--op-delay=" + o.OpDelay.String()}
	cfg, err := rollConfig(run.scratch.dir, o.Clusters, o.ShardsPerCluster, harnessArgv)
	if err != nil {
		return nil, err
	}
	cfg.Cluster.Env["SM_BENCH_DEPLOY"] = "0"
	fmt.Fprintf(o.Progress, "deploy: starting sm-manager with %d clusters of %d shards\n", o.Clusters, o.ShardsPerCluster)
	startWait := startTimeout + time.Duration(o.Clusters*o.ShardsPerCluster)*(o.ConnectDelay+100*time.Millisecond)
	if err := run.startFleet(ctx, o.ManagerBin, cfg, startWait); err != nil {
		return nil, err
	}
	err = run.startLoad(ctx, o.Progress, "deploy", o.Targets, laneLoadOptions{lanes: lanes, conns: o.Conns, payload: echoPayload(o.PayloadBytes)})
	if err != nil {
		return nil, err
	}
	fleet, watcher, load := run.fleet, run.watcher, run.load
	if err := sleep(ctx, o.Settle); err != nil {
		return nil, err
	}

	var lastGen int64
	for k := 1; k <= o.Deploys; k++ {
		// A real deploy ships a changed file; this one changes an environment
		// variable of the new generation.
		cfg.Cluster.Env["SM_BENCH_DEPLOY"] = strconv.Itoa(k)
		if err := fleet.writeConfig(); err != nil {
			return rep, err
		}
		before := load.snapshot()
		sent := time.Now()
		id, gen, err := fleet.startRollout(ctx, o.MaxParallel, o.Mode)
		if err != nil {
			return rep, fmt.Errorf("deploy %d of %d: %w", k, o.Deploys, err)
		}
		lastGen = gen
		fmt.Fprintf(o.Progress, "deploy: %s (generation %d) started, max_parallel %d\n", id, gen, o.MaxParallel)
		poll := func() (*generation.Status, error) {
			st, err := fleet.status(ctx)
			if err != nil {
				return nil, err
			}
			return st.Deploy, nil
		}
		st, err := watcher.waitDeploy(ctx, id, o.DeployTimeout, poll)
		seen := time.Now()
		if err != nil {
			return rep, err
		}
		if full, err := poll(); err == nil && full != nil && full.ID == id {
			st = *full // the record as STATUS has it, once finished
		}
		run := deployRun(st, sent, seen, watcher.readyHeartbeat)
		run.Load = booksSince(load.snapshot(), before)
		ivs := overlapping(unroutedIntervals(watcher.routeChanges(), time.Now()), sent, seen)
		run.UnroutedIntervals, run.MaxUnroutedMS = len(ivs), millis(longest(ivs))
		rep.Deploys = append(rep.Deploys, run)
		fmt.Fprintf(o.Progress, "deploy: %s %s in %.2fs: %d swaps, overhead p50 %.2f ms max %.2f ms, %d unrouted intervals\n",
			id, run.State, run.WallS, run.Swaps, run.OverheadP50MS, run.OverheadMaxMS, run.UnroutedIntervals)
		if err := sleep(ctx, o.Settle); err != nil {
			return rep, err
		}
	}

	fmt.Fprintf(o.Progress, "deploy: stopping the load, waiting up to %v for the last replies\n", o.Drain)
	rep.figures, _, _ = load.finish(o.Drain)
	var all, outside, gaps []time.Duration
	for _, r := range rep.Deploys {
		all = append(all, r.overheads...)
		outside = append(outside, r.startOutside...)
		gaps = append(gaps, r.gaps...)
	}
	rep.GapP50MS, rep.GapMaxMS = millis(percentile(gaps, 0.5)), millis(percentile(gaps, 1))
	rep.StartOutsideP50MS, rep.StartOutsideMaxMS = millis(percentile(outside, 0.5)), millis(percentile(outside, 1))
	rep.Swaps = len(all)
	rep.OverheadP50MS, rep.OverheadMaxMS = millis(percentile(all, 0.5)), millis(percentile(all, 1))
	ivs := overlapping(unroutedIntervals(watcher.routeChanges(), load.stopped), load.started, load.stopped)
	rep.UnroutedIntervals, rep.MaxUnroutedMS = len(ivs), millis(longest(ivs))
	rep.FeedDrops = watcher.dropCount()
	rep.LoadAvgEnd = loadAverage()

	// Every cluster ends ready on the last generation, and /proc holds exactly
	// the processes STATUS names.
	if _, err := fleet.waitStatus(ctx, 30*time.Second, "every cluster ready on the last generation", func(st *rollStatus) bool {
		for _, c := range st.Clusters {
			if c.Generation != lastGen {
				return false
			}
		}
		return allReady(st)
	}); err != nil {
		rep.fail("%v", err)
	}
	if rep.Procs, err = fleet.checkProcs(ctx); err != nil {
		return rep, err
	}
	rep.check(o, watcher.failed(), load.failure())
	return rep, nil
}

// check lists the broken invariants in rep.Failures.
func (rep *deployReport) check(o deployOptions, feedErr, loadErr error) {
	if loadErr != nil {
		rep.fail("the load's connection failed: %v", loadErr)
	}
	rep.checkFeed(feedErr, "the unrouted check is incomplete")
	if len(rep.Deploys) != o.Deploys {
		rep.fail("%d of %d deploys ran", len(rep.Deploys), o.Deploys)
	}
	for _, r := range rep.Deploys {
		if r.State != string(generation.StateSucceeded) {
			rep.fail("%s %s: %s", r.ID, r.State, r.Reason)
		}
		if r.Swaps != o.Clusters {
			rep.fail("%s moved %d of %d clusters", r.ID, r.Swaps, o.Clusters)
		}
	}
	if why := rep.books.Broken(); why != "" {
		rep.fail("load: %s", why)
	}
	if rep.OK == 0 {
		rep.fail("load: no request succeeded")
	}
	if rep.UnroutedIntervals > 0 && o.Mode != "resume" { // resume: the gap, reported
		rep.fail("%d unrouted intervals under load, the longest %.1f ms (a deploy must never unroute a cluster)", rep.UnroutedIntervals, rep.MaxUnroutedMS)
	}
	rep.checkProcs()
}

// deployRun computes one deploy's figures from its final status.
func deployRun(st generation.Status, sent, seen time.Time, readyHB func(cluster int, gen int64) (readyBeat, bool)) deployResult {
	r := deployResult{ID: st.ID, Generation: st.Generation, State: string(st.State), Reason: st.Reason, ObservedS: seen.Sub(sent).Seconds()}
	if !st.Started.IsZero() && !st.Finished.IsZero() {
		r.WallS = st.Finished.Sub(st.Started).Seconds()
	}
	var ready, drain, lag, outside []time.Duration
	r.overheads = swapOverheads(st)
	for _, c := range st.Clusters {
		if c.ActivatedAt.IsZero() || c.New == nil {
			continue
		}
		r.Swaps++
		if !c.ReadyAt.IsZero() && !c.SpawnedAt.IsZero() {
			ready = append(ready, c.ReadyAt.Sub(c.SpawnedAt))
		}
		if !c.ExitedAt.IsZero() && !c.QuiesceSentAt.IsZero() {
			drain = append(drain, c.ExitedAt.Sub(c.QuiesceSentAt))
		}
		if st.Mode == "resume" && !c.RoutedAt.IsZero() && !c.QuiesceSentAt.IsZero() {
			r.gaps = append(r.gaps, c.RoutedAt.Sub(c.QuiesceSentAt))
		}
		if readyHB != nil && !c.ReadyAt.IsZero() {
			if hb, ok := readyHB(c.New.Cluster, c.New.Generation); ok {
				lag = append(lag, max(0, c.ReadyAt.Sub(hb.At)))
				if hb.Uptime > 0 && !c.SpawnedAt.IsZero() {
					outside = append(outside, max(0, c.ReadyAt.Sub(c.SpawnedAt)-hb.Uptime))
				}
			}
		}
	}
	r.OverheadP50MS, r.OverheadMaxMS = millis(percentile(r.overheads, 0.5)), millis(percentile(r.overheads, 1))
	r.NewReadyP50MS, r.NewReadyMaxMS = millis(percentile(ready, 0.5)), millis(percentile(ready, 1))
	r.OldDrainP50MS, r.OldDrainMaxMS = millis(percentile(drain, 0.5)), millis(percentile(drain, 1))
	r.ReadyLagP50MS, r.ReadyLagMaxMS = millis(percentile(lag, 0.5)), millis(percentile(lag, 1))
	r.GapP50MS, r.GapMaxMS = millis(percentile(r.gaps, 0.5)), millis(percentile(r.gaps, 1))
	r.startOutside = outside
	r.StartOutsideP50MS, r.StartOutsideMaxMS = millis(percentile(outside, 0.5)), millis(percentile(outside, 1))
	return r
}

// swapOverheads is, per cluster the deploy ACTIVATEd, the manager's own time
// beyond the harness's: routing the new process once it is ready
// (routed_at − ready_at), ACTIVATing it once the old one is gone
// (activated_at − exited_at), and starting the swap once a slot is free
// (spawned_at − the latest activation before it, or the deploy's start: for
// max_parallel 1, the previous cluster's activated_at). A resume-handoff
// deploy's steps come in another order: see resumeOverhead.
func swapOverheads(st generation.Status) []time.Duration {
	var out []time.Duration
	for i, c := range st.Clusters {
		if c.ActivatedAt.IsZero() || c.SpawnedAt.IsZero() {
			continue
		}
		if st.Mode == "resume" {
			out = append(out, resumeOverhead(st, i))
			continue
		}
		var o time.Duration
		if !c.ReadyAt.IsZero() && !c.RoutedAt.IsZero() {
			o += max(0, c.RoutedAt.Sub(c.ReadyAt))
		}
		if !c.ExitedAt.IsZero() {
			o += max(0, c.ActivatedAt.Sub(c.ExitedAt))
		}
		prev := st.Started
		for j, d := range st.Clusters {
			if j != i && !d.ActivatedAt.IsZero() && !d.ActivatedAt.After(c.SpawnedAt) && d.ActivatedAt.After(prev) {
				prev = d.ActivatedAt
			}
		}
		if !prev.IsZero() {
			o += max(0, c.SpawnedAt.Sub(prev))
		}
		out = append(out, o)
	}
	return out
}

// resumeOverhead is swapOverheads' figure for cluster i of a resume-handoff
// deploy: spawning the new process once the old is gone (spawned_at −
// exited_at), routing it once ready (routed_at − ready_at) and ACTIVATing it
// (activated_at − routed_at), and starting the swap once a slot is free
// (quiesce_sent_at − the latest activation before it, or the deploy's start).
func resumeOverhead(st generation.Status, i int) time.Duration {
	c := st.Clusters[i]
	o := max(0, c.SpawnedAt.Sub(c.ExitedAt)) + max(0, c.ActivatedAt.Sub(c.RoutedAt))
	if !c.ReadyAt.IsZero() && !c.RoutedAt.IsZero() {
		o += max(0, c.RoutedAt.Sub(c.ReadyAt))
	}
	prev := st.Started
	for j, d := range st.Clusters {
		if j != i && !d.ActivatedAt.IsZero() && !d.ActivatedAt.After(c.QuiesceSentAt) && d.ActivatedAt.After(prev) {
			prev = d.ActivatedAt
		}
	}
	if !prev.IsZero() && !c.QuiesceSentAt.IsZero() {
		o += max(0, c.QuiesceSentAt.Sub(prev))
	}
	return o
}

// longest is the longest of ivs.
func longest(ivs []unroutedInterval) time.Duration {
	var d time.Duration
	for _, iv := range ivs {
		d = max(d, iv.To.Sub(iv.From))
	}
	return d
}

// booksSince is what happened to the books between before and after.
func booksSince(after, before books) books { return after.sub(before) }

// WriteText prints the report as a table for people.
func (rep *deployReport) WriteText(w io.Writer) {
	fmt.Fprintf(w, "deploy: %d clusters × %d shards, %d rolling deploys at max_parallel %d, under %d requests in flight (%s targets); harness connect-delay %.0f ms; %d CPUs (%s); %s\n\n",
		rep.Clusters, rep.ShardsPerCluster, len(rep.Deploys), rep.MaxParallel, rep.InFlight, rep.Targets, rep.ConnectDelayMS, rep.CPUs, cpuModel(), rep.Date)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "deploy\tstate\twall s\tswaps\toverhead/swap p50 µs\tmax µs\tnew ready p50 ms\tstart outside harness p50 ms\tmax ms\tready lag p50 ms\told drain p50 ms\trequests\tok\terrors\tlost\tdup\tunrouted\tlongest unrouted ms\t")
	for _, r := range rep.Deploys {
		fmt.Fprintf(tw, "%s\t%s\t%.2f\t%d\t%.1f\t%.1f\t%.0f\t%.1f\t%.1f\t%.2f\t%.0f\t%d\t%d\t%d\t%d\t%d\t%d\t%.0f\t\n",
			r.ID, r.State, r.WallS, r.Swaps, r.OverheadP50MS*1000, r.OverheadMaxMS*1000, r.NewReadyP50MS, r.StartOutsideP50MS, r.StartOutsideMaxMS,
			r.ReadyLagP50MS, r.OldDrainP50MS, r.Load.Sent, r.Load.OK, r.Load.ErrorCount(), r.Load.Lost, r.Load.Duplicates, r.UnroutedIntervals, r.MaxUnroutedMS)
	}
	tw.Flush()
	fmt.Fprintln(w)
	fmt.Fprintf(w, "load: %d sent over %.1f s, %.0f req/s; ok %d, errors %d %v, lost %d, duplicates %d; latency p50 %.2f ms, p99 %.2f ms, max %.1f ms\n",
		rep.Sent, rep.LoadS, rep.ReqPerS, rep.OK, rep.ErrorCount(), errorCodes(rep.Errors), rep.Lost, rep.Duplicates, rep.P50US/1000, rep.P99US/1000, rep.MaxUS/1000)
	formula := "(routed−ready) + (activated−exited) + (spawned − slot freed)"
	if rep.Mode == "resume" {
		formula = "(spawned−exited) + (routed−ready) + (activated−routed) + (quiesce sent − slot freed)"
	}
	fmt.Fprintf(w, "manager overhead per swap, %s: p50 %.1f µs, max %.1f µs over %d swaps  (target: ≤ %.0f ms → %s)\n",
		formula, rep.OverheadP50MS*1000, rep.OverheadMaxMS*1000, rep.Swaps, millis(targetSwapOverhead), met(rep.Swaps > 0 && rep.OverheadMaxMS <= millis(targetSwapOverhead)))
	fmt.Fprintf(w, "new process's start outside the harness's own uptime (fork, exec, ready heartbeat to the loop): p50 %.1f ms, max %.1f ms\n",
		rep.StartOutsideP50MS, rep.StartOutsideMaxMS)
	if rep.Mode == "resume" {
		fmt.Fprintf(w, "resume-handoff gap per cluster (QUIESCE sent → new process routed; requests wait): p50 %.1f ms, max %.1f ms; longest unrouted interval seen on the feed %.0f ms (%d intervals)\n",
			rep.GapP50MS, rep.GapMaxMS, rep.MaxUnroutedMS, rep.UnroutedIntervals)
	} else {
		fmt.Fprintf(w, "longest unrouted interval: %.0f ms (%d intervals)  (target: 0 → %s)\n",
			rep.MaxUnroutedMS, rep.UnroutedIntervals, met(rep.UnroutedIntervals == 0))
	}
	fmt.Fprintf(w, "cluster processes at the end: %d live, %d zombies, %d orphans, %d strays\n",
		rep.Procs.Live, rep.Procs.Zombies, rep.Procs.Orphans, rep.Procs.Strays)
	fmt.Fprintf(w, "machine load average (1, 5, 15 min): %s at the start, %s at the end\n", rep.LoadAvgStart, rep.LoadAvgEnd)
	for _, f := range rep.Failures {
		fmt.Fprintf(w, "FAILED: %s\n", f)
	}
}

// errorCodes renders error counts compactly ("{}" for none).
func errorCodes(m map[string]uint64) string {
	if len(m) == 0 {
		return "{}"
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// WriteJSON prints the report as one JSON line.
func (rep *deployReport) WriteJSON(w io.Writer) error {
	return json.NewEncoder(w).Encode(rep)
}

func runDeployCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o := defaultDeployOptions
	fs := newScenarioFlags("deploy", stderr, &o.ManagerBin, &o.HarnessBin)
	fs.IntVar(&o.Clusters, "clusters", o.Clusters, "clusters")
	fs.IntVar(&o.ShardsPerCluster, "shards-per-cluster", o.ShardsPerCluster, "shards per cluster")
	fs.IntVar(&o.Deploys, "deploys", o.Deploys, "rolling deploys of every cluster, back to back")
	fs.IntVar(&o.MaxParallel, "max-parallel", o.MaxParallel, "the deploys' max_parallel")
	fs.StringVar(&o.Mode, "mode", "", `the deploys' mode: "" (overlap) or "resume" (reports the gap per cluster)`)
	o.rollLoadOptions.flags(fs)
	fs.DurationVar(&o.ConnectDelay, "connect-delay", o.ConnectDelay, "the harness's --connect-delay: time each shard takes to connect")
	fs.DurationVar(&o.OpDelay, "op-delay", o.OpDelay, "the harness's --op-delay: time each request takes in the cluster")
	fs.DurationVar(&o.Settle, "settle", o.Settle, "load before the first deploy and between deploys")
	fs.DurationVar(&o.DeployTimeout, "deploy-timeout", o.DeployTimeout, "bound on each deploy")
	fs.DurationVar(&o.Drain, "drain", o.Drain, "wait for the last replies before counting them lost")
	fs.StringVar(&o.LogPath, "log", "", "keep the manager's and clusters' log in this file")
	var err error
	if o.Progress, err = fs.parse(args); err != nil {
		return err
	}
	rep, err := runDeploy(ctx, o)
	return finishReport("deploy", stdout, rep, rep != nil && (len(rep.Deploys) > 0 || err == nil), err)
}
