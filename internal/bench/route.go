package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sm-supervisor/sm/ipc"
)

// routeOptions shape the route scenario. Zero fields take the defaults of
// defaultRouteOptions, except ManagerBin and HarnessBin, which are required.
type routeOptions struct {
	ManagerBin string // sm-manager binary
	HarnessBin string // cluster-harness binary

	InFlight     []int         // requests in flight, one case per value and path
	Rounds       int           // rounds of every case per in-flight count
	PayloadBytes int           // size of the echo payload (a JSON value)
	Warmup       time.Duration // load before each measured window
	Duration     time.Duration // each measured window
	Drain        time.Duration // wait for the last replies before counting them lost

	// Echo adds the minimal echo cluster's cases (echocluster.go), direct
	// and routed, beside cluster-harness's; EchoArgv is its command
	// (default: this executable's hidden echo-cluster command).
	Echo     bool
	EchoArgv []string
	// Rest is how long the machine is read with every process of the run
	// started and idle, at the start and at the end: what "others' CPU"
	// reads with no load of ours (0: no readings).
	Rest time.Duration

	// Clusters lists the cluster counts of the idle measurement (none: skip it).
	Clusters []int
	// IdleSample is how long the idle manager's CPU is sampled.
	IdleSample time.Duration

	// ManagerCPUProfile, if set, is where the routed path's manager writes a
	// CPU profile (its hidden -cpuprofile flag), for go tool pprof.
	ManagerCPUProfile string

	// Peers says whether to also run the peer harness (peers.go), from PeersDir.
	Peers    peerMode
	PeersDir string

	// Node adds the Node case (nodecase.go): sm routed to a Node cluster on
	// @sm-supervisor/client, NodeScript (default: found as nodeCommand says).
	Node       bool
	NodeScript string
	// NodeCPUProfile, if set, is a directory where the Node cluster writes a
	// V8 CPU profile (node --cpu-prof) as it exits.
	NodeCPUProfile string

	// Progress receives a line per step; nil discards them.
	Progress io.Writer
}

// defaultRouteOptions are the route scenario's defaults (issue 2's benchmark).
var defaultRouteOptions = routeOptions{
	InFlight:     []int{1, 64},
	Rounds:       1,
	PayloadBytes: 200,
	Warmup:       time.Second,
	Duration:     5 * time.Second,
	Drain:        10 * time.Second,
	IdleSample:   5 * time.Second,
	Echo:         true,
	Rest:         2 * time.Second,
}

func (o routeOptions) withDefaults() routeOptions {
	d := defaultRouteOptions
	if len(o.InFlight) == 0 {
		o.InFlight = d.InFlight
	}
	orDefault(&o.Rounds, d.Rounds)
	orDefault(&o.PayloadBytes, d.PayloadBytes)
	orDefault(&o.Warmup, d.Warmup)
	orDefault(&o.Duration, d.Duration)
	orDefault(&o.Drain, d.Drain)
	orDefault(&o.IdleSample, d.IdleSample)
	orDefaultIfZero(&o.Progress, io.Discard)
	return o
}

// Paths of the route scenario.
const (
	pathDirect     = "direct"      // bench ↔ cluster-harness
	pathRouted     = "routed"      // bench ↔ sm-manager ↔ cluster-harness
	pathEchoDirect = "echo-direct" // bench ↔ the minimal echo cluster
	pathEchoRouted = "echo-routed" // bench ↔ sm-manager ↔ the minimal echo cluster
	pathPeer       = "peer"        // the peer harness (peers.go)
	// pathRest is a reading of the machine with every process of the run
	// idle: the offset of "others' CPU" when nothing of ours runs.
	pathRest = "rest"
)

// directOf is the direct path a routed path is compared with.
var directOf = map[string]string{pathRouted: pathDirect, pathEchoRouted: pathEchoDirect}

