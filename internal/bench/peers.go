package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"
)

// The peer comparison of the route scenario (issue 7, item 2): the same
// routed echo through discord-hybrid-sharding, whose harness is
// internal/bench/peers/hybrid-route.js (see internal/bench/peers/README.md). Route runs it after
// each direct/routed pair, at the same in-flight count and payload, and
// compares sm's routed throughput of that round with the peer's.

// peerMode says whether the route scenario runs the peer harness.
type peerMode int

const (
	// peersAuto runs it when node is on $PATH and internal/bench/peers/node_modules exists.
	peersAuto peerMode = iota
	// peersOn runs it, after `npm ci` if node_modules is missing; failing to is an error.
	peersOn
	// peersOff never runs it.
	peersOff
)

// String and Set make *peerMode a flag: --peers, --peers=false, --peers=auto.
func (m *peerMode) String() string {
	if m == nil {
		return "auto"
	}
	switch *m {
	case peersOn:
		return "true"
	case peersOff:
		return "false"
	}
	return "auto"
}

// Set parses auto, or a boolean for on and off.
func (m *peerMode) Set(v string) error {
	if v == "auto" {
		*m = peersAuto
		return nil
	}
	on, err := strconv.ParseBool(v)
	if err != nil {
		return fmt.Errorf("%q is not true, false or auto", v)
	}
	*m = peersOff
	if on {
		*m = peersOn
	}
	return nil
}

// IsBoolFlag lets --peers stand alone.
func (m *peerMode) IsBoolFlag() bool { return true }

const (
	peerName   = "discord-hybrid-sharding"
	peerScript = "hybrid-route.js"
)

// peerAPIs are the harness's two round trips: broadcastEval (the library's own
// cluster-to-cluster routing) and request (.request()/.reply(), with the
// manager forwarding).
var peerAPIs = []string{"broadcastEval", "request"}

// addPeerFlags adds the route scenario's peer flags to fs.
func addPeerFlags(fs *flag.FlagSet, o *routeOptions) {
	fs.Var(&o.Peers, "peers", "also run "+peerName+"'s routed round trip (internal/bench/peers; needs node) and print sm's ratio to it:\n"+
		"true runs npm ci there first if node_modules is missing, false skips it (default: auto, when node and node_modules are there)")
	fs.StringVar(&o.PeersDir, "peers-dir", "", "the peer harness directory (default: internal/bench/peers above the working directory or sm-bench)")
}

// peerCase is one run of the peer harness: one API at one in-flight count in
// one round, beside sm's routed case of the same round.
type peerCase struct {
	Scenario     string  `json:"scenario"` // "route"
	Path         string  `json:"path"`     // "peer"
	Peer         string  `json:"peer"`
	Version      string  `json:"version"`
	API          string  `json:"api"`
	InFlight     int     `json:"in_flight"`
	Round        int     `json:"round"`
	PayloadBytes int     `json:"payload_bytes"`
	WindowS      float64 `json:"window_s"`
	Requests     uint64  `json:"requests"`
	ReqPerS      float64 `json:"req_per_s"`
	P50US        float64 `json:"p50_us"`
	P99US        float64 `json:"p99_us"`
	Sent         uint64  `json:"sent"`
	OK           uint64  `json:"ok"`
	Errors       uint64  `json:"errors"`
	BadPayload   uint64  `json:"bad_payload"`
	Lost         uint64  `json:"lost"`
	FirstError   string  `json:"first_error,omitempty"`
	Mode         string  `json:"mode"`
	TotalShards  int     `json:"total_shards"`
	Clusters     int     `json:"clusters"`
	DiscordJS    string  `json:"discord_js"`
	Node         string  `json:"node"`
	// CPUUSPerReq is each of the peer's processes' CPU time over the window
	// per request, in µs: client (cluster 0, the load), manager, and target
	// (cluster 1); OthersCPUPercent is the rest of the machine's, as in routeCase.
	CPUUSPerReq      map[string]float64 `json:"cpu_us_per_req,omitempty"`
	OthersCPUPercent float64            `json:"others_cpu_percent"`
	// RoutedReqPerS is sm's routed throughput in the same round, and Ratio
	// that over the peer's; RoutedCPUUSPerReq is that case's CPUUSPerReq
	// (bench, manager, harness: the same three roles as client, manager, target).
	RoutedReqPerS     float64            `json:"routed_req_per_s"`
	Ratio             float64            `json:"ratio"`
	RoutedCPUUSPerReq map[string]float64 `json:"routed_cpu_us_per_req,omitempty"`
	// With --node: the Node case of the same round (sm routed to a Node
	// cluster on @sm-supervisor/client), its throughput over the peer's, and
	// its CPU per request (bench, manager, node).
	NodeReqPerS     float64            `json:"node_req_per_s,omitempty"`
	NodeRatio       float64            `json:"node_ratio,omitempty"`
	NodeCPUUSPerReq map[string]float64 `json:"node_cpu_us_per_req,omitempty"`
}

