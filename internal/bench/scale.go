package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/sm-supervisor/sm/manager"
)

// scaleOptions shape the scale scenario: many clusters of several shards on
// one machine, the manager's footprint at steady heartbeat, and a full
// rolling deploy under a light load.
type scaleOptions struct {
	ManagerBin string
	HarnessBin string

	Clusters         int
	ShardsPerCluster int
	// Settle is the pause between the last cluster becoming ready and the
	// sample, so that start-up work does not count as steady state.
	Settle time.Duration
	// Sample is how long the manager's CPU and memory are sampled.
	Sample time.Duration
	// MaxParallel is the deploy's max_parallel.
	MaxParallel int
	// The light load during the deploy: workers, and requests/s over all.
	InFlight int
	Rate     float64
	// StartTimeout and DeployTimeout bound the start of every cluster and
	// the deploy; StopTimeout the manager's exit after SIGTERM.
	StartTimeout  time.Duration
	DeployTimeout time.Duration
	StopTimeout   time.Duration
	// SkipDeploy measures start and steady state only.
	SkipDeploy bool
	// ManagerCPUProfile, if set, is where the manager writes a CPU profile
	// of its whole life (its hidden -cpuprofile flag).
	ManagerCPUProfile string

	Progress io.Writer
}

// defaultScaleOptions are issue 7's scale scenario: 512 clusters, 4096 shards.
var defaultScaleOptions = scaleOptions{
	Clusters:         512,
	ShardsPerCluster: 8,
	Settle:           5 * time.Second,
	Sample:           10 * time.Second,
	MaxParallel:      16,
	InFlight:         8,
	Rate:             200,
	StartTimeout:     5 * time.Minute,
	DeployTimeout:    15 * time.Minute,
	StopTimeout:      3 * time.Minute,
}

// Issue 7's targets for 512 clusters at steady heartbeat.
const (
	targetScaleRSSMiB     = 100.0
	targetScaleCPUPercent = 5.0
)

// scaleReport is what the scale scenario measured: one JSON line.
type scaleReport struct {
	Scenario         string  `json:"scenario"` // "scale"
	Clusters         int     `json:"clusters"`
	Shards           int     `json:"shards"`
	HeartbeatMS      int64   `json:"heartbeat_interval_ms"`
	MemAvailableKiB  int64   `json:"mem_available_kib"` // before the start
	StartS           float64 `json:"start_s"`           // manager start to every cluster ready and routed
	SampleS          float64 `json:"sample_s"`
	ManagerRSSKiB    int64   `json:"manager_rss_kib"`     // at the end of the sample
	ManagerRSSMaxKiB int64   `json:"manager_rss_max_kib"` // highest of the samples (one a second)
	ManagerCPUPct    float64 `json:"manager_cpu_percent"` // of one core, over the sample
	ManagerFDs       int     `json:"manager_fds"`
	ManagerThreads   int     `json:"manager_threads"`
	OthersCPUPct     float64 `json:"others_cpu_percent"` // the rest of the machine during the sample, of one core
	ClustersRSSKiB   int64   `json:"clusters_rss_kib"`   // all cluster processes together
	StatusBytes      int     `json:"status_bytes"`       // size of a STATUS reply

	// The deploy: every cluster, max_parallel, under the light load.
	DeployMaxParallel      int     `json:"deploy_max_parallel,omitempty"`
	DeployS                float64 `json:"deploy_s,omitempty"`
	DeployState            string  `json:"deploy_state,omitempty"`
	ManagerRSSDeployMaxKiB int64   `json:"manager_rss_deploy_max_kib,omitempty"`
	LoadInFlight           int     `json:"load_in_flight,omitempty"`
	LoadRate               float64 `json:"load_rate,omitempty"`
	books
	P50US float64 `json:"p50_us,omitempty"`
	P99US float64 `json:"p99_us,omitempty"`
	MaxUS float64 `json:"max_us,omitempty"`

	// Restarts counts cluster restarts the manager recorded (hung or dead
	// clusters): none is expected.
	Restarts   int     `json:"restarts"`
	StopS      float64 `json:"stop_s"` // SIGTERM to the manager's exit
	LeftBehind int     `json:"left_behind"`
}

