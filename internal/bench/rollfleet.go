package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/sm-supervisor/sm/config"
	"github.com/sm-supervisor/sm/generation"
	"github.com/sm-supervisor/sm/ipc"
)

// What the deploy and chaos scenarios share: a manager with many clusters
// started from a config file the scenario may rewrite (DEPLOY re-reads it), a
// control connection for pings, STATUS and DEPLOY, the /proc checks that no
// cluster process is left a zombie, an orphan or a stray, and the run that
// puts the fleet, the WATCH feed and the lane load together (rollRun).

// rollFleet is a real sm-manager with its clusters, on a socket in dir.
type rollFleet struct {
	cfg     *config.Config
	cfgPath string
	mgr     *managerProc
	ctl     *pipe // control connection, used by one goroutine at a time
}

// rollConfig is fleetConfig with no metrics endpoint, no state file, and a
// feed buffer deep enough that a WATCH of the bench is never dropped.
func rollConfig(dir string, clusters, perCluster int, harnessArgv []string) (*config.Config, error) {
	cfg, err := fleetConfig(dir, clusters, perCluster, harnessArgv, "")
	if err != nil {
		return nil, err
	}
	cfg.State.Dir = ""
	cfg.Limits.FeedBuffer = 8192
	cfg.Cluster.Env = map[string]string{}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// startRollFleet writes cfg to dir/sm.toml, starts bin on it and opens the
// control connection. The manager's environment carries no SM_HARNESS_FLAGS of
// the caller's: per-cluster failures come from cfg.Cluster.Env only.
func startRollFleet(ctx context.Context, bin, dir string, cfg *config.Config, logw *os.File) (*rollFleet, error) {
	f := &rollFleet{cfg: cfg, cfgPath: filepath.Join(dir, "sm.toml")}
	if err := f.writeConfig(); err != nil {
		return nil, err
	}
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "SM_HARNESS_FLAGS") })
	proc, err := startChild("sm-manager", []string{bin, "-config", f.cfgPath}, env, logw)
	if err != nil {
		return nil, err
	}
	f.mgr = &managerProc{proc: proc, socket: cfg.Socket}
	if f.ctl, err = f.mgr.dial(ctx, "sm-bench-control"); err != nil {
		f.close()
		return nil, err
	}
	return f, nil
}

// writeConfig saves f.cfg, through a rename so that a DEPLOY never reads half
// a file.
func (f *rollFleet) writeConfig() error {
	var buf bytes.Buffer
	if err := toml.NewEncoder(&buf).Encode(f.cfg); err != nil {
		return fmt.Errorf("encode manager config: %w", err)
	}
	tmp := f.cfgPath + ".tmp"
	if err := os.WriteFile(tmp, buf.Bytes(), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, f.cfgPath)
}

