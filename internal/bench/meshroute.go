package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/sm-supervisor/sm/ipc"
	"github.com/sm-supervisor/sm/manager"
)

// The mesh scenario: cross-host routing's cost (issue 13's benchmark). Two
// sm-manager hosts joined through a real nats-server each run one minimal
// echo cluster; the bench's client on host a sends the same echo load to
// a's own cluster (same-host: client → a → cluster) and to b's
// (cross-host: client → a → NATS → b → cluster and back), at each
// in-flight count, alternating the order every round, with exact books.

// meshOptions shape the mesh scenario; zero fields take defaultMeshOptions'.
type meshOptions struct {
	ManagerBin, HarnessBin, NATSBin string
	InFlight                        []int
	Rounds                          int
	PayloadBytes                    int
	Warmup, Duration, Drain         time.Duration
	// EchoArgv is the cluster command (default: this executable's echo-cluster).
	EchoArgv []string
	// ManagerCPUProfile, if set, is a directory where both managers write a
	// CPU profile (a.pprof, b.pprof) of their whole run.
	ManagerCPUProfile string
	Progress          io.Writer
}

var defaultMeshOptions = meshOptions{
	InFlight: []int{1, 64}, Rounds: 3, PayloadBytes: 200,
	Warmup: time.Second, Duration: 5 * time.Second, Drain: 10 * time.Second,
}

// Paths of the mesh scenario.
const (
	pathSameHost  = "same-host"  // client → host a → a's cluster
	pathCrossHost = "cross-host" // client → host a → NATS → host b → b's cluster
)

// Goals of issue 13's benchmark.
const (
	targetMeshRatio  = 0.5
	targetMeshP50Add = 200.0 // µs
)

// meshReport is everything the mesh scenario measured.
type meshReport struct {
	Options meshOptions
	Cases   []routeCase
}

// meshSummary is cross-host against same-host at one in-flight count: the
// medians over the rounds of each round's ratio and p50 difference.
type meshSummary struct {
	Scenario        string             `json:"scenario"`
	Path            string             `json:"path"` // "summary"
	InFlight        int                `json:"in_flight"`
	Rounds          int                `json:"rounds"`
	ThroughputRatio float64            `json:"throughput_ratio"`
	P50DiffUS       float64            `json:"p50_diff_us"`
	ReqPerS         float64            `json:"req_per_s"`
	SameHostReqPerS float64            `json:"same_host_req_per_s"`
	CPUUSPerReq     map[string]float64 `json:"cpu_us_per_req"`
	SameCPUUSPerReq map[string]float64 `json:"same_host_cpu_us_per_req"`
}

func runMeshCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o := defaultMeshOptions
	fs := newScenarioFlags("mesh", stderr, &o.ManagerBin, &o.HarnessBin)
	fs.binary(&o.NATSBin, "nats-server")
	fs.Var((*intList)(&o.InFlight), "inflight", "comma-separated in-flight counts, one case each")
	fs.IntVar(&o.Rounds, "rounds", o.Rounds, "rounds of both paths per in-flight count, in reversed order every other round; the summary takes the median")
	fs.IntVar(&o.PayloadBytes, "payload", o.PayloadBytes, "echo payload size in bytes")
	fs.DurationVar(&o.Warmup, "warmup", o.Warmup, "load before each measured window")
	fs.DurationVar(&o.Duration, "duration", o.Duration, "measured window of each case")
	fs.DurationVar(&o.Drain, "drain", o.Drain, "wait for the last replies before counting them lost")
	fs.StringVar(&o.ManagerCPUProfile, "manager-cpuprofile", "", "a directory where both managers write CPU profiles (a.pprof, b.pprof)")
	var err error
	if o.Progress, err = fs.parse(args); err != nil {
		return err
	}
	rep, err := runMesh(ctx, o)
	return finishReport("mesh", stdout, rep, rep != nil && len(rep.Cases) > 0, err)
}