func (o scaleOptions) withDefaults() scaleOptions {
	d := defaultScaleOptions
	orDefault(&o.Clusters, d.Clusters)
	orDefault(&o.ShardsPerCluster, d.ShardsPerCluster)
	orDefault(&o.Settle, d.Settle)
	orDefault(&o.Sample, d.Sample)
	orDefault(&o.MaxParallel, d.MaxParallel)
	orDefault(&o.InFlight, d.InFlight)
	if o.Rate < 0 {
		o.Rate = d.Rate
	}
	orDefault(&o.StartTimeout, d.StartTimeout)
	orDefault(&o.DeployTimeout, d.DeployTimeout)
	orDefault(&o.StopTimeout, d.StopTimeout)
	orDefaultIfZero(&o.Progress, io.Discard)
	return o
}

// Broken describes the invariants broken: any error, loss or duplicate in the
// deploy's load, a failed deploy, a cluster restart, a process left behind.
func (r *scaleReport) Broken() string {
	var why []string
	if b := r.books.Broken(); b != "" {
		why = append(why, "load during the deploy: "+b)
	}
	if r.DeployState != "" && r.DeployState != "succeeded" {
		why = append(why, "deploy "+r.DeployState)
	}
	if r.Restarts > 0 {
		why = append(why, fmt.Sprintf("%d cluster restarts", r.Restarts))
	}
	if r.LeftBehind > 0 {
		why = append(why, fmt.Sprintf("%d cluster processes left after SIGTERM", r.LeftBehind))
	}
	return strings.Join(why, ", ")
}

// runScale runs the scenario. The report holds what was measured even with an error.
func runScale(ctx context.Context, o scaleOptions) (rep *scaleReport, err error) {
	o = o.withDefaults()
	rep = &scaleReport{Scenario: "scale", Clusters: o.Clusters, Shards: o.Clusters * o.ShardsPerCluster}
	sc, err := newScratch("sm-bench-", "scale.log", "")
	if err != nil {
		return rep, err
	}
	defer func() { err = sc.close(err) }()
	return rep, scale(ctx, o, sc, rep)
}

// scaleKiBPerCluster is what one simulated cluster process is budgeted in
// memory before the start: ~8 MiB measured, with room.
const scaleKiBPerCluster = 16 << 10

func scale(ctx context.Context, o scaleOptions, sc *scratch, rep *scaleReport) (err error) {
	if rep.MemAvailableKiB, err = memAvailableKiB(); err != nil {
		return err
	}
	if need := int64(o.Clusters)*scaleKiBPerCluster + 1<<20; rep.MemAvailableKiB < need {
		return fmt.Errorf("scale: %d clusters want about %d MiB free, and %d MiB are available",
			o.Clusters, need>>10, rep.MemAvailableKiB>>10)
	}
	f, err := newFleet(sc, o.HarnessBin, o.Clusters, o.ShardsPerCluster, "")
	if err != nil {
		return err
	}
	rep.HeartbeatMS = f.cfg.Heartbeat.Interval.Milliseconds()
	defer func() { err = f.close(err) }()

	fmt.Fprintf(o.Progress, "scale: starting sm-manager with %d clusters of %d shards (%d MiB available)\n",
		o.Clusters, o.ShardsPerCluster, rep.MemAvailableKiB>>10)
	start := time.Now()
	if err := f.start(ctx, o.ManagerBin, cpuProfileFlags(o.ManagerCPUProfile)...); err != nil {
		return err
	}
	lastLine := time.Now()
	st, err := f.waitReady(ctx, o.StartTimeout, 250*time.Millisecond, func(st manager.Status) {
		if time.Since(lastLine) >= 5*time.Second {
			lastLine = time.Now()
			fmt.Fprintf(o.Progress, "scale: %d of %d clusters ready after %.0fs\n", readyCount(st), len(st.Clusters), time.Since(start).Seconds())
		}
	})
	if err != nil {
		return err
	}
	rep.StartS = time.Since(start).Seconds()
	fmt.Fprintf(o.Progress, "scale: every cluster ready after %.1fs; settling %v, then sampling %v\n", rep.StartS, o.Settle, o.Sample)
	if err := sleep(ctx, o.Settle); err != nil {
		return err
	}
	if err := scaleSample(ctx, o, f.mgr, rep); err != nil {
		return err
	}
	if b, err := json.Marshal(st); err == nil {
		rep.StatusBytes = len(b)
	}
	for _, pid := range f.mgr.clusters {
		if rss, err := readRSS(pid); err == nil {
			rep.ClustersRSSKiB += rss
		}
	}
	fmt.Fprintf(o.Progress, "scale: manager RSS %.1f MiB, CPU %.2f%% of a core (others %.0f%%)\n",
		float64(rep.ManagerRSSKiB)/1024, rep.ManagerCPUPct, rep.OthersCPUPct)

	if !o.SkipDeploy {
		if err := scaleDeploy(ctx, o, f.cfg.Socket, f.mgr, rep); err != nil {
			return err
		}
	}
	if st, err := f.refresh(ctx, 10*time.Second); err == nil {
		for _, c := range st.Clusters {
			rep.Restarts += c.Restarts
		}
	}

	fmt.Fprintf(o.Progress, "scale: stopping sm-manager (SIGTERM)\n")
	t0 := time.Now()
	stopErr := f.stop(o.StopTimeout)
	rep.StopS = time.Since(t0).Seconds()
	rep.LeftBehind = f.reap()
	fmt.Fprintf(o.Progress, "scale: manager exited %.1fs after SIGTERM; %d cluster processes left\n", rep.StopS, rep.LeftBehind)
	return stopErr
}