// close stops the manager (SIGTERM: it quiesces every cluster) and reports a
// manager that did not exit cleanly, then makes sure no cluster process of
// this fleet outlived it: any that did is killed and reported.
func (f *rollFleet) close() error {
	if f.ctl != nil {
		f.ctl.close()
		f.ctl = nil
	}
	err := f.mgr.stop(time.Minute)
	var left []fleetProc
	for range 30 { // the kernel reaps the last ones a moment after the manager's exit
		if left = scanFleetProcs(f.cfg.Socket, -1); len(left) == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(left) > 0 {
		for _, p := range left {
			syscall.Kill(p.PID, syscall.SIGKILL)
		}
		lerr := fmt.Errorf("%w: %d cluster processes outlived the manager: %v", errInvariant, len(left), left)
		if err == nil {
			err = lerr
		} else {
			err = fmt.Errorf("%v; %w", err, lerr)
		}
	}
	return err
}

// closeFleet closes f at the end of a scenario: a cluster process that
// outlived the manager is a broken invariant, added to failures; any other
// trouble stopping is joined to err.
func closeFleet(f *rollFleet, err error, failures *[]string) error {
	cerr := f.close()
	if errors.Is(cerr, errInvariant) {
		*failures = append(*failures, cerr.Error())
		return err
	}
	return errors.Join(err, cerr)
}

// rollRun is what the deploy and chaos scenarios run in: a scratch dir, a
// fleet on it, the WATCH feed on the fleet, and the lane load on every
// cluster. close ends them in the reverse order.
type rollRun struct {
	scratch *scratch
	// failures are the report's: a cluster process that outlived the
	// manager goes there (see closeFleet).
	failures *[]string
	fleet    *rollFleet
	watcher  *feedWatcher
	load     *laneLoad
}

// newRollRun makes the run's scratch dir, sm-bench-<name>-*, with the log
// <name>.log in it, or at logPath if set.
func newRollRun(name, logPath string, failures *[]string) (*rollRun, error) {
	sc, err := newScratch("sm-bench-"+name+"-", name+".log", logPath)
	if err != nil {
		return nil, err
	}
	return &rollRun{scratch: sc, failures: failures}, nil
}

// startFleet starts bin on cfg and waits up to timeout until every cluster but
// except is ready and routed.
func (r *rollRun) startFleet(ctx context.Context, bin string, cfg *config.Config, timeout time.Duration, except ...int) error {
	f, err := startRollFleet(ctx, bin, r.scratch.dir, cfg, r.scratch.log)
	if err != nil {
		return err
	}
	r.fleet = f
	_, err = f.waitStatus(ctx, timeout, "every cluster ready", func(st *rollStatus) bool { return allReady(st, except...) })
	return err
}

// startLoad opens the WATCH feed, then starts the lane load, saying so on
// progress (the scenario's name first) with how its lanes name their cluster.
func (r *rollRun) startLoad(ctx context.Context, progress io.Writer, name, targets string, o laneLoadOptions) error {
	w, err := watchFeed(ctx, r.fleet.mgr)
	if err != nil {
		return err
	}
	r.watcher = w
	fmt.Fprintf(progress, "%s: load of %d in flight (%s targets) over %d connections\n", name, len(o.lanes), targets, o.conns)
	r.load, err = startLaneLoad(ctx, r.fleet.mgr, o)
	return err
}

// close stops the load if it still runs, closes the feed, stops the fleet
// (see closeFleet) and removes the scratch dir, and returns err with what
// went wrong on the way added.
func (r *rollRun) close(err error) error {
	if r.load != nil {
		r.load.stop(0)
	}
	if r.watcher != nil {
		r.watcher.close()
	}
	if r.fleet != nil {
		err = closeFleet(r.fleet, err, r.failures)
	}
	return r.scratch.close(err)
}

// rollStatus is the part of a STATUS payload (manager.Status) the scenarios read.
type rollStatus struct {
	Topology   generation.Topology `json:"topology"`
	Generation int64               `json:"generation"`
	Clusters   []rollCluster       `json:"clusters"`
	Deploy     *generation.Status  `json:"deploy"`
}

// rollCluster is one cluster of a STATUS payload or of a feed event.
type rollCluster struct {
	ID         int    `json:"id"`
	Generation int64  `json:"generation"`
	State      string `json:"state"`
	PID        int    `json:"pid"`
	Routed     bool   `json:"routed"`
	Activated  bool   `json:"activated"`
	Restarts   int    `json:"restarts"`
	CrashLoop  bool   `json:"crash_loop"`
	LastExit   string `json:"last_exit"`
	Deploying  bool   `json:"deploying"`
}

// status asks for a STATUS snapshot on the control connection.
func (f *rollFleet) status(ctx context.Context) (*rollStatus, error) {
	var probe books
	r, err := f.ctl.call(ctx, &ipc.Frame{Op: ipc.OpStatus}, 10*time.Second, &probe)
	if err != nil {
		return nil, f.mgr.proc.why(err)
	}
	if r.Error != nil {
		return nil, fmt.Errorf("STATUS: %w", r.Error)
	}
	var st rollStatus
	if err := json.Unmarshal(r.Payload, &st); err != nil {
		return nil, fmt.Errorf("STATUS payload: %w", err)
	}
	return &st, nil
}

// waitStatus polls STATUS until ok holds, for at most timeout.
func (f *rollFleet) waitStatus(ctx context.Context, timeout time.Duration, what string, ok func(*rollStatus) bool) (*rollStatus, error) {
	deadline := time.Now().Add(timeout)
	for {
		st, err := f.status(ctx)
		if err == nil && ok(st) {
			return st, nil
		}
		if err != nil && ctx.Err() != nil {
			return nil, err
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("not after %v; last STATUS: %s", timeout, describeClusters(st))
			}
			return st, fmt.Errorf("waiting for %s: %w", what, err)
		}
		select {
		case <-f.mgr.proc.exited:
			return nil, f.mgr.proc.why(err)
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// describeClusters is a one-line summary of a STATUS's clusters, for errors.
func describeClusters(st *rollStatus) string {
	if st == nil {
		return "none"
	}
	var b strings.Builder
	for _, c := range st.Clusters {
		fmt.Fprintf(&b, "%d:%s/g%d", c.ID, c.State, c.Generation)
		if !c.Routed {
			b.WriteString("/unrouted")
		}
		if c.CrashLoop {
			b.WriteString("/crash_loop")
		}
		b.WriteByte(' ')
	}
	return strings.TrimSpace(b.String())
}

// allReady reports whether every cluster but those in except is ready and routed.
func allReady(st *rollStatus, except ...int) bool {
	for _, c := range st.Clusters {
		if !slices.Contains(except, c.ID) && (c.State != "ready" || !c.Routed) {
			return false
		}
	}
	return len(st.Clusters) > 0
}

// startRollout sends DEPLOY on the control connection and returns the deploy id.
func (f *rollFleet) startRollout(ctx context.Context, maxParallel int, mode string) (string, int64, error) {
	var probe books
	r, err := f.ctl.call(ctx, &ipc.Frame{Op: ipc.OpDeploy, MaxParallel: maxParallel, Mode: mode}, 30*time.Second, &probe)
	if err != nil {
		return "", 0, f.mgr.proc.why(err)
	}
	if r.Error != nil {
		return "", 0, fmt.Errorf("DEPLOY: %w", r.Error)
	}
	var rep struct {
		ID         string `json:"deploy_id"`
		Generation int64  `json:"generation"`
	}
	if err := json.Unmarshal(r.Payload, &rep); err != nil || rep.ID == "" {
		return "", 0, fmt.Errorf("DEPLOY reply %s: %v", r.Payload, err)
	}
	return rep.ID, rep.Generation, nil
}

// ping sends one ping to cluster and returns the pid that answered.
func (f *rollFleet) ping(ctx context.Context, cluster int) (int, error) {
	var probe books
	r, err := f.ctl.call(ctx, &ipc.Frame{Op: "ping", Target: strconv.Itoa(cluster)}, 15*time.Second, &probe)
	if err != nil {
		return 0, f.mgr.proc.why(err)
	}
	if r.Error != nil {
		return 0, r.Error
	}
	return pidOf(r.Payload)
}

// procCheck is what /proc showed of a fleet's cluster processes.
type procCheck struct {
	Live    int `json:"live"`
	Zombies int `json:"zombies"` // exited and never reaped by the manager
	Orphans int `json:"orphans"` // parent is not the manager
	// Strays are live processes that STATUS does not name as any cluster's:
	// left behind by a stop or a deploy.
	Strays  int      `json:"strays"`
	Details []string `json:"details,omitempty"`
}

// Clean reports whether no process is a zombie, an orphan or a stray.
func (c procCheck) Clean() bool { return c.Zombies == 0 && c.Orphans == 0 && c.Strays == 0 }

// checkProcs compares /proc with STATUS. A process caught between its exit and
// its reaping, or just spawned, is a moment's state: the check is repeated
// (for up to about 3 s) until it comes out clean, and the last one counts.
func (f *rollFleet) checkProcs(ctx context.Context) (procCheck, error) {
	var c procCheck
	for try := 0; ; try++ {
		before, err := f.status(ctx)
		if err != nil {
			return c, err
		}
		procs := scanFleetProcs(f.cfg.Socket, f.mgr.pid())
		after, err := f.status(ctx)
		if err != nil {
			return c, err
		}
		known := map[int]bool{}
		for _, st := range []*rollStatus{before, after} {
			for _, cl := range st.Clusters {
				known[cl.PID] = true
			}
		}
		c = procCheck{}
		for _, p := range procs {
			switch {
			case p.State == 'Z':
				c.Zombies++
				c.Details = append(c.Details, "zombie "+p.String())
			case p.PPID != f.mgr.pid():
				c.Orphans++
				c.Details = append(c.Details, "orphan "+p.String())
			case !known[p.PID]:
				c.Strays++
				c.Details = append(c.Details, "stray "+p.String())
			default:
				c.Live++
			}
		}
		if c.Clean() || try == 10 {
			return c, nil
		}
		if err := sleep(ctx, 300*time.Millisecond); err != nil {
			return c, err
		}
	}
}

// percentile returns the q-quantile of ds (nearest rank; 0 for none).
func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.5) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// loadAverage is the machine's 1, 5 and 15 minute load averages, from
// /proc/loadavg: on a shared machine, how busy the rest of it was.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// rollHead opens the deploy and chaos reports: the scenario and the machine
// it ran on.
type rollHead struct {
	Scenario     string `json:"scenario"`
	Date         string `json:"date"`
	CPUs         int    `json:"cpus"`
	LoadAvgStart string `json:"loadavg_start"` // the machine's load averages, as /proc/loadavg has them
	LoadAvgEnd   string `json:"loadavg_end"`
}

// newRollHead is the head of a report of scenario starting now.
func newRollHead(scenario string) rollHead {
	return rollHead{Scenario: scenario, Date: time.Now().UTC().Format(time.RFC3339), CPUs: runtime.NumCPU(), LoadAvgStart: loadAverage()}
}

// rollTail closes the deploy and chaos reports: how often the WATCH feed
// dropped the bench, the cluster processes left at the end, and the
// invariants the run broke, in the order they were found.
type rollTail struct {
	FeedDrops int       `json:"feed_drops"`
	Procs     procCheck `json:"procs"`
	Failures  []string  `json:"failures,omitempty"`
}

// Broken is the first broken invariant ("" when none); Failures has them all.
func (r *rollTail) Broken() string {
	if len(r.Failures) == 0 {
		return ""
	}
	return r.Failures[0]
}

func (r *rollTail) fail(format string, args ...any) {
	r.Failures = append(r.Failures, fmt.Sprintf(format, args...))
}

// checkFeed fails the run when the WATCH feed failed or dropped the bench:
// then what the scenario reads from it is incomplete (so says incomplete).
func (r *rollTail) checkFeed(feedErr error, incomplete string) {
	if feedErr != nil {
		r.fail("the WATCH feed failed, so %s: %v", incomplete, feedErr)
	}
	if r.FeedDrops > 0 {
		r.fail("the WATCH feed dropped the bench %d times, so %s", r.FeedDrops, incomplete)
	}
}

// checkProcs fails the run when a cluster process is left a zombie, an
// orphan or a stray.
func (r *rollTail) checkProcs() {
	if !r.Procs.Clean() {
		r.fail("cluster processes: %v", r.Procs.Details)
	}
}

// rollLoadOptions shape the closed-loop lane load of the deploy and chaos
// scenarios.
type rollLoadOptions struct {
	InFlight     int    // lanes of the load, at least one per cluster
	Conns        int    // client connections the lanes are spread over
	Targets      string // how requests name their cluster: cluster, guild or mix
	PayloadBytes int
}

// withDefaults gives the fields left at zero (or less) d's values.
func (o *rollLoadOptions) withDefaults(d rollLoadOptions) {
	orDefault(&o.InFlight, d.InFlight)
	orDefault(&o.Conns, d.Conns)
	orDefaultIfZero(&o.Targets, d.Targets)
	orDefault(&o.PayloadBytes, d.PayloadBytes)
}

// flags adds the load's flags to fs, with o's values as their defaults.
func (o *rollLoadOptions) flags(fs *scenarioFlags) {
	fs.IntVar(&o.InFlight, "inflight", o.InFlight, "requests in flight (closed loop; at least one per cluster)")
	fs.IntVar(&o.Conns, "conns", o.Conns, "client connections the load is spread over")
	fs.StringVar(&o.Targets, "targets", o.Targets, "how requests name their cluster: cluster (ids), guild (guild: targets) or mix")
	fs.IntVar(&o.PayloadBytes, "payload", o.PayloadBytes, "echo payload size in bytes")
}
