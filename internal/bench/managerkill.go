package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/ipc"
)

// managerKillOptions shape the manager-kill scenario: SIGKILL the manager
// under load, restart it at once on the same config, and check that it
// re-adopts every cluster without restarting any and that only the requests
// in flight at the kill fail.
type managerKillOptions struct {
	ManagerBin string
	HarnessBin string

	Clusters     int           // one shard each
	Kills        int           // kill/restart rounds
	InFlight     int           // load workers, one request in flight each
	Clients      int           // client connections the workers share
	Rate         float64       // requests/s over all workers; 0 is closed-loop
	PayloadBytes int           // echo payload
	Settle       time.Duration // load on a settled manager before each kill
	After        time.Duration // load after every cluster is routed again, before the next kill
	AdoptWindow  time.Duration // state.adopt_window of the generated config

	Progress io.Writer
}

// defaultManagerKillOptions are the scenario's defaults (issue 5's measure).
var defaultManagerKillOptions = managerKillOptions{
	Clusters:     16,
	Kills:        3,
	InFlight:     32,
	Clients:      2,
	PayloadBytes: 200,
	Settle:       2 * time.Second,
	After:        2 * time.Second,
	AdoptWindow:  10 * time.Second,
}

// targetReadoptS is issue 5's target for 16 clusters: manager start to every
// cluster re-adopted and routed.
const targetReadoptS = 2.0

// killCase is one SIGKILL of the manager and its restart.
type killCase struct {
	Scenario string `json:"scenario"` // "manager-kill"
	Path     string `json:"path"`     // "kill"
	Kill     int    `json:"kill"`
	Clusters int    `json:"clusters"`
	InFlight int    `json:"in_flight"`
	// Survived counts the cluster processes alive right after the kill.
	Survived int `json:"survived"`
	// From the new manager's start: its socket answering a REGISTER; STATUS
	// showing every cluster ready and routed; a broadcast ping answered by
	// every cluster.
	ListeningS float64 `json:"listening_s"`
	ReadoptedS float64 `json:"readopted_s"`
	RoutedS    float64 `json:"routed_s"`
	// ResumedS: the first load request sent after the kill and answered OK.
	ResumedS float64 `json:"resumed_s"`
	// Restarted counts clusters whose process id changed across the restart.
	Restarted int `json:"restarted"`
	// Books are the load's, from just before the kill to the end of the
	// load after it: what the kill cost.
	books
	// The failed requests are those outstanding on a client's connection
	// when it saw the connection end: by the bench's clock, sent before the
	// SIGKILL, or after it and before the client read the end of the
	// stream. (In a closed loop the replies to what was sent before the kill
	// are mostly already on their way, unread in the client's socket, so
	// most failures are of the second kind.)
	FailedSentBefore uint64 `json:"failed_sent_before_kill"`
	FailedSentAfter  uint64 `json:"failed_sent_after_kill"`
	// NotSent counts sends the clients refused locally while disconnected
	// (the race between a worker's wait and the disconnect): never sent, so
	// in no book.
	NotSent uint64 `json:"not_sent"`
}

// managerKillSummary is the scenario's verdict over all kills.
type managerKillSummary struct {
	Scenario      string  `json:"scenario"`
	Path          string  `json:"path"` // "summary"
	Clusters      int     `json:"clusters"`
	Kills         int     `json:"kills"`
	InFlight      int     `json:"in_flight"`
	MaxReadoptedS float64 `json:"max_readopted_s"`
	MaxRoutedS    float64 `json:"max_routed_s"`
	Restarted     int     `json:"restarted"`
	// FailedMax is the most requests one kill failed (at most InFlight).
	FailedMax uint64 `json:"failed_max"`
	// Books are the whole load's, start to end.
	books
	ReqPerS float64 `json:"req_per_s"`
	P50US   float64 `json:"p50_us"`
	P99US   float64 `json:"p99_us"`
	MaxUS   float64 `json:"max_us"`
	// LeftBehind counts cluster processes still alive after the final SIGTERM.
	LeftBehind int `json:"left_behind"`
}

// managerKillReport is everything the scenario measured.
type managerKillReport struct {
	Options managerKillOptions
	Kills   []killCase
	Summary managerKillSummary
}

func (o managerKillOptions) withDefaults() managerKillOptions {
	d := defaultManagerKillOptions
	orDefault(&o.Clusters, d.Clusters)
	orDefault(&o.Kills, d.Kills)
	orDefault(&o.InFlight, d.InFlight)
	orDefault(&o.Clients, d.Clients)
	orDefault(&o.PayloadBytes, d.PayloadBytes)
	orDefault(&o.Settle, d.Settle)
	orDefault(&o.After, d.After)
	orDefault(&o.AdoptWindow, d.AdoptWindow)
	orDefaultIfZero(&o.Progress, io.Discard)
	return o
}