// scaleSample measures the manager at steady heartbeat: CPU (schedstat, in
// ns) and the machine's over the window, RSS once a second.
func scaleSample(ctx context.Context, o scaleOptions, mgr *managerProc, rep *scaleReport) error {
	pid := mgr.pid()
	s, err := sampleManager(ctx, pid, o.Sample)
	if err != nil {
		return err
	}
	rep.SampleS = s.elapsed.Seconds()
	rep.ManagerRSSKiB, rep.ManagerRSSMaxKiB = s.rssKiB, s.peakRSSKiB
	rep.ManagerCPUPct = s.cpuPercent()
	// Everything but the manager, the bench included (it sits idle meanwhile).
	rep.OthersCPUPct = percentOf(s.machine-s.cpu, s.elapsed)
	rep.ManagerFDs, _ = countFDs(pid)
	if ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid)); err == nil {
		rep.ManagerThreads = len(ents)
	}
	return nil
}

// scaleDeploy rolls every cluster with max_parallel under the light load.
func scaleDeploy(ctx context.Context, o scaleOptions, socket string, mgr *managerProc, rep *scaleReport) error {
	load, err := startClientLoad(ctx, clientLoadConfig{
		socket: socket, clients: 1, workers: o.InFlight, rate: o.Rate,
		target: clusterTarget(o.Clusters, o.InFlight), payload: echoPayload(200),
		timeout: 15 * time.Second,
	})
	if err != nil {
		return err
	}
	rep.DeployMaxParallel, rep.LoadInFlight, rep.LoadRate = o.MaxParallel, o.InFlight, o.Rate
	dc, err := dialRetry(ctx, socket, "sm-bench-deploy", false, nil)
	if err != nil {
		load.end()
		return err
	}
	defer dc.Close()
	fmt.Fprintf(o.Progress, "scale: load of %d in flight at %.0f req/s; deploying every cluster, max_parallel %d\n", o.InFlight, o.Rate, o.MaxParallel)
	if err := sleep(ctx, time.Second); err != nil {
		load.end()
		return err
	}
	// RSS while the deploy runs, once a second.
	rssDone := make(chan struct{})
	rssStop := make(chan struct{})
	go func() {
		defer close(rssDone)
		for {
			if rss, err := readRSS(mgr.pid()); err == nil {
				rep.ManagerRSSDeployMaxKiB = max(rep.ManagerRSSDeployMaxKiB, rss)
			}
			select {
			case <-rssStop:
				return
			case <-time.After(time.Second):
			}
		}
	}()
	t0 := time.Now()
	d, derr := mgrDeploy(ctx, dc, nil, o.MaxParallel, o.DeployTimeout, time.Second)
	rep.DeployS = time.Since(t0).Seconds()
	close(rssStop)
	<-rssDone
	if d != nil {
		rep.DeployState = string(d.State)
		if !d.Started.IsZero() && !d.Finished.IsZero() {
			rep.DeployS = d.Finished.Sub(d.Started).Seconds()
		}
	}
	sleep(ctx, time.Second)
	rep.books = load.end()
	lat := load.latency()
	rep.P50US, rep.P99US, rep.MaxUS = latencyUS(&lat)
	fmt.Fprintf(o.Progress, "scale: deploy %s in %.1fs; load: %d sent, %d ok, %s failed, %d lost\n",
		rep.DeployState, rep.DeployS, rep.Sent, rep.OK, errorsText(rep.books), rep.Lost)
	return derr
}

