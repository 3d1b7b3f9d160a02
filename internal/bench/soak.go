package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/sm-supervisor/sm/ipc"
)

// soakOptions shape the soak scenario: a bounded run under steady load with
// periodic cluster kills and deploys, sampling the manager's goroutines, fds
// and RSS, which must not grow (see growth.go for the rule).
type soakOptions struct {
	ManagerBin string
	HarnessBin string

	Duration     time.Duration
	Clusters     int
	InFlight     int
	Rate         float64 // requests/s over all workers; 0 is closed-loop
	PayloadBytes int
	SampleEvery  time.Duration
	// KillEvery: SIGKILL a random cluster's process this often (0: never).
	KillEvery time.Duration
	// DeployEvery: a deploy of every cluster, DeployParallel at a time,
	// this often (0: never).
	DeployEvery    time.Duration
	DeployParallel int
	// SamplesFile, if set, receives every sample as CSV.
	SamplesFile string

	Progress io.Writer
}

// defaultSoakOptions are the documented soak: ten minutes.
var defaultSoakOptions = soakOptions{
	Duration:       10 * time.Minute,
	Clusters:       16,
	InFlight:       16,
	Rate:           1000,
	PayloadBytes:   200,
	SampleEvery:    5 * time.Second,
	KillEvery:      20 * time.Second,
	DeployEvery:    90 * time.Second,
	DeployParallel: 4,
}

// soakSample is one reading of the manager.
type soakSample struct {
	AtS        float64 `json:"at_s"` // since the load started
	Goroutines float64 `json:"goroutines"`
	FDs        float64 `json:"fds"`      // /proc/<pid>/fd
	OpenFDs    float64 `json:"open_fds"` // process_open_fds, from the metrics
	RSSKiB     float64 `json:"rss_kib"`
	HeapKiB    float64 `json:"heap_inuse_kib"`
}

// soakReport is what the soak measured: one JSON line.
type soakReport struct {
	Scenario    string  `json:"scenario"` // "soak"
	DurationS   float64 `json:"duration_s"`
	Clusters    int     `json:"clusters"`
	InFlight    int     `json:"in_flight"`
	Rate        float64 `json:"rate"`
	SampleEvery float64 `json:"sample_every_s"`
	Kills       int     `json:"kills"`
	// KillRecoverMaxS is the longest a killed cluster took to be routed again.
	KillRecoverMaxS float64 `json:"kill_recover_max_s"`
	Deploys         int     `json:"deploys"`
	// DeployErrors: deploys that did not succeed (or could not start).
	DeployErrors []string `json:"deploy_errors,omitempty"`
	books
	// Unexplained counts error replies outside every window in which a
	// kill allows them (a deploy allows none).
	Unexplained uint64  `json:"unexplained"`
	ReqPerS     float64 `json:"req_per_s"`
	P50US       float64 `json:"p50_us"`
	P99US       float64 `json:"p99_us"`
	MaxUS       float64 `json:"max_us"`

	Goroutines growthVerdict `json:"goroutines"`
	FDs        growthVerdict `json:"fds"`
	RSS        growthVerdict `json:"rss_kib"`
	LeftBehind int           `json:"left_behind"`

	samples []soakSample
	options soakOptions
}

func (o soakOptions) withDefaults() soakOptions {
	d := defaultSoakOptions
	orDefault(&o.Duration, d.Duration)
	orDefault(&o.Clusters, d.Clusters)
	orDefault(&o.InFlight, d.InFlight)
	if o.Rate < 0 {
		o.Rate = d.Rate
	}
	orDefault(&o.PayloadBytes, d.PayloadBytes)
	orDefault(&o.SampleEvery, d.SampleEvery)
	orDefault(&o.DeployParallel, d.DeployParallel)
	orDefaultIfZero(&o.Progress, io.Discard)
	return o
}

// Broken describes the invariants broken: growth, a lost, duplicate or
// unknown reply, an error reply no kill explains, a failed deploy, a process
// left after SIGTERM.
func (r *soakReport) Broken() string {
	var why []string
	for _, v := range []growthVerdict{r.Goroutines, r.FDs, r.RSS} {
		if v.Grew {
			why = append(why, v.String())
		}
	}
	why = append(why, r.books.replyFaults()...)
	if r.Unexplained > 0 {
		why = append(why, fmt.Sprintf("%d error replies outside the kills' windows (%s in all)", r.Unexplained, errorsText(r.books)))
	}
	for _, e := range r.DeployErrors {
		why = append(why, "deploy: "+e)
	}
	if r.LeftBehind > 0 {
		why = append(why, fmt.Sprintf("%d cluster processes left after SIGTERM", r.LeftBehind))
	}
	return strings.Join(why, ", ")
}