// peerLine is the harness's JSON line.
type peerLine struct {
	Peer         string  `json:"peer"`
	Version      string  `json:"version"`
	API          string  `json:"api"`
	InFlight     int     `json:"in_flight"`
	ReqS         float64 `json:"req_s"`
	P50US        float64 `json:"p50_us"`
	P99US        float64 `json:"p99_us"`
	PayloadBytes int     `json:"payload_bytes"`
	WindowS      float64 `json:"window_s"`
	Requests     uint64  `json:"requests"`
	Sent         uint64  `json:"sent"`
	OK           uint64  `json:"ok"`
	Errors       uint64  `json:"errors"`
	BadPayload   uint64  `json:"bad_payload"`
	Lost         uint64  `json:"lost"`
	FirstError   string  `json:"first_error"`
	Mode         string  `json:"mode"`
	TotalShards  int     `json:"total_shards"`
	Clusters     int     `json:"clusters"`
	DiscordJS    string  `json:"discord_js"`
	Node         string  `json:"node"`
}

// peerSummary compares sm's routed path with one peer API at one in-flight
// count over the rounds: medians of each side and of the per-round ratios.
type peerSummary struct {
	Scenario      string  `json:"scenario"` // "route"
	Path          string  `json:"path"`     // "peer_summary"
	Peer          string  `json:"peer"`
	Version       string  `json:"version"`
	API           string  `json:"api"`
	InFlight      int     `json:"in_flight"`
	Rounds        int     `json:"rounds"`
	PeerReqPerS   float64 `json:"peer_req_per_s"`
	RoutedReqPerS float64 `json:"routed_req_per_s"`
	Ratio         float64 `json:"ratio"`
	// The spread over the rounds (issue 16): the lowest and highest of the
	// peer's req/s and of the rounds' ratios, and the peer's coefficient of
	// variation (standard deviation over mean).
	PeerReqPerSMin float64 `json:"peer_req_per_s_min"`
	PeerReqPerSMax float64 `json:"peer_req_per_s_max"`
	PeerCV         float64 `json:"peer_cv"`
	RatioMin       float64 `json:"ratio_min"`
	RatioMax       float64 `json:"ratio_max"`
	// Medians of the managers' CPU per request, and of all three processes'
	// (client + manager + cluster, and bench + manager + harness).
	PeerManagerCPUUSPerReq   float64 `json:"peer_manager_cpu_us_per_req,omitempty"`
	RoutedManagerCPUUSPerReq float64 `json:"routed_manager_cpu_us_per_req,omitempty"`
	PeerTotalCPUUSPerReq     float64 `json:"peer_total_cpu_us_per_req,omitempty"`
	RoutedTotalCPUUSPerReq   float64 `json:"routed_total_cpu_us_per_req,omitempty"`
	// With --node: medians over the rounds with a Node case of its req/s,
	// its throughput over the peer's, and the CPU per request of its manager
	// and of its three processes (bench + manager + node).
	NodeRounds             int     `json:"node_rounds,omitempty"`
	NodeReqPerS            float64 `json:"node_req_per_s,omitempty"`
	NodeRatio              float64 `json:"node_ratio,omitempty"`
	NodeManagerCPUUSPerReq float64 `json:"node_manager_cpu_us_per_req,omitempty"`
	NodeTotalCPUUSPerReq   float64 `json:"node_total_cpu_us_per_req,omitempty"`
	// Fastest marks the peer API with the highest median throughput at this
	// in-flight count: the one the targets are checked against.
	Fastest bool `json:"fastest"`
}