// WriteText prints the report for people.
func (r *scaleReport) WriteText(w io.Writer) {
	fmt.Fprintf(w, "scale: %d clusters × %d shards = %d shards, heartbeat every %d ms; %d CPUs (%s), %d MiB available at the start\n\n",
		r.Clusters, r.Shards/max(r.Clusters, 1), r.Shards, r.HeartbeatMS, runtime.NumCPU(), cpuModel(), r.MemAvailableKiB>>10)
	fmt.Fprintf(w, "  start (manager start → every cluster ready and routed)  %8.1f s\n", r.StartS)
	fmt.Fprintf(w, "  manager RSS at steady heartbeat                         %8.1f MiB (max %.1f)  (target ≤ %.0f MB → %s)\n",
		float64(r.ManagerRSSKiB)/1024, float64(r.ManagerRSSMaxKiB)/1024, targetScaleRSSMiB, met(float64(r.ManagerRSSMaxKiB)*1024 <= targetScaleRSSMiB*1e6))
	fmt.Fprintf(w, "  manager CPU at steady heartbeat (%.0f s)                  %8.2f %% of a core  (target ≤ %.0f%% → %s)\n",
		r.SampleS, r.ManagerCPUPct, targetScaleCPUPercent, met(r.ManagerCPUPct <= targetScaleCPUPercent))
	fmt.Fprintf(w, "  the rest of the machine meanwhile                       %8.0f %% of a core\n", r.OthersCPUPct)
	fmt.Fprintf(w, "  manager fds, threads                                    %8d, %d\n", r.ManagerFDs, r.ManagerThreads)
	fmt.Fprintf(w, "  all cluster processes' RSS                              %8.0f MiB (%.1f MiB each)\n",
		float64(r.ClustersRSSKiB)/1024, float64(r.ClustersRSSKiB)/1024/float64(max(r.Clusters, 1)))
	fmt.Fprintf(w, "  STATUS reply                                            %8.0f KiB\n", float64(r.StatusBytes)/1024)
	if r.DeployMaxParallel > 0 {
		fmt.Fprintf(w, "  full deploy, max_parallel %-3d                           %8.1f s, %s; manager RSS max %.1f MiB\n",
			r.DeployMaxParallel, r.DeployS, r.DeployState, float64(r.ManagerRSSDeployMaxKiB)/1024)
		fmt.Fprintf(w, "  load during the deploy (%d in flight, %.0f req/s)          %d sent, %d ok, %s failed, %d lost, %d dup; p50 %.0f µs, p99 %.0f µs, max %.0f µs\n",
			r.LoadInFlight, r.LoadRate, r.Sent, r.OK, errorsText(r.books), r.Lost, r.Duplicates, r.P50US, r.P99US, r.MaxUS)
	}
	fmt.Fprintf(w, "  cluster restarts                                        %8d\n", r.Restarts)
	fmt.Fprintf(w, "  SIGTERM → manager exit                                  %8.1f s; cluster processes left: %d\n", r.StopS, r.LeftBehind)
}

// WriteJSON prints the report as one JSON line.
func (r *scaleReport) WriteJSON(w io.Writer) error { return json.NewEncoder(w).Encode(r) }

func runScaleCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o := defaultScaleOptions
	fs := newScenarioFlags("scale", stderr, &o.ManagerBin, &o.HarnessBin)
	fs.IntVar(&o.Clusters, "clusters", o.Clusters, "clusters")
	fs.IntVar(&o.ShardsPerCluster, "shards-per-cluster", o.ShardsPerCluster, "shards per cluster")
	fs.DurationVar(&o.Settle, "settle", o.Settle, "pause after every cluster is ready, before the sample")
	fs.DurationVar(&o.Sample, "sample", o.Sample, "how long the manager is sampled at steady heartbeat")
	fs.IntVar(&o.MaxParallel, "max-parallel", o.MaxParallel, "the deploy's max_parallel")
	fs.IntVar(&o.InFlight, "inflight", o.InFlight, "workers of the light load during the deploy")
	fs.Float64Var(&o.Rate, "rate", o.Rate, "requests per second of that load (0: closed-loop)")
	fs.BoolVar(&o.SkipDeploy, "no-deploy", false, "skip the deploy")
	fs.StringVar(&o.ManagerCPUProfile, "manager-cpuprofile", "", "write a CPU profile of sm-manager to this file (at its exit)")
	fs.DurationVar(&o.StartTimeout, "start-timeout", o.StartTimeout, "bound on the start of every cluster")
	fs.DurationVar(&o.DeployTimeout, "deploy-timeout", o.DeployTimeout, "bound on the deploy")
	var err error
	if o.Progress, err = fs.parse(args); err != nil {
		return err
	}
	rep, err := runScale(ctx, o)
	return finishReport("scale", stdout, rep, rep.StartS > 0, err)
}