// runSoak runs the scenario. The report holds what was measured even with an error.
func runSoak(ctx context.Context, o soakOptions) (rep *soakReport, err error) {
	o = o.withDefaults()
	rep = &soakReport{Scenario: "soak", Clusters: o.Clusters, InFlight: o.InFlight, Rate: o.Rate,
		SampleEvery: o.SampleEvery.Seconds(), options: o}
	sc, err := newScratch("sm-bench-", "soak.log", "")
	if err != nil {
		return rep, err
	}
	defer func() { err = sc.close(err) }()
	err = soak(ctx, o, sc, rep)
	rep.judge()
	if o.SamplesFile != "" {
		if werr := rep.writeSamples(o.SamplesFile); err == nil {
			err = werr
		}
	}
	return rep, err
}

// killWindow is when requests to a killed cluster may fail: from the kill
// until its new process is routed, and a grace for replies under way.
type killWindow struct {
	cluster    string
	from, till time.Time
}

const killGrace = time.Second

func soak(ctx context.Context, o soakOptions, sc *scratch, rep *soakReport) (err error) {
	admin, err := freeLoopbackAddr()
	if err != nil {
		return err
	}
	f, err := newFleet(sc, o.HarnessBin, o.Clusters, 1, admin)
	if err != nil {
		return err
	}
	defer func() { err = f.close(err) }()
	fmt.Fprintf(o.Progress, "soak: starting sm-manager with %d clusters, metrics on %s\n", o.Clusters, admin)
	if err := f.start(ctx, o.ManagerBin); err != nil {
		return err
	}
	if _, err := f.waitReady(ctx, readyTimeout(o.Clusters), 50*time.Millisecond, nil); err != nil {
		return err
	}
	if _, err := scrapeMetrics(ctx, admin, "go_goroutines"); err != nil {
		return fmt.Errorf("the manager's metrics on %s: %w", admin, err)
	}

	load, err := startClientLoad(ctx, clientLoadConfig{
		socket: f.cfg.Socket, clients: 2, workers: o.InFlight, rate: o.Rate,
		target: clusterTarget(o.Clusters, o.InFlight), payload: echoPayload(o.PayloadBytes),
		timeout: f.cfg.Requests.Timeout.Duration + 5*time.Second,
	})
	if err != nil {
		return err
	}
	start := time.Now()
	fmt.Fprintf(o.Progress, "soak: %d clusters ready; load %d in flight%s for %v; a sample every %v, a kill every %v, a deploy every %v\n",
		o.Clusters, o.InFlight, rateNote(o.Rate), o.Duration, o.SampleEvery, o.KillEvery, o.DeployEvery)

	runCtx, cancel := context.WithTimeout(ctx, o.Duration)
	defer cancel()
	var wg sync.WaitGroup
	var sampleErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		sampleErr = soakSampler(runCtx, o, f.mgr.pid(), admin, start, rep)
	}()
	windows, actErr := soakActions(runCtx, o, f.ctl, start, rep)
	cancel()
	wg.Wait()

	books := load.end()
	el := time.Since(start)
	rep.DurationS = el.Seconds()
	rep.books = books
	lat := load.latency()
	rep.ReqPerS = float64(books.OK) / el.Seconds()
	rep.P50US, rep.P99US, rep.MaxUS = latencyUS(&lat)
	rep.Unexplained = unexplained(load.failuresSoFar(), windows) + load.droppedFailures()

	f.refresh(ctx, 5*time.Second)
	fmt.Fprintf(o.Progress, "soak: stopping sm-manager (SIGTERM)\n")
	stopErr := f.stop(time.Minute)
	rep.LeftBehind = f.reap()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return errors.Join(actErr, sampleErr, stopErr)
}

func (l *clientLoad) droppedFailures() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.dropped
}

// unexplained counts the failures that no kill window covers: an error reply
// is allowed only for a request aimed at a cluster killed before the reply
// came, and sent before the cluster was routed again.
func unexplained(fails []loadFailure, windows []killWindow) uint64 {
	var n uint64
	for _, f := range fails {
		ok := false
		for _, w := range windows {
			if f.target == w.cluster && f.code == ipc.CodeUnavailable && !f.at.Before(w.from) && !f.sent.After(w.till) {
				ok = true
				break
			}
		}
		if !ok {
			n++
		}
	}
	return n
}