// targetPeerRatio is issue 16's target (issue 7's was 4×): sm's routed
// req/s at least 8× the peer's (checked at 64 in flight, against the peer's
// faster API).
const targetPeerRatio = 8.0

// peerRunner runs the harness; nil when the peer comparison is off.
type peerRunner struct {
	node, dir string
	explicit  bool // --peers: a failure is an error, not a note
}

// preparePeers decides whether Route runs the peer harness, and sets rep.peer
// if it does; a reason not to goes to rep.PeerNote. With --peers, not being
// able to is an error.
func preparePeers(ctx context.Context, o routeOptions, rep *routeReport) error {
	if o.Peers == peersOff {
		return nil
	}
	explicit := o.Peers == peersOn
	skip := func(why string) error {
		if explicit {
			return fmt.Errorf("route --peers: %s", why)
		}
		rep.PeerNote = "peer comparison skipped: " + why
		return nil
	}
	node, err := exec.LookPath("node")
	if err != nil {
		return skip("node is not on $PATH")
	}
	dir, err := findPeersDir(o.PeersDir)
	if err != nil {
		return skip(err.Error())
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", peerName)); err != nil {
		if !explicit {
			return skip(filepath.Join(dir, "node_modules") + " is missing (run `npm ci` there, or pass --peers)")
		}
		npm, err := exec.LookPath("npm")
		if err != nil {
			return skip(filepath.Join(dir, "node_modules") + " is missing and npm is not on $PATH")
		}
		fmt.Fprintf(o.Progress, "route: npm ci in %s\n", dir)
		cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund")
		cmd.Dir, cmd.Stdout, cmd.Stderr = dir, o.Progress, o.Progress
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("route --peers: npm ci in %s: %w", dir, err)
		}
	}
	rep.peer = &peerRunner{node: node, dir: dir, explicit: explicit}
	return nil
}

// findPeersDir returns flagValue, else the first internal/bench/peers holding the
// harness in the working directory, sm-bench's directory, or one above them.
func findPeersDir(flagValue string) (string, error) {
	if flagValue != "" {
		dir, err := filepath.Abs(flagValue)
		if err == nil {
			_, err = os.Stat(filepath.Join(dir, peerScript))
		}
		return dir, err
	}
	dir, err := findBenchDir(filepath.Join("internal", "bench", "peers"), peerScript)
	if err != nil {
		return "", errors.New("internal/bench/peers not found above the working directory or sm-bench (pass --peers-dir)")
	}
	return dir, nil
}

// runPeerRound runs the peer harness at n in flight for round, beside sm's
// cases of that round, and adds its cases to rep (compareRound sets their
// ratios once the round is over). A failure of the harness is an error with
// --peers, else a note that ends the comparison.
func (rep *routeReport) runPeerRound(ctx context.Context, o routeOptions, n, round int) error {
	if rep.peer == nil {
		return nil
	}
	fmt.Fprintf(o.Progress, "route: %s (%s), %d in flight, round %d/%d: %v after %v warm-up each\n",
		peerName, strings.Join(peerAPIs, ", "), n, round, o.Rounds, o.Duration, o.Warmup)
	lines, err := rep.peer.run(ctx, o, n)
	for _, l := range lines {
		c := peerCase{
			Scenario: "route", Path: pathPeer, Peer: l.Peer, Version: l.Version, API: l.API,
			InFlight: l.InFlight, Round: round, PayloadBytes: l.PayloadBytes, WindowS: l.WindowS,
			Requests: l.Requests, ReqPerS: l.ReqS, P50US: l.P50US, P99US: l.P99US,
			Sent: l.Sent, OK: l.OK, Errors: l.Errors, BadPayload: l.BadPayload, Lost: l.Lost, FirstError: l.FirstError,
			Mode: l.Mode, TotalShards: l.TotalShards, Clusters: l.Clusters, DiscordJS: l.DiscordJS, Node: l.Node,
		}
		if l.meter != nil && l.meter.err == nil {
			c.CPUUSPerReq = l.meter.perRequest(l.Requests)
			c.OthersCPUPercent = l.meter.othersPercent()
		}
		rep.Peers = append(rep.Peers, c)
	}
	if err == nil && len(lines) != len(peerAPIs) {
		err = fmt.Errorf("%d result lines, want %d", len(lines), len(peerAPIs))
	}
	if err != nil {
		err = fmt.Errorf("%s harness, %d in flight: %w", peerName, n, err)
		if ctx.Err() != nil || rep.peer.explicit {
			return err
		}
		rep.PeerNote = fmt.Sprintf("peer comparison stopped: %v", err)
		rep.peer = nil
	}
	return nil
}

