package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
)

// The Node case of the route scenario (issue 11's benchmark): sm's routed
// echo to a cluster process written in Node on @sm-supervisor/client
// (clients/node), internal/bench/nodecluster/echo-cluster.mjs, with the same
// load client as the other cases. Beside the peer harness in the same round,
// it answers issue 11's question: does a Node bot on sm route faster than one
// on discord-hybrid-sharding, and what does the package cost per request?

// pathNode is the route scenario's path bench ↔ sm-manager ↔ a Node cluster.
const pathNode = "node"

// nodeScript is the Node cluster's file, under internal/bench/nodecluster.
const nodeScript = "echo-cluster.mjs"

// targetNodePeerRatio is issue 11's target: sm's routed req/s to the Node
// cluster at least 3× the peer's (at 64 in flight, against its faster API).
const targetNodePeerRatio = 3.0

// addNodeFlags adds the route scenario's Node flags to fs.
func addNodeFlags(fs *flag.FlagSet, o *routeOptions) {
	fs.BoolVar(&o.Node, "node", false, "also route the echo to a Node cluster on @sm-supervisor/client (internal/bench/nodecluster; needs node on $PATH)")
	fs.StringVar(&o.NodeScript, "node-script", "", "the Node cluster's script (default: internal/bench/nodecluster/"+nodeScript+" above the working directory or sm-bench)")
	fs.StringVar(&o.NodeCPUProfile, "node-cpuprofile", "", "make the Node cluster write a V8 CPU profile (node --cpu-prof) into this directory when it exits")
}

// nodeCommand returns the Node cluster's command line (node and its script),
// or an error saying what is missing.
func nodeCommand(o routeOptions) ([]string, error) {
	node, err := exec.LookPath("node")
	if err != nil {
		return nil, errors.New("route --node: node is not on $PATH")
	}
	script := o.NodeScript
	if script != "" {
		if script, err = filepath.Abs(script); err == nil {
			_, err = os.Stat(script)
		}
	} else {
		var dir string
		dir, err = findBenchDir(filepath.Join("internal", "bench", "nodecluster"), nodeScript)
		script = filepath.Join(dir, nodeScript)
	}
	if err != nil {
		return nil, fmt.Errorf("route --node: %w (pass --node-script)", err)
	}
	if o.NodeCPUProfile == "" {
		return []string{node, script}, nil
	}
	// NODE_OPTIONS may not carry --cpu-prof: it goes on the command line.
	dir, err := filepath.Abs(o.NodeCPUProfile)
	if err == nil {
		err = os.MkdirAll(dir, 0o755)
	}
	if err != nil {
		return nil, fmt.Errorf("route --node-cpuprofile: %w", err)
	}
	return []string{node, "--cpu-prof", "--cpu-prof-dir=" + dir, script}, nil
}

// startNodeManager starts the Node case's sm-manager, in a directory of its
// own under dir, with one cluster running argv (see startOneClusterManager).
func startNodeManager(ctx context.Context, o routeOptions, dir string, argv []string, logw io.Writer) (*attachedManager, int, error) {
	sub := filepath.Join(dir, "node")
	if err := os.Mkdir(sub, 0o700); err != nil {
		return nil, 0, err
	}
	m, pid, err := startOneClusterManager(ctx, o, sub, argv, logw)
	if err != nil {
		return nil, 0, fmt.Errorf("the Node cluster: %w", err)
	}
	return m, pid, nil
}

// startOneClusterManager starts an sm-manager in dir (its socket and config
// there) with one cluster of one shard running argv, the generated defaults
// of the routed case, and waits until a ping reaches it. It returns the
// manager and the cluster process's pid.
func startOneClusterManager(ctx context.Context, o routeOptions, dir string, argv []string, logw io.Writer) (*attachedManager, int, error) {
	cfg, err := managerConfig(dir, 1, argv)
	if err != nil {
		return nil, 0, err
	}
	m, err := startAttached(ctx, o.ManagerBin, dir, cfg, logw)
	if err != nil {
		return nil, 0, err
	}
	pongs, err := m.ready(ctx, "0", startTimeout)
	var pid int
	if err == nil {
		pid, err = pidOf(pongs[0])
	}
	if err != nil {
		return nil, 0, errors.Join(err, m.shutdown())
	}
	return m, pid, nil
}