// Broken describes the invariants the run broke ("" when none): a restarted
// cluster, a cluster process that died with the manager, a kill that failed
// more requests than were in flight or failed any with another code than
// unavailable, any lost, duplicate or unknown reply, and any cluster process
// left after the final SIGTERM.
func (r *managerKillReport) Broken() string {
	var why []string
	for _, k := range r.Kills {
		if k.Restarted > 0 {
			why = append(why, fmt.Sprintf("kill %d: %d cluster processes restarted", k.Kill, k.Restarted))
		}
		if k.Survived != k.Clusters {
			why = append(why, fmt.Sprintf("kill %d: only %d of %d cluster processes survived the manager", k.Kill, k.Survived, k.Clusters))
		}
		if n := k.ErrorCount(); n > uint64(k.InFlight) {
			why = append(why, fmt.Sprintf("kill %d: %d requests failed, more than the %d in flight", k.Kill, n, k.InFlight))
		}
		for _, code := range slices.Sorted(maps.Keys(k.Errors)) {
			if code != ipc.CodeUnavailable {
				why = append(why, fmt.Sprintf("kill %d: %d failed with %s", k.Kill, k.Errors[code], code))
			}
		}
	}
	s := r.Summary
	why = append(why, s.books.replyFaults()...)
	if killed := r.killErrors(); s.ErrorCount() != killed {
		why = append(why, fmt.Sprintf("%d requests failed outside the kills (%d in all)", s.ErrorCount()-killed, s.ErrorCount()))
	}
	if s.LeftBehind > 0 {
		why = append(why, fmt.Sprintf("%d cluster processes left after SIGTERM", s.LeftBehind))
	}
	return strings.Join(why, ", ")
}

func (r *managerKillReport) killErrors() uint64 {
	var n uint64
	for _, k := range r.Kills {
		n += k.ErrorCount()
	}
	return n
}

// runManagerKill runs the scenario. A report with what was measured comes back
// even with an error.
func runManagerKill(ctx context.Context, o managerKillOptions) (rep *managerKillReport, err error) {
	o = o.withDefaults()
	rep = &managerKillReport{Options: o}
	sc, err := newScratch("sm-bench-", "manager-kill.log", "")
	if err != nil {
		return rep, err
	}
	defer func() { err = sc.close(err) }()
	err = managerKill(ctx, o, sc, rep)
	rep.summarize()
	return rep, err
}

func managerKill(ctx context.Context, o managerKillOptions, sc *scratch, rep *managerKillReport) (err error) {
	f, err := newFleet(sc, o.HarnessBin, o.Clusters, 1, "")
	if err != nil {
		return err
	}
	f.cfg.State = config.State{Dir: filepath.Join(sc.dir, "state"), AdoptWindow: config.Duration{Duration: o.AdoptWindow}}
	if err := os.Mkdir(f.cfg.State.Dir, 0o700); err != nil {
		return err
	}
	defer func() { err = f.close(err) }()

	fmt.Fprintf(o.Progress, "manager-kill: starting sm-manager with %d clusters (state in %s)\n", o.Clusters, f.cfg.State.Dir)
	if err := f.start(ctx, o.ManagerBin); err != nil {
		return err
	}
	_, err = f.waitReady(ctx, readyTimeout(o.Clusters), 20*time.Millisecond, nil)
	f.disconnect() // each restart connects its own
	if err != nil {
		return err
	}

	load, err := startClientLoad(ctx, clientLoadConfig{
		socket: f.cfg.Socket, clients: o.Clients, workers: o.InFlight, rate: o.Rate,
		target: clusterTarget(o.Clusters, o.InFlight), payload: echoPayload(o.PayloadBytes),
		timeout: f.cfg.Requests.Timeout.Duration + 5*time.Second,
	})
	if err != nil {
		return err
	}
	loadStart := time.Now()
	loadEnded := false
	endLoad := func() {
		if loadEnded {
			return
		}
		loadEnded = true
		fmt.Fprintf(o.Progress, "manager-kill: ending the load\n")
		b := load.end()
		el := time.Since(loadStart)
		lat := load.latency()
		s := &rep.Summary
		s.books = b
		s.ReqPerS = float64(b.OK) / el.Seconds()
		s.P50US, s.P99US, s.MaxUS = latencyUS(&lat)
	}
	defer endLoad()
	fmt.Fprintf(o.Progress, "manager-kill: %d clusters ready; load: %d in flight over %d clients%s\n",
		o.Clusters, o.InFlight, o.Clients, rateNote(o.Rate))

	for k := 1; k <= o.Kills; k++ {
		if err := sleep(ctx, o.Settle); err != nil {
			return err
		}
		kc, err := killAndRestart(ctx, o, f, load)
		kc.Kill = k
		rep.Kills = append(rep.Kills, kc)
		fmt.Fprintf(o.Progress, "manager-kill: kill %d/%d: %d/%d survived, re-adopted %.3fs, routed %.3fs after the restart; %d restarted, %d failed\n",
			k, o.Kills, kc.Survived, kc.Clusters, kc.ReadoptedS, kc.RoutedS, kc.Restarted, kc.ErrorCount())
		if err != nil {
			return fmt.Errorf("kill %d: %w", k, err)
		}
	}
	endLoad()

	fmt.Fprintf(o.Progress, "manager-kill: stopping sm-manager (SIGTERM)\n")
	stopErr := f.stop(time.Minute)
	rep.Summary.LeftBehind = f.reap()
	return stopErr
}