// run runs the harness once and returns its result lines, with the CPU its
// processes spent over each window.
func (p *peerRunner) run(ctx context.Context, o routeOptions, n int) ([]peerResult, error) {
	per := o.Warmup + o.Duration + o.Drain + 5*time.Second
	ctx, cancel := context.WithTimeout(ctx, time.Minute+time.Duration(len(peerAPIs))*per)
	defer cancel()
	cmd := exec.CommandContext(ctx, p.node, peerScript,
		"--inflight="+strconv.Itoa(n),
		"--payload="+strconv.Itoa(o.PayloadBytes),
		"--warmup-ms="+strconv.FormatInt(o.Warmup.Milliseconds(), 10),
		"--duration-ms="+strconv.FormatInt(max(o.Duration.Milliseconds(), 1), 10),
		"--drain-ms="+strconv.FormatInt(o.Drain.Milliseconds(), 10),
		"--apis="+strings.Join(peerAPIs, ","),
	)
	var stderr bytes.Buffer
	cmd.Dir, cmd.Stderr = p.dir, &stderr
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) } // it stops its clusters
	cmd.WaitDelay = 10 * time.Second
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	lines, perr := readPeerLines(stdout, n, len(echoPayload(o.PayloadBytes)))
	if perr != nil {
		cmd.Cancel()
	}
	err = cmd.Wait()
	if perr != nil {
		err = perr
	}
	if err != nil && stderr.Len() > 0 {
		tail := stderr.Bytes()
		if len(tail) > 2<<10 {
			tail = tail[len(tail)-2<<10:]
		}
		err = fmt.Errorf("%w\n--- tail of its stderr ---\n%s", err, tail)
	}
	return lines, err
}

// peerResult is a result line and the CPU its processes spent over its window.
type peerResult struct {
	peerLine
	meter *cpuMeter
}

// readPeerLines reads the harness's JSON lines to the end, samples the CPU of
// its processes at each window's marks, and checks that the results measured
// what was asked.
func readPeerLines(r io.Reader, inFlight, payloadBytes int) ([]peerResult, error) {
	var (
		out   []peerResult
		meter *cpuMeter
		first error
	)
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 || b[0] != '{' || first != nil {
			continue // keep reading: the harness must not block on a full pipe
		}
		var l struct {
			peerLine
			Mark string         `json:"mark"`
			PIDs map[string]int `json:"pids"`
		}
		if err := json.Unmarshal(b, &l); err != nil {
			first = fmt.Errorf("line %.200q: %w", b, err)
			continue
		}
		switch {
		case l.Mark == "open":
			meter = newCPUMeter(l.PIDs)
			meter.mark(true)
		case l.Mark == "close" && meter != nil:
			meter.mark(false)
		case l.Mark != "":
		case l.Peer != peerName || l.InFlight != inFlight || l.PayloadBytes != payloadBytes:
			first = fmt.Errorf("result line %.200q: want peer %s, in_flight %d, payload_bytes %d", b, peerName, inFlight, payloadBytes)
		default:
			out = append(out, peerResult{l.peerLine, meter})
			meter = nil
		}
	}
	if err := sc.Err(); err != nil && first == nil {
		first = err
	}
	return out, first
}