func runMesh(ctx context.Context, o meshOptions) (rep *meshReport, err error) {
	orDefaultIfZero(&o.Progress, io.Discard)
	if o.ManagerBin == "" || o.NATSBin == "" {
		return nil, errors.New("mesh: need the sm-manager and nats-server binaries")
	}
	if o.EchoArgv == nil {
		if o.EchoArgv, err = echoClusterArgv(); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp("", "sm-bench-mesh-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	logw, err := os.Create(filepath.Join(dir, "mesh.log"))
	if err != nil {
		return nil, err
	}
	defer func() {
		err = withLog(err, logw)
		logw.Close()
	}()
	rep = &meshReport{Options: o}

	fmt.Fprintf(o.Progress, "mesh: starting nats-server\n")
	natsURL, nats, err := startNATS(ctx, o.NATSBin, dir, logw)
	if err != nil {
		return rep, err
	}
	defer func() { _ = nats.stop(syscall.SIGTERM, 5*time.Second) }()
	hosts := map[string]*attachedManager{}
	defer func() {
		for _, id := range []string{"a", "b"} {
			if h := hosts[id]; h != nil {
				err = errors.Join(err, h.shutdown())
			}
		}
	}()
	for _, id := range []string{"a", "b"} {
		sub := filepath.Join(dir, id)
		if err := os.Mkdir(sub, 0o700); err != nil {
			return rep, err
		}
		cfg, err := managerConfig(sub, 2, o.EchoArgv)
		if err != nil {
			return rep, err
		}
		cfg.Mesh.NATSURL, cfg.Mesh.HostID, cfg.Mesh.MaxClusters, cfg.Mesh.Name = natsURL, id, 1, "smbench"
		var prof []string
		if o.ManagerCPUProfile != "" {
			prof = cpuProfileFlags(filepath.Join(o.ManagerCPUProfile, id+".pprof"))
		}
		fmt.Fprintf(o.Progress, "mesh: starting sm-manager host %s (one of the two clusters)\n", id)
		if hosts[id], err = startAttached(ctx, o.ManagerBin, sub, cfg, logw, prof...); err != nil {
			return rep, err
		}
	}
	a, b := hosts["a"], hosts["b"]
	pongs, err := a.ready(ctx, "*", 2*startTimeout)
	if err != nil {
		return rep, err
	}
	local, err := localCluster(ctx, a.socket, "a")
	if err != nil {
		return rep, err
	}
	remote := 1 - local
	localPID, err := pidOf(pongs[local])
	if err != nil {
		return rep, err
	}
	remotePID, err := pidOf(pongs[remote])
	if err != nil {
		return rep, err
	}
	payload := echoPayload(o.PayloadBytes)
	ro := routeOptions{Warmup: o.Warmup, Duration: o.Duration, Drain: o.Drain}
	bench := os.Getpid()
	for _, n := range o.InFlight {
		for round := 1; round <= o.Rounds; round++ {
			for _, path := range roundOrder([]string{pathSameHost, pathCrossHost}, round) {
				target, pids := strconv.Itoa(local), map[string]int{"bench": bench, "echo": localPID, "manager": a.pid()}
				if path == pathCrossHost {
					target = strconv.Itoa(remote)
					pids = map[string]int{"bench": bench, "echo": remotePID, "manager": a.pid(), "manager b": b.pid(), "nats": nats.pid()}
				}
				fmt.Fprintf(o.Progress, "mesh: %s, %d in flight, round %d/%d: %v after %v warm-up\n", path, n, round, o.Rounds, o.Duration, o.Warmup)
				c, err := measure(ctx, ro, a.client, ipc.Frame{Op: "echo", Target: target, Payload: payload}, n, pids)
				c.Scenario, c.Path, c.Round = "mesh", path, round
				rep.Cases = append(rep.Cases, c)
				if err != nil {
					return rep, fmt.Errorf("%s, %d in flight: %w", path, n, err)
				}
			}
			rep.compareRound(n, round)
		}
	}
	return rep, nil
}

// localCluster asks host's STATUS which of the two clusters it runs itself.
func localCluster(ctx context.Context, socket, host string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := ipc.Dial(ctx, ipc.ClientConfig{Path: socket, Register: ipc.Frame{Role: ipc.RoleClient, Name: "sm-bench-status"}})
	if err != nil {
		return 0, err
	}
	defer c.Close()
	r, err := c.Request(ctx, &ipc.Frame{Op: ipc.OpStatus})
	if err != nil {
		return 0, err
	}
	var st manager.Status
	if err := json.Unmarshal(r.Payload, &st); err != nil {
		return 0, err
	}
	for _, cs := range st.Clusters {
		if cs.HostID == host {
			return cs.ID, nil
		}
	}
	return 0, fmt.Errorf("host %s runs neither cluster", host)
}

// startNATS starts nats-server with JetStream on a free port of 127.0.0.1,
// its store in dir, and waits until it accepts connections.
func startNATS(ctx context.Context, bin, dir string, logw io.Writer) (string, *child, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	store := filepath.Join(dir, "jetstream")
	c, err := startChild("nats-server", []string{bin, "-js", "-a", "127.0.0.1", "-p", strconv.Itoa(port), "-sd", store}, os.Environ(), logw)
	if err != nil {
		return "", nil, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(startTimeout)
	for {
		nc, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			nc.Close()
			return "nats://" + addr, c, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			_ = c.stop(syscall.SIGKILL, time.Second)
			return "", nil, fmt.Errorf("nats-server not up: %w", c.why(err))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (r *meshReport) compareRound(n, round int) {
	var same, cross *routeCase
	for i := range r.Cases {
		if c := &r.Cases[i]; c.InFlight == n && c.Round == round {
			switch c.Path {
			case pathSameHost:
				same = c
			case pathCrossHost:
				cross = c
			}
		}
	}
	if same != nil && cross != nil && same.ReqPerS > 0 {
		cross.ThroughputRatio = cross.ReqPerS / same.ReqPerS
		cross.P50DiffUS = cross.P50US - same.P50US
	}
}

// Summaries compares cross-host with same-host at each in-flight count.
func (r *meshReport) Summaries() []meshSummary {
	var out []meshSummary
	for _, n := range r.Options.InFlight {
		var ratio, diff, rps, srps []float64
		cpu, scpu := map[string][]float64{}, map[string][]float64{}
		for _, c := range r.Cases {
			if c.InFlight != n {
				continue
			}
			switch {
			case c.Path == pathCrossHost && c.ThroughputRatio > 0:
				ratio, diff, rps = append(ratio, c.ThroughputRatio), append(diff, c.P50DiffUS), append(rps, c.ReqPerS)
				for k, v := range c.CPUUSPerReq {
					cpu[k] = append(cpu[k], v)
				}
			case c.Path == pathSameHost:
				srps = append(srps, c.ReqPerS)
				for k, v := range c.CPUUSPerReq {
					scpu[k] = append(scpu[k], v)
				}
			}
		}
		if len(ratio) == 0 {
			continue
		}
		out = append(out, meshSummary{Scenario: "mesh", Path: "summary", InFlight: n, Rounds: len(ratio),
			ThroughputRatio: median(ratio), P50DiffUS: median(diff), ReqPerS: median(rps), SameHostReqPerS: median(srps),
			CPUUSPerReq: medians(cpu), SameCPUUSPerReq: medians(scpu)})
	}
	return out
}

// Broken describes the invariants the cases broke together ("" when none).
func (r *meshReport) Broken() string {
	var b books
	for _, c := range r.Cases {
		b.Add(c.books)
	}
	return b.Broken()
}

// WriteText prints the cases and the summaries as tables.
func (r *meshReport) WriteText(w io.Writer) {
	o := r.Options
	fmt.Fprintf(w, "mesh: echo with a %d-byte payload from host a's socket, %v per case after %v warm-up; %d CPUs (%s)\n\n",
		len(echoPayload(o.PayloadBytes)), o.Duration, o.Warmup, runtime.NumCPU(), cpuModel())
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "path\tin flight\tround\treq/s\tp50 µs\tp99 µs\tCPU µs/req: bench\techo\tmanager a\tmanager b\tnats\tok\terrors\tlost\tdup\tothers' CPU %\t")
	for _, c := range r.Cases {
		dash := func(k string) string {
			if v, ok := c.CPUUSPerReq[k]; ok {
				return fmt.Sprintf("%.1f", v)
			}
			return "-"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%.0f\t%.0f\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%.0f\t\n",
			c.Path, c.InFlight, c.Round, c.ReqPerS, c.P50US, c.P99US, dash("bench"), dash("echo"), dash("manager"), dash("manager b"), dash("nats"),
			c.OK, c.ErrorCount(), c.Lost, c.Duplicates, c.OthersCPUPercent)
	}
	tw.Flush()
	fmt.Fprintln(w)
	for _, s := range r.Summaries() {
		fmt.Fprintf(w, "%d in flight, %d rounds: cross-host %.0f req/s = %.2f of same-host %.0f (goal ≥ %.2f → %s); p50 %+.0f µs (goal ≤ +%.0f → %s)\n",
			s.InFlight, s.Rounds, s.ReqPerS, s.ThroughputRatio, s.SameHostReqPerS, targetMeshRatio, met(s.ThroughputRatio >= targetMeshRatio),
			s.P50DiffUS, targetMeshP50Add, met(s.P50DiffUS <= targetMeshP50Add))
	}
	if b := r.Broken(); b != "" {
		fmt.Fprintf(w, "BROKEN: %s\n", b)
	} else {
		fmt.Fprintln(w, "books: 0 lost, 0 duplicate in every case")
	}
}

// WriteJSON writes one JSON line per case, then per summary.
func (r *meshReport) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	if err := encodeEach(enc, r.Cases); err != nil {
		return err
	}
	return encodeEach(enc, r.Summaries())
}