func rateNote(rate float64) string {
	if rate > 0 {
		return fmt.Sprintf(", %.0f req/s", rate)
	}
	return ", closed-loop"
}

// killAndRestart SIGKILLs the fleet's manager, starts its successor on the
// same config at once, and measures the re-adoption.
func killAndRestart(ctx context.Context, o managerKillOptions, f *fleet, load *clientLoad) (killCase, error) {
	kc := killCase{Scenario: "manager-kill", Path: "kill", Clusters: o.Clusters, InFlight: o.InFlight}
	before := f.mgr.clusters
	b0, ns0, f0 := load.snapshot(), load.notSentCount(), len(load.failuresSoFar())

	killAt := time.Now()
	load.setMark(killAt)
	f.mgr.proc.cmd.Process.Kill()
	<-f.mgr.proc.exited
	for _, pid := range before {
		if procAlive(pid) {
			kc.Survived++
		}
	}

	start := time.Now()
	if err := f.start(ctx, o.ManagerBin); err != nil {
		return kc, err
	}
	defer f.disconnect()
	kc.ListeningS = time.Since(start).Seconds()
	st, err := f.waitReady(ctx, o.AdoptWindow+startTimeout, 5*time.Millisecond, nil)
	if err != nil {
		return kc, err
	}
	kc.ReadoptedS = time.Since(start).Seconds()
	// Routed in fact: a broadcast ping that every cluster answers.
	probe, err := f.mgr.dial(ctx, "sm-bench-probe")
	if err != nil {
		return kc, err
	}
	_, err = f.mgr.waitReady(ctx, probe, ipc.TargetAll, startTimeout)
	probe.close()
	if err != nil {
		return kc, err
	}
	kc.RoutedS = time.Since(start).Seconds()

	after := clusterPIDs(st)
	for i := range before {
		if i >= len(after) || after[i] != before[i] {
			kc.Restarted++
		}
	}
	f.mgr.clusters = after
	if err := sleep(ctx, o.After); err != nil {
		return kc, err
	}
	// The processes once the dust settled: the same ones still.
	if st, err := f.refresh(ctx, 5*time.Second); err == nil {
		now := clusterPIDs(st)
		for i := range now {
			if i < len(after) && now[i] != after[i] {
				kc.Restarted++
			}
		}
	}
	if t := load.resumedAt(); !t.IsZero() {
		kc.ResumedS = t.Sub(start).Seconds()
	}
	kc.books = load.snapshot().sub(b0)
	for _, fl := range load.failuresSoFar()[f0:] {
		if fl.sent.Before(killAt) {
			kc.FailedSentBefore++
		} else {
			kc.FailedSentAfter++
		}
	}
	kc.NotSent = load.notSentCount() - ns0
	return kc, nil
}

func (l *clientLoad) notSentCount() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.notSent
}