// PeerSummaries compares sm's routed path with each peer API at each
// in-flight count.
func (rep *routeReport) PeerSummaries() []peerSummary {
	var out []peerSummary
	for _, n := range rep.Options.InFlight {
		first := len(out)
		for _, api := range peerAPIs {
			var ratio, peer, routed, peerMgr, routedMgr, peerAll, routedAll []float64
			var nodeRatio, nodeReqs, nodeMgr, nodeAll []float64
			var version string
			for _, c := range rep.Peers {
				if c.InFlight != n || c.API != api || c.Ratio <= 0 {
					continue
				}
				if c.NodeRatio > 0 {
					nodeRatio, nodeReqs = append(nodeRatio, c.NodeRatio), append(nodeReqs, c.NodeReqPerS)
					if len(c.NodeCPUUSPerReq) == 3 {
						nodeMgr, nodeAll = append(nodeMgr, c.NodeCPUUSPerReq["manager"]), append(nodeAll, sumValues(c.NodeCPUUSPerReq))
					}
				}
				ratio, peer, routed = append(ratio, c.Ratio), append(peer, c.ReqPerS), append(routed, c.RoutedReqPerS)
				version = c.Version
				if len(c.CPUUSPerReq) == 3 && len(c.RoutedCPUUSPerReq) == 3 {
					peerMgr, routedMgr = append(peerMgr, c.CPUUSPerReq["manager"]), append(routedMgr, c.RoutedCPUUSPerReq["manager"])
					peerAll, routedAll = append(peerAll, sumValues(c.CPUUSPerReq)), append(routedAll, sumValues(c.RoutedCPUUSPerReq))
				}
			}
			if len(ratio) == 0 {
				continue
			}
			s := peerSummary{
				Scenario: "route", Path: "peer_summary", Peer: peerName, Version: version, API: api,
				InFlight: n, Rounds: len(ratio),
				PeerReqPerS: median(peer), RoutedReqPerS: median(routed), Ratio: median(ratio),
				PeerReqPerSMin: slices.Min(peer), PeerReqPerSMax: slices.Max(peer), PeerCV: cv(peer),
				RatioMin: slices.Min(ratio), RatioMax: slices.Max(ratio),
			}
			if len(peerMgr) > 0 {
				s.PeerManagerCPUUSPerReq, s.RoutedManagerCPUUSPerReq = median(peerMgr), median(routedMgr)
				s.PeerTotalCPUUSPerReq, s.RoutedTotalCPUUSPerReq = median(peerAll), median(routedAll)
			}
			if len(nodeRatio) > 0 {
				s.NodeRounds, s.NodeReqPerS, s.NodeRatio = len(nodeRatio), median(nodeReqs), median(nodeRatio)
			}
			if len(nodeMgr) > 0 {
				s.NodeManagerCPUUSPerReq, s.NodeTotalCPUUSPerReq = median(nodeMgr), median(nodeAll)
			}
			out = append(out, s)
		}
		fastest := -1
		for i := first; i < len(out); i++ {
			if fastest < 0 || out[i].PeerReqPerS > out[fastest].PeerReqPerS {
				fastest = i
			}
		}
		if fastest >= 0 {
			out[fastest].Fastest = true
		}
	}
	return out
}