// soakSampler reads the manager every SampleEvery until ctx is done.
func soakSampler(ctx context.Context, o soakOptions, pid int, admin string, start time.Time, rep *soakReport) error {
	t := time.NewTicker(o.SampleEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		s := soakSample{AtS: time.Since(start).Seconds()}
		m, err := scrapeMetrics(ctx, admin, "go_goroutines", "process_open_fds", "go_memstats_heap_inuse_bytes")
		if err != nil {
			if runOver(ctx) {
				return nil // the scrape met the run's end
			}
			return fmt.Errorf("sample at %.0fs: %w", s.AtS, err)
		}
		s.Goroutines, s.OpenFDs, s.HeapKiB = m["go_goroutines"], m["process_open_fds"], m["go_memstats_heap_inuse_bytes"]/1024
		fds, err := countFDs(pid)
		if err != nil {
			return err
		}
		rss, err := readRSS(pid)
		if err != nil {
			return err
		}
		s.FDs, s.RSSKiB = float64(fds), float64(rss)
		rep.samples = append(rep.samples, s)
		if len(rep.samples)%12 == 1 {
			fmt.Fprintf(o.Progress, "soak: %4.0fs: %3.0f goroutines, %3.0f fds, RSS %.1f MiB, heap %.1f MiB\n",
				s.AtS, s.Goroutines, s.FDs, s.RSSKiB/1024, s.HeapKiB/1024)
		}
	}
}

// runOver reports whether ctx is done or past its deadline: a dial that
// uses the deadline can fail on it a moment before ctx.Err says so.
func runOver(ctx context.Context) bool {
	dl, ok := ctx.Deadline()
	return ctx.Err() != nil || ok && !time.Now().Before(dl)
}

// soakActions kills a random cluster every KillEvery and deploys every
// DeployEvery, one action at a time, until ctx is done. It returns the
// windows in which the kills allow errors.
func soakActions(ctx context.Context, o soakOptions, ctl *ipc.Client, start time.Time, rep *soakReport) ([]killWindow, error) {
	var windows []killWindow
	nextKill, nextDeploy := never, never
	if o.KillEvery > 0 {
		nextKill = start.Add(o.KillEvery)
	}
	if o.DeployEvery > 0 {
		nextDeploy = start.Add(o.DeployEvery)
	}
	for {
		next := nextKill
		if nextDeploy.Before(next) {
			next = nextDeploy
		}
		if sleep(ctx, time.Until(next)) != nil {
			return windows, nil
		}
		if !nextDeploy.After(time.Now()) {
			nextDeploy = nextDeploy.Add(o.DeployEvery)
			d, err := mgrDeploy(ctx, ctl, nil, o.DeployParallel, 2*time.Minute, 100*time.Millisecond)
			if ctx.Err() != nil {
				return windows, nil
			}
			rep.Deploys++
			if err != nil {
				rep.DeployErrors = append(rep.DeployErrors, err.Error())
				fmt.Fprintf(o.Progress, "soak: %4.0fs: deploy: %v\n", time.Since(start).Seconds(), err)
			} else {
				fmt.Fprintf(o.Progress, "soak: %4.0fs: deploy %s: generation %d, %s in %.1fs\n",
					time.Since(start).Seconds(), d.ID, d.Generation, d.State, d.Finished.Sub(d.Started).Seconds())
			}
			continue
		}
		nextKill = nextKill.Add(o.KillEvery)
		w, err := soakKill(ctx, ctl, o.Clusters)
		if ctx.Err() != nil {
			if !w.from.IsZero() {
				w.till = time.Now().Add(time.Hour) // the run ended inside it
				windows = append(windows, w)
			}
			return windows, nil
		}
		if err != nil {
			return windows, err
		}
		rep.Kills++
		windows = append(windows, w)
		took := w.till.Add(-killGrace).Sub(w.from).Seconds()
		rep.KillRecoverMaxS = max(rep.KillRecoverMaxS, took)
		fmt.Fprintf(o.Progress, "soak: %4.0fs: killed cluster %s, routed again after %.2fs\n", time.Since(start).Seconds(), w.cluster, took)
	}
}

var never = time.Unix(1<<40, 0)

// soakKill SIGKILLs a random cluster's process and waits until its
// successor is routed.
func soakKill(ctx context.Context, ctl *ipc.Client, clusters int) (killWindow, error) {
	st, err := mgrStatus(ctx, ctl, 5*time.Second)
	if err != nil {
		return killWindow{}, err
	}
	c := rand.IntN(clusters)
	pid := st.Clusters[c].PID
	if pid <= 0 {
		return killWindow{}, fmt.Errorf("cluster %d has no process to kill (%s)", c, st.Clusters[c].State)
	}
	w := killWindow{cluster: strconv.Itoa(c), from: time.Now()}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return killWindow{}, fmt.Errorf("kill cluster %d (pid %d): %w", c, pid, err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		if err := sleep(ctx, 20*time.Millisecond); err != nil {
			return w, err
		}
		st, err := mgrStatus(ctx, ctl, 5*time.Second)
		if err == nil {
			cs := st.Clusters[c]
			if cs.PID != pid && cs.PID > 0 && cs.Routed && cs.State == "ready" {
				w.till = time.Now().Add(killGrace)
				return w, nil
			}
		}
		if time.Now().After(deadline) {
			return w, fmt.Errorf("cluster %d not routed again within a minute of its kill", c)
		}
	}
}