// WriteText prints the report for people.
func (r *managerKillReport) WriteText(w io.Writer) {
	o := r.Options
	fmt.Fprintf(w, "manager-kill: %d clusters, %d kills, %d requests in flight%s (echo, %d-byte payload); %d CPUs (%s)\n\n",
		o.Clusters, len(r.Kills), o.InFlight, rateNote(o.Rate), len(echoPayload(o.PayloadBytes)), runtime.NumCPU(), cpuModel())
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "kill\tsurvived\tlistening s\tre-adopted s\trouted s\tload resumed s\trestarted\tsent\tok\tfailed\t(sent before kill\t+ after)\tlost\tdup\t")
	for _, k := range r.Kills {
		fmt.Fprintf(tw, "%d\t%d/%d\t%.3f\t%.3f\t%.3f\t%.3f\t%d\t%d\t%d\t%s\t%d\t%d\t%d\t%d\t\n",
			k.Kill, k.Survived, k.Clusters, k.ListeningS, k.ReadoptedS, k.RoutedS, k.ResumedS, k.Restarted,
			k.Sent, k.OK, errorsText(k.books), k.FailedSentBefore, k.FailedSentAfter, k.Lost, k.Duplicates)
	}
	tw.Flush()
	s := r.Summary
	fmt.Fprintf(w, "\nwhole load: %d sent, %d ok, %s failed, %d lost, %d duplicates; %.0f req/s, p50 %.0f µs, p99 %.0f µs, max %.0f µs\n",
		s.Sent, s.OK, errorsText(s.books), s.Lost, s.Duplicates, s.ReqPerS, s.P50US, s.P99US, s.MaxUS)
	fmt.Fprintf(w, "times are from the new manager's start; re-adopted: STATUS shows every cluster ready and routed; routed: a broadcast ping answered by all\n")
	fmt.Fprintf(w, "re-adoption (manager start → every cluster ready and routed): max %.3f s  (target ≤ %.0f s for 16 clusters → %s)\n",
		s.MaxReadoptedS, targetReadoptS, met(s.MaxReadoptedS <= targetReadoptS))
	fmt.Fprintf(w, "cluster processes restarted: %d  (target 0 → %s)\n", s.Restarted, met(s.Restarted == 0))
	fmt.Fprintf(w, "failed: outstanding when the client saw its connection end; sent before the SIGKILL, or after it and before the client read EOF\n")
	fmt.Fprintf(w, "failed by a kill: at most %d (of a window of %d), all unavailable  (→ %s)\n",
		s.FailedMax, o.InFlight, met(s.FailedMax <= uint64(o.InFlight) && onlyUnavailable(s.books)))
	fmt.Fprintf(w, "cluster processes left after the final SIGTERM: %d\n", s.LeftBehind)
}

func onlyUnavailable(b books) bool {
	for code := range b.Errors {
		if code != ipc.CodeUnavailable {
			return false
		}
	}
	return true
}

// errorsText is the error count, by code when there are any.
func errorsText(b books) string {
	if len(b.Errors) == 0 {
		return "0"
	}
	var parts []string
	for _, code := range slices.Sorted(maps.Keys(b.Errors)) {
		parts = append(parts, fmt.Sprintf("%d %s", b.Errors[code], code))
	}
	return strings.Join(parts, ", ")
}

// WriteJSON prints one JSON object per kill, then the summary.
func (r *managerKillReport) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	for _, k := range r.Kills {
		if err := enc.Encode(k); err != nil {
			return err
		}
	}
	return enc.Encode(r.Summary)
}

func (r *managerKillReport) summarize() {
	s := &r.Summary
	s.Scenario, s.Path = "manager-kill", "summary"
	s.Clusters, s.Kills, s.InFlight = r.Options.Clusters, len(r.Kills), r.Options.InFlight
	for _, k := range r.Kills {
		s.MaxReadoptedS = max(s.MaxReadoptedS, k.ReadoptedS)
		s.MaxRoutedS = max(s.MaxRoutedS, k.RoutedS)
		s.Restarted += k.Restarted
		s.FailedMax = max(s.FailedMax, k.ErrorCount())
	}
}

func runManagerKillCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o := defaultManagerKillOptions
	fs := newScenarioFlags("manager-kill", stderr, &o.ManagerBin, &o.HarnessBin)
	fs.IntVar(&o.Clusters, "clusters", o.Clusters, "clusters (one shard each)")
	fs.IntVar(&o.Kills, "kills", o.Kills, "SIGKILL/restart rounds")
	fs.IntVar(&o.InFlight, "inflight", o.InFlight, "requests in flight (workers, one each)")
	fs.IntVar(&o.Clients, "clients", o.Clients, "client connections the workers share")
	fs.Float64Var(&o.Rate, "rate", o.Rate, "requests per second over all workers (0: closed-loop, as fast as replies come)")
	fs.IntVar(&o.PayloadBytes, "payload", o.PayloadBytes, "echo payload size in bytes")
	fs.DurationVar(&o.Settle, "settle", o.Settle, "load before each kill")
	fs.DurationVar(&o.After, "after", o.After, "load after every cluster is routed again, counted with the kill")
	fs.DurationVar(&o.AdoptWindow, "adopt-window", o.AdoptWindow, "state.adopt_window of the generated config")
	var err error
	if o.Progress, err = fs.parse(args); err != nil {
		return err
	}
	rep, err := runManagerKill(ctx, o)
	return finishReport("manager-kill", stdout, rep, len(rep.Kills) > 0, err)
}