// writePeerText prints the peer cases and the comparison, or why there are none.
func (rep *routeReport) writePeerText(w io.Writer) {
	if len(rep.Peers) > 0 {
		c := rep.Peers[0]
		fmt.Fprintf(w, "\npeer: %s %s (discord.js %s, Node %s), %s mode, totalShards %d in %d clusters, no login; cluster 0 → manager → cluster 1\n\n",
			c.Peer, c.Version, c.DiscordJS, c.Node, c.Mode, c.TotalShards, c.Clusters)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "peer api\tin flight\tround\treq/s\tp50 µs\tp99 µs\tCPU µs/req: cluster 0\tmanager\tcluster 1\tok\terrors\tlost\tothers' CPU %\tsm routed req/s\tsm/peer\tsm to Node/peer\t")
		cpu := func(c peerCase, k string) string {
			if v, ok := c.CPUUSPerReq[k]; ok {
				return fmt.Sprintf("%.1f", v)
			}
			return "-"
		}
		for _, c := range rep.Peers {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%.0f\t%.0f\t%s\t%s\t%s\t%d\t%d\t%d\t%.0f\t%.0f\t%.2f×\t%s\t\n",
				c.API, c.InFlight, c.Round, c.ReqPerS, c.P50US, c.P99US, cpu(c, "client"), cpu(c, "manager"), cpu(c, "target"),
				c.OK, c.Errors+c.BadPayload, c.Lost, c.OthersCPUPercent, c.RoutedReqPerS, c.Ratio, nodeNote(c))
		}
		tw.Flush()
		fmt.Fprintln(w)
		for _, s := range rep.PeerSummaries() {
			note := ""
			if s.Fastest && s.InFlight == 64 {
				note = fmt.Sprintf("  (target: ≥ %.0f× its faster API → %s)", targetPeerRatio, met(s.Ratio >= targetPeerRatio))
			} else if s.Fastest {
				note = "  (its faster API here)"
			}
			rounds := ""
			if s.Rounds > 1 {
				rounds = fmt.Sprintf(", median of %d rounds; the peer %.0f–%.0f req/s (CV %.0f%%), the ratio %.2f–%.2f×",
					s.Rounds, s.PeerReqPerSMin, s.PeerReqPerSMax, 100*s.PeerCV, s.RatioMin, s.RatioMax)
			}
			cpu := ""
			if s.PeerManagerCPUUSPerReq > 0 {
				cpu = fmt.Sprintf("; CPU µs/request: manager %.1f vs %.1f, all three processes %.0f vs %.0f",
					s.RoutedManagerCPUUSPerReq, s.PeerManagerCPUUSPerReq, s.RoutedTotalCPUUSPerReq, s.PeerTotalCPUUSPerReq)
			}
			fmt.Fprintf(w, "sm routed / %s %s at %d in flight: %.2f× (%.0f vs %.0f req/s%s%s)%s\n",
				s.Peer, s.API, s.InFlight, s.Ratio, s.RoutedReqPerS, s.PeerReqPerS, rounds, cpu, note)
		}
		for _, s := range rep.PeerSummaries() {
			if s.NodeRounds == 0 {
				continue
			}
			note := ""
			if s.Fastest && s.InFlight == 64 {
				note = fmt.Sprintf("  (target: ≥ %.0f× its faster API → %s)", targetNodePeerRatio, met(s.NodeRatio >= targetNodePeerRatio))
			}
			rounds := ""
			if s.NodeRounds > 1 {
				rounds = fmt.Sprintf(", median of %d rounds", s.NodeRounds)
			}
			cpu := ""
			if s.NodeManagerCPUUSPerReq > 0 && s.PeerManagerCPUUSPerReq > 0 {
				cpu = fmt.Sprintf("; CPU µs/request: manager %.1f vs %.1f, all three processes %.0f vs %.0f",
					s.NodeManagerCPUUSPerReq, s.PeerManagerCPUUSPerReq, s.NodeTotalCPUUSPerReq, s.PeerTotalCPUUSPerReq)
			}
			fmt.Fprintf(w, "sm routed to the Node cluster / %s %s at %d in flight: %.2f× (%.0f vs %.0f req/s%s%s)%s\n",
				s.Peer, s.API, s.InFlight, s.NodeRatio, s.NodeReqPerS, s.PeerReqPerS, rounds, cpu, note)
		}
	}
	if rep.PeerNote != "" {
		fmt.Fprintf(w, "\n%s\n", rep.PeerNote)
	}
}

// writePeerJSON prints a line per peer case, then per peer summary.
func (rep *routeReport) writePeerJSON(enc *json.Encoder) error {
	if err := encodeEach(enc, rep.Peers); err != nil {
		return err
	}
	return encodeEach(enc, rep.PeerSummaries())
}

// cv is the coefficient of variation of v: its standard deviation over its
// mean (0 for fewer than two values).
func cv(v []float64) float64 {
	if len(v) < 2 {
		return 0
	}
	var sum, sq float64
	for _, x := range v {
		sum += x
	}
	mean := sum / float64(len(v))
	for _, x := range v {
		sq += (x - mean) * (x - mean)
	}
	if mean == 0 {
		return 0
	}
	return math.Sqrt(sq/float64(len(v)-1)) / mean
}

func sumValues(m map[string]float64) float64 {
	var sum float64
	for _, v := range m {
		sum += v
	}
	return sum
}