// judge applies the growth rule to the samples.
func (r *soakReport) judge() {
	col := func(f func(soakSample) float64) []float64 {
		v := make([]float64, len(r.samples))
		for i, s := range r.samples {
			v[i] = f(s)
		}
		return v
	}
	iv := r.options.SampleEvery.Seconds()
	r.Goroutines = judgeGrowth("goroutines", col(func(s soakSample) float64 { return s.Goroutines }), goroutineRule, iv)
	r.FDs = judgeGrowth("fds", col(func(s soakSample) float64 { return s.FDs }), fdRule, iv)
	r.RSS = judgeGrowth("rss_kib", col(func(s soakSample) float64 { return s.RSSKiB }), rssRule, iv)
}

func (r *soakReport) writeSamples(path string) error {
	var b strings.Builder
	b.WriteString("at_s,goroutines,fds,open_fds,rss_kib,heap_inuse_kib\n")
	for _, s := range r.samples {
		fmt.Fprintf(&b, "%.1f,%g,%g,%g,%g,%.0f\n", s.AtS, s.Goroutines, s.FDs, s.OpenFDs, s.RSSKiB, s.HeapKiB)
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// WriteText prints the report for people.
func (r *soakReport) WriteText(w io.Writer) {
	o := r.options
	fmt.Fprintf(w, "soak: %.0f s, %d clusters, load %d in flight%s; %d kills (routed again within %.2f s at most), %d deploys (max_parallel %d); %d CPUs (%s)\n\n",
		r.DurationS, r.Clusters, r.InFlight, rateNote(r.Rate), r.Kills, r.KillRecoverMaxS, r.Deploys, o.DeployParallel, runtime.NumCPU(), cpuModel())
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "resource\tsamples\tfirst\tmax\tQ2 median\tQ4 median\tlimit\tslope/min\tverdict\t")
	for _, v := range []growthVerdict{r.Goroutines, r.FDs, r.RSS} {
		verdict := "steady"
		switch {
		case v.Undecided:
			verdict = "too few samples"
		case v.Grew:
			verdict = "GREW"
		}
		fmt.Fprintf(tw, "%s\t%d\t%g\t%g\t%g\t%g\t%.0f\t%+.2f\t%s\t\n", v.Metric, v.Samples, v.First, v.Max, v.Q2Median, v.Q4Median, v.Limit, v.SlopePerMin, verdict)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nload: %d sent, %d ok, %s failed (%d outside the kills' windows), %d lost, %d duplicates; %.0f req/s, p50 %.0f µs, p99 %.0f µs, max %.0f µs\n",
		r.Sent, r.OK, errorsText(r.books), r.Unexplained, r.Lost, r.Duplicates, r.ReqPerS, r.P50US, r.P99US, r.MaxUS)
	if len(r.DeployErrors) > 0 {
		fmt.Fprintf(w, "deploys that failed: %s\n", strings.Join(r.DeployErrors, "; "))
	}
	fmt.Fprintf(w, "cluster processes left after SIGTERM: %d\n", r.LeftBehind)
}

// WriteJSON prints the report as one JSON line.
func (r *soakReport) WriteJSON(w io.Writer) error { return json.NewEncoder(w).Encode(r) }

func runSoakCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o := defaultSoakOptions
	fs := newScenarioFlags("soak", stderr, &o.ManagerBin, &o.HarnessBin)
	fs.DurationVar(&o.Duration, "duration", o.Duration, "length of the run")
	fs.IntVar(&o.Clusters, "clusters", o.Clusters, "clusters (one shard each)")
	fs.IntVar(&o.InFlight, "inflight", o.InFlight, "load workers, one request in flight each")
	fs.Float64Var(&o.Rate, "rate", o.Rate, "requests per second over all workers (0: closed-loop)")
	fs.IntVar(&o.PayloadBytes, "payload", o.PayloadBytes, "echo payload size in bytes")
	fs.DurationVar(&o.SampleEvery, "sample-every", o.SampleEvery, "how often the manager is sampled")
	fs.DurationVar(&o.KillEvery, "kill-every", o.KillEvery, "SIGKILL a random cluster this often (0: never)")
	fs.DurationVar(&o.DeployEvery, "deploy-every", o.DeployEvery, "deploy every cluster this often (0: never)")
	fs.IntVar(&o.DeployParallel, "deploy-parallel", o.DeployParallel, "the deploys' max_parallel")
	fs.StringVar(&o.SamplesFile, "samples", "", "write every sample to this CSV file")
	var err error
	if o.Progress, err = fs.parse(args); err != nil {
		return err
	}
	rep, err := runSoak(ctx, o)
	return finishReport("soak", stdout, rep, rep.DurationS > 0, err)
}