// routeCase is one measured case: a path at an in-flight count.
type routeCase struct {
	Scenario     string  `json:"scenario"`
	Path         string  `json:"path"`
	InFlight     int     `json:"in_flight"`
	Round        int     `json:"round"`
	PayloadBytes int     `json:"payload_bytes"`
	WindowS      float64 `json:"window_s"`
	Requests     uint64  `json:"requests"` // replies inside the window
	ReqPerS      float64 `json:"req_per_s"`
	P50US        float64 `json:"p50_us"`
	P99US        float64 `json:"p99_us"`
	P999US       float64 `json:"p999_us"`
	MaxUS        float64 `json:"max_us"`
	books
	// CPUUSPerReq is each process's CPU time (utime+stime) over the window per
	// request, in µs: bench (this process, the client), harness (node on the
	// Node path: the Node cluster), and for the routed paths manager.
	CPUUSPerReq   map[string]float64 `json:"cpu_us_per_req"`
	ManagerRSSKiB int64              `json:"manager_rss_kib,omitempty"`
	// OthersCPUPercent is what every other process on the machine used during
	// the window, in percent of one core: the noise on a shared machine. It is
	// not clamped: the machine's counters and the processes' disagree by some
	// points, so an idle machine can read below 0.
	OthersCPUPercent float64 `json:"others_cpu_percent"`
	// On rest readings: when it was taken (start, end), and each process's
	// CPU over it, in percent of one core.
	RestAt     string             `json:"rest_at,omitempty"`
	CPUPercent map[string]float64 `json:"cpu_percent,omitempty"`
	// On routed cases: routed/direct throughput at the same in-flight count
	// and round (echo-routed against echo-direct), and routed p50 minus
	// direct p50.
	ThroughputRatio float64 `json:"throughput_ratio,omitempty"`
	P50DiffUS       float64 `json:"p50_diff_us,omitempty"`
}

// routeReport is everything the route scenario measured.
type routeReport struct {
	Options routeOptions
	Cases   []routeCase
	Idle    []idleCase
	// Rest are the readings of the machine at rest (path "rest").
	Rest []routeCase
	// Peers are the peer harness's cases (peers.go); PeerNote says why
	// there are none or fewer than asked.
	Peers    []peerCase
	PeerNote string
	peer     *peerRunner
}

// routeSummary is a routed path against its direct one at one in-flight
// count: the median over the rounds of each round's ratio and p50
// difference, and of each process's CPU per request.
type routeSummary struct {
	Scenario        string  `json:"scenario"`
	Path            string  `json:"path"`   // "summary"
	Routed          string  `json:"routed"` // routed or echo-routed
	InFlight        int     `json:"in_flight"`
	Rounds          int     `json:"rounds"`
	ThroughputRatio float64 `json:"throughput_ratio"`
	P50DiffUS       float64 `json:"p50_diff_us"`
	// ManagerCPUUSPerReq is the median of the routed rounds' manager CPU per request.
	ManagerCPUUSPerReq float64 `json:"manager_cpu_us_per_req"`
	// ReqPerS and DirectReqPerS are the medians of the two paths' req/s.
	ReqPerS       float64 `json:"req_per_s"`
	DirectReqPerS float64 `json:"direct_req_per_s"`
	// CPUUSPerReq and DirectCPUUSPerReq are the medians of each process's
	// CPU per request on the two paths.
	CPUUSPerReq       map[string]float64 `json:"cpu_us_per_req"`
	DirectCPUUSPerReq map[string]float64 `json:"direct_cpu_us_per_req"`
}

// Summaries compares each routed path with its direct one at each in-flight count.
func (r *routeReport) Summaries() []routeSummary {
	var out []routeSummary
	for _, routed := range []string{pathRouted, pathEchoRouted} {
		for _, n := range r.Options.InFlight {
			var ratio, diff, rps, drps []float64
			cpu, dcpu := map[string][]float64{}, map[string][]float64{}
			for _, c := range r.Cases {
				if c.InFlight != n {
					continue
				}
				switch c.Path {
				case routed:
					if c.ThroughputRatio > 0 {
						ratio, diff, rps = append(ratio, c.ThroughputRatio), append(diff, c.P50DiffUS), append(rps, c.ReqPerS)
						for k, v := range c.CPUUSPerReq {
							cpu[k] = append(cpu[k], v)
						}
					}
				case directOf[routed]:
					drps = append(drps, c.ReqPerS)
					for k, v := range c.CPUUSPerReq {
						dcpu[k] = append(dcpu[k], v)
					}
				}
			}
			if len(ratio) == 0 {
				continue
			}
			s := routeSummary{
				Scenario: "route", Path: "summary", Routed: routed, InFlight: n, Rounds: len(ratio),
				ThroughputRatio: median(ratio), P50DiffUS: median(diff), ManagerCPUUSPerReq: median(cpu["manager"]),
				ReqPerS: median(rps), DirectReqPerS: median(drps),
				CPUUSPerReq: medians(cpu), DirectCPUUSPerReq: medians(dcpu),
			}
			out = append(out, s)
		}
	}
	return out
}