// nodeSummary is the Node case at one in-flight count over the rounds: the
// medians of its figures, and of each round's sm routed (to the Go harness)
// of the same round for scale.
type nodeSummary struct {
	Scenario string  `json:"scenario"` // "route"
	Path     string  `json:"path"`     // "node_summary"
	InFlight int     `json:"in_flight"`
	Rounds   int     `json:"rounds"`
	ReqPerS  float64 `json:"req_per_s"`
	P50US    float64 `json:"p50_us"`
	P99US    float64 `json:"p99_us"`
	// CPUUSPerReq holds the medians of bench, manager and node (the Node
	// cluster); TotalCPUUSPerReq the median of their sum.
	CPUUSPerReq      map[string]float64 `json:"cpu_us_per_req"`
	TotalCPUUSPerReq float64            `json:"total_cpu_us_per_req"`
	OthersCPUPercent float64            `json:"others_cpu_percent"`
	RoutedReqPerS    float64            `json:"routed_req_per_s,omitempty"`
}

// NodeSummaries summarizes the Node cases at each in-flight count.
func (r *routeReport) NodeSummaries() []nodeSummary {
	var out []nodeSummary
	for _, n := range r.Options.InFlight {
		var rps, p50, p99, total, others, routed []float64
		cpu := map[string][]float64{}
		for _, c := range r.Cases {
			if c.InFlight != n {
				continue
			}
			if c.Path == pathRouted && c.ReqPerS > 0 {
				routed = append(routed, c.ReqPerS)
			}
			if c.Path != pathNode || c.ReqPerS <= 0 {
				continue
			}
			rps, p50, p99 = append(rps, c.ReqPerS), append(p50, c.P50US), append(p99, c.P99US)
			others = append(others, c.OthersCPUPercent)
			for k, v := range c.CPUUSPerReq {
				cpu[k] = append(cpu[k], v)
			}
			total = append(total, sumValues(c.CPUUSPerReq))
		}
		if len(rps) == 0 {
			continue
		}
		s := nodeSummary{
			Scenario: "route", Path: "node_summary", InFlight: n, Rounds: len(rps),
			ReqPerS: median(rps), P50US: median(p50), P99US: median(p99),
			CPUUSPerReq: map[string]float64{}, TotalCPUUSPerReq: median(total), OthersCPUPercent: median(others),
		}
		for k, v := range cpu {
			s.CPUUSPerReq[k] = median(v)
		}
		if len(routed) > 0 {
			s.RoutedReqPerS = median(routed)
		}
		out = append(out, s)
	}
	return out
}

// writeNodeText prints the Node summaries (the cases are in the route table).
func (r *routeReport) writeNodeText(w io.Writer) {
	for _, s := range r.NodeSummaries() {
		rounds := ""
		if s.Rounds > 1 {
			rounds = fmt.Sprintf(", median of %d rounds", s.Rounds)
		}
		fmt.Fprintf(w, "routed to the Node cluster (@sm-supervisor/client) at %d in flight: %.0f req/s, p50 %.0f µs, p99 %.0f µs; CPU µs/request: bench %.1f, manager %.1f, node %.1f, all three %.1f%s\n",
			s.InFlight, s.ReqPerS, s.P50US, s.P99US, s.CPUUSPerReq["bench"], s.CPUUSPerReq["manager"], s.CPUUSPerReq["node"], s.TotalCPUUSPerReq, rounds)
	}
}

// roundOrder is the order of a round's cases: as given in odd rounds,
// reversed in even ones, so that no case always runs first (on a machine
// warming up) or right after the same neighbour (issue 16).
func roundOrder(paths []string, round int) []string {
	out := make([]string, len(paths))
	for i, p := range paths {
		if round%2 == 0 {
			out[len(paths)-1-i] = p
		} else {
			out[i] = p
		}
	}
	return out
}

// findBenchDir returns the first directory sub holding file in the working
// directory, sm-bench's directory, or one above them.
func findBenchDir(sub, file string) (string, error) {
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if exe, err := os.Executable(); err == nil {
		starts = append(starts, filepath.Dir(exe))
	}
	for _, d := range starts {
		for {
			p := filepath.Join(d, sub)
			if _, err := os.Stat(filepath.Join(p, file)); err == nil {
				return p, nil
			}
			up := filepath.Dir(d)
			if up == d {
				break
			}
			d = up
		}
	}
	return "", fmt.Errorf("%s not found above the working directory or sm-bench", filepath.ToSlash(filepath.Join(sub, file)))
}

// nodeNote is the Node column's label in the peer table.
func nodeNote(c peerCase) string {
	if c.NodeRatio <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f×", c.NodeRatio)
}