// medians is the median of each list in m.
func medians(m map[string][]float64) map[string]float64 {
	out := make(map[string]float64, len(m))
	for k, v := range m {
		out[k] = median(v)
	}
	return out
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Books returns the measured cases' books added up.
func (r *routeReport) Books() books {
	var b books
	for _, c := range r.Cases {
		b.Add(c.books)
	}
	return b
}

// Broken describes the invariants the measured cases broke together ("" when
// none): see books.Broken.
func (r *routeReport) Broken() string {
	b := r.Books()
	return b.Broken()
}

// routeSetup is what the measured cases run against.
type routeSetup struct {
	direct        *directCluster
	manager       *attachedManager
	routedHarness int // pid of the manager's cluster process
	// With the echo cases: the echo cluster the bench is the manager of, and
	// the second manager routing to its own echo cluster (pid echoCluster).
	echoDirect  *directCluster
	echoManager *attachedManager
	echoCluster int
	// With --node: the Node case's own manager and its Node cluster's pid.
	nodeManager *attachedManager
	nodeCluster int
}

// runRoute runs the route scenario: the same echo load straight to a
// cluster-harness and through sm-manager, at each in-flight count, then, if
// asked, the idle manager with many clusters. It returns an error when a
// process fails; lost, duplicate and error replies are in the report's books.
func runRoute(ctx context.Context, o routeOptions) (*routeReport, error) {
	o = o.withDefaults()
	if o.ManagerBin == "" || o.HarnessBin == "" {
		return nil, errors.New("route: need the sm-manager and cluster-harness binaries")
	}
	dir, err := os.MkdirTemp("", "sm-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	rep := &routeReport{Options: o}
	if err := preparePeers(ctx, o, rep); err != nil {
		return nil, err
	}
	var nodeArgv []string
	if o.Node {
		if nodeArgv, err = nodeCommand(o); err != nil {
			return nil, err
		}
	}
	harnessArgv := simHarness(o.HarnessBin)

	if err := routeCases(ctx, o, dir, harnessArgv, nodeArgv, rep); err != nil {
		return rep, err
	}
	for _, n := range o.Clusters {
		c, err := idleClusters(ctx, o, dir, n, harnessArgv)
		if err != nil {
			return rep, fmt.Errorf("idle with %d clusters: %w", n, err)
		}
		rep.Idle = append(rep.Idle, c)
	}
	return rep, nil
}

// routeCases sets up every path and measures every case: per in-flight count
// and round, direct, routed, the Node case (nodeArgv, if not nil) and the
// peer, in the order roundOrder gives, so that drift on a shared machine hits
// them alike.
func routeCases(ctx context.Context, o routeOptions, dir string, harnessArgv, nodeArgv []string, rep *routeReport) (err error) {
	logw, err := os.Create(filepath.Join(dir, "route.log"))
	if err != nil {
		return err
	}
	defer func() {
		err = withLog(err, logw)
		logw.Close()
	}()

	var s routeSetup
	defer func() { err = errors.Join(err, s.stop()) }()
	fmt.Fprintf(o.Progress, "route: starting cluster-harness for the direct path\n")
	if s.direct, err = startDirect(ctx, harnessArgv, dir, logw); err != nil {
		return err
	}
	fmt.Fprintf(o.Progress, "route: starting sm-manager with one cluster for the routed path\n")
	cfg, err := managerConfig(dir, 1, harnessArgv)
	if err != nil {
		return err
	}
	if s.manager, err = startAttached(ctx, o.ManagerBin, dir, cfg, logw, cpuProfileFlags(o.ManagerCPUProfile)...); err != nil {
		return err
	}
	pongs, err := s.manager.ready(ctx, "0", startTimeout)
	if err != nil {
		return err
	}
	if s.routedHarness, err = pidOf(pongs[0]); err != nil {
		return err
	}
	paths := []string{pathDirect, pathRouted}
	if o.Echo {
		argv := o.EchoArgv
		if argv == nil {
			if argv, err = echoClusterArgv(); err != nil {
				return err
			}
		}
		fmt.Fprintf(o.Progress, "route: starting the minimal echo cluster, direct and routed\n")
		sub := filepath.Join(dir, "echo")
		if err := os.Mkdir(sub, 0o700); err != nil {
			return err
		}
		if s.echoDirect, err = startDirect(ctx, argv, sub, logw); err != nil {
			return fmt.Errorf("echo cluster: %w", err)
		}
		if s.echoManager, s.echoCluster, err = startOneClusterManager(ctx, o, sub, argv, logw); err != nil {
			return fmt.Errorf("echo cluster: %w", err)
		}
		paths = append(paths, pathEchoDirect, pathEchoRouted)
	}
	if nodeArgv != nil {
		fmt.Fprintf(o.Progress, "route: starting sm-manager with one Node cluster on @sm-supervisor/client (%s)\n", filepath.Base(nodeArgv[len(nodeArgv)-1]))
		if s.nodeManager, s.nodeCluster, err = startNodeManager(ctx, o, dir, nodeArgv, logw); err != nil {
			return err
		}
		paths = append(paths, pathNode)
	}

	if err := rep.readRest(ctx, o, s.pids(), "start"); err != nil {
		return err
	}
	payload := echoPayload(o.PayloadBytes)
	req := ipc.Frame{Op: "echo", Target: "0", Payload: payload}
	for _, n := range o.InFlight {
		for round := 1; round <= o.Rounds; round++ {
			order := paths
			if rep.peer != nil {
				order = append(slices.Clone(paths), pathPeer)
			}
			order = roundOrder(order, round)
			fmt.Fprintf(o.Progress, "route: %d in flight, round %d/%d: %s\n", n, round, o.Rounds, strings.Join(order, ", "))
			for _, path := range order {
				if path == pathPeer {
					if err := rep.runPeerRound(ctx, o, n, round); err != nil {
						return err
					}
					continue
				}
				p, pids := s.path(path)
				fmt.Fprintf(o.Progress, "route: %s, %d in flight, round %d/%d: %v after %v warm-up\n", path, n, round, o.Rounds, o.Duration, o.Warmup)
				c, err := measure(ctx, o, p, req, n, pids)
				c.Path, c.Round = path, round
				rep.Cases = append(rep.Cases, c)
				if err != nil {
					return fmt.Errorf("%s, %d in flight: %w", path, n, err)
				}
			}
			rep.compareRound(n, round)
		}
	}
	return rep.readRest(ctx, o, s.pids(), "end")
}

// path returns the pipe the load of path goes through and the processes
// whose CPU it is metered by: the bench (the client), the cluster process
// (as "harness", "echo" or "node") and, on routed paths, the manager.
func (s *routeSetup) path(path string) (*pipe, map[string]int) {
	bench := os.Getpid()
	switch path {
	case pathRouted:
		return s.manager.client, map[string]int{"bench": bench, "harness": s.routedHarness, "manager": s.manager.pid()}
	case pathEchoDirect:
		return s.echoDirect.pipe, map[string]int{"bench": bench, "echo": s.echoDirect.pid()}
	case pathEchoRouted:
		return s.echoManager.client, map[string]int{"bench": bench, "echo": s.echoCluster, "manager": s.echoManager.pid()}
	case pathNode:
		return s.nodeManager.client, map[string]int{"bench": bench, "node": s.nodeCluster, "manager": s.nodeManager.pid()}
	}
	return s.direct.pipe, map[string]int{"bench": bench, "harness": s.direct.pid()}
}

// pids are every process the run started (and the bench), by name.
func (s *routeSetup) pids() map[string]int {
	pids := map[string]int{"bench": os.Getpid(), "harness": s.direct.pid(), "manager": s.manager.pid(), "routed harness": s.routedHarness}
	if s.echoDirect != nil {
		pids["echo"], pids["echo manager"], pids["routed echo"] = s.echoDirect.pid(), s.echoManager.pid(), s.echoCluster
	}
	if s.nodeManager != nil {
		pids["node manager"], pids["node"] = s.nodeManager.pid(), s.nodeCluster
	}
	return pids
}

// readRest reads the machine for o.Rest with every process of the run idle
// (heartbeats aside), as a case of path "rest": its others' CPU is what the
// figure reads with no load of ours, at the run's start and end (when).
func (r *routeReport) readRest(ctx context.Context, o routeOptions, pids map[string]int, when string) error {
	if o.Rest <= 0 {
		return nil
	}
	fmt.Fprintf(o.Progress, "route: reading the machine at rest for %v (%s)\n", o.Rest, when)
	meter := newCPUMeter(pids)
	meter.mark(true)
	if err := sleep(ctx, o.Rest); err != nil {
		return err
	}
	meter.mark(false)
	if meter.err != nil {
		return meter.err
	}
	c := routeCase{Scenario: "route", Path: pathRest, WindowS: o.Rest.Seconds(), OthersCPUPercent: meter.othersPercent(), RestAt: when}
	c.CPUPercent = map[string]float64{}
	el := meter.machine[1].at.Sub(meter.machine[0].at)
	for name := range pids {
		c.CPUPercent[name] = percentOf(meter.after[name].cpu-meter.before[name].cpu, el)
	}
	r.Rest = append(r.Rest, c)
	return nil
}

// compareRound sets the ratios of the round's cases at n in flight, once they
// have all run: routed against direct, and the peer's against routed and the
// Node case.
func (r *routeReport) compareRound(n, round int) {
	byPath := map[string]*routeCase{}
	for i := range r.Cases {
		if c := &r.Cases[i]; c.InFlight == n && c.Round == round {
			byPath[c.Path] = c
		}
	}
	for routedPath, directPath := range directOf {
		routed, direct := byPath[routedPath], byPath[directPath]
		if routed != nil && direct != nil && direct.ReqPerS > 0 {
			routed.ThroughputRatio = routed.ReqPerS / direct.ReqPerS
			routed.P50DiffUS = routed.P50US - direct.P50US
		}
	}
	routed, node := byPath[pathRouted], byPath[pathNode]
	for i := range r.Peers {
		c := &r.Peers[i]
		if c.InFlight != n || c.Round != round || c.ReqPerS <= 0 {
			continue
		}
		if routed != nil {
			c.RoutedReqPerS, c.RoutedCPUUSPerReq, c.Ratio = routed.ReqPerS, routed.CPUUSPerReq, routed.ReqPerS/c.ReqPerS
		}
		if node != nil {
			c.NodeReqPerS, c.NodeCPUUSPerReq, c.NodeRatio = node.ReqPerS, node.CPUUSPerReq, node.ReqPerS/c.ReqPerS
		}
	}
}

// measure runs one case on p.
func measure(ctx context.Context, o routeOptions, p *pipe, req ipc.Frame, window int, pids map[string]int) (routeCase, error) {
	meter := newCPUMeter(pids)
	res, err := p.run(ctx, load{
		request:  req,
		window:   window,
		warmup:   o.Warmup,
		duration: o.Duration,
		drain:    o.Drain,
		expect:   req.Payload,
		onWindow: meter.mark,
	})
	if err == nil {
		err = meter.err
	}
	c := routeCase{
		Scenario:     "route",
		InFlight:     window,
		PayloadBytes: len(req.Payload),
		WindowS:      res.Window.Seconds(),
		Requests:     res.Completed,
		ReqPerS:      res.Throughput(),
		P50US:        micros(res.Latency.Quantile(0.50)),
		P99US:        micros(res.Latency.Quantile(0.99)),
		P999US:       micros(res.Latency.Quantile(0.999)),
		MaxUS:        micros(res.Latency.Max()),
		books:        res.books,
		CPUUSPerReq:  meter.perRequest(res.Completed),

		OthersCPUPercent: meter.othersPercent(),
	}
	if _, ok := pids["manager"]; ok {
		c.ManagerRSSKiB = meter.after["manager"].rssKiB
	}
	return c, err
}

func (s *routeSetup) stop() error {
	var errs []error
	if s.echoManager != nil {
		errs = append(errs, s.echoManager.shutdown())
	}
	if s.echoDirect != nil {
		errs = append(errs, s.echoDirect.stop())
	}
	if s.nodeManager != nil {
		errs = append(errs, s.nodeManager.shutdown())
	}
	if s.manager != nil {
		errs = append(errs, s.manager.shutdown())
	}
	if s.direct != nil {
		errs = append(errs, s.direct.stop())
	}
	return errors.Join(errs...)
}

// echoPayload is a JSON object of n bytes (at least 12, its smallest).
func echoPayload(n int) []byte {
	const head, tail = `{"data":"`, `"}`
	fill := max(n-len(head)-len(tail), 1)
	return []byte(head + strings.Repeat("x", fill) + tail)
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
