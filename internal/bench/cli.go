package bench

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// errInvariant is returned (wrapped) by Main when a scenario ran to its end but
// broke an invariant: a lost request, a duplicate reply, an error reply.
var errInvariant = errors.New("invariant broken")

// scenario is one sm-bench subcommand. Each parses its own flags, so a new
// one (deploy, chaos, scale, ...) is one more entry and one more file.
type scenario struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

var scenarios = []scenario{
	{"route", "the same echo load straight to a cluster-harness and through sm-manager, and the ratio", runRouteCmd},
	{"feed", "many subscribers on the status WebSocket while clusters heartbeat: latency, manager CPU and RSS", runFeedCmd},
	{"mesh", "cross-host routed echo (client → host a → NATS → host b → cluster) against same-host routed echo in one run, two managers and a nats-server", runMeshCmd},
	{"api", "sm-api req/s for a guild lookup and a forwarded op, against the raw socket route", runAPICmd},
	{"deploy", "rolling deploys of every cluster back to back under load: wall time, manager overhead per swap, unrouted intervals", runDeployCmd},
	{"chaos", "kill -9, SIGSTOP, a crash loop and a client that stops reading, under load: every error inside a down window", runChaosCmd},
	{"manager-kill", "SIGKILL sm-manager under load and restart it: re-adoption time, restarts, failed requests", runManagerKillCmd},
	{"scale", "512 clusters of 8 shards: start time, the manager's RSS and CPU at steady heartbeat, a full deploy", runScaleCmd},
	{"soak", "a bounded run under load with cluster kills and deploys: the manager's goroutines, fds and RSS must not grow", runSoakCmd},
	{echoClusterName, "(not a scenario) the minimal echo cluster process route measures beside cluster-harness; started by route with the SM_* environment", runEchoClusterCmd},
}

// Main runs the scenario args[0] with the flags that follow. Reports go to
// stdout (a table, then one JSON object per line); progress and usage to
// stderr. A broken invariant is an error wrapping errInvariant.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	usage := func() {
		fmt.Fprintln(stderr, "usage: sm-bench SCENARIO [flags]   (sm-bench SCENARIO -h for its flags)")
		fmt.Fprintln(stderr, "\nscenarios:")
		for _, s := range scenarios {
			fmt.Fprintf(stderr, "  %-13s %s\n", s.name, s.summary)
		}
	}
	if len(args) == 0 || args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help" {
		usage()
		if len(args) == 0 {
			return errors.New("no scenario given")
		}
		return nil
	}
	for _, s := range scenarios {
		if s.name == args[0] {
			err := s.run(ctx, args[1:], stdout, stderr)
			if errors.Is(err, flag.ErrHelp) {
				return nil
			}
			return err
		}
	}
	usage()
	return fmt.Errorf("unknown scenario %q", args[0])
}

func runRouteCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o := defaultRouteOptions
	fs := newScenarioFlags("route", stderr, &o.ManagerBin, &o.HarnessBin)
	fs.Var((*intList)(&o.InFlight), "inflight", "comma-separated in-flight counts, one case each")
	fs.IntVar(&o.Rounds, "rounds", o.Rounds, "rounds of every case per in-flight count, in reversed order every other round; the summary takes the median (a shared machine is noisy)")
	fs.IntVar(&o.PayloadBytes, "payload", o.PayloadBytes, "echo payload size in bytes")
	fs.DurationVar(&o.Warmup, "warmup", o.Warmup, "load before each measured window")
	fs.DurationVar(&o.Duration, "duration", o.Duration, "measured window of each case")
	fs.DurationVar(&o.Drain, "drain", o.Drain, "wait for the last replies before counting them lost")
	fs.Var((*intList)(&o.Clusters), "clusters", "comma-separated cluster counts for the idle measurement, e.g. 16,256 (default: skip it)")
	fs.DurationVar(&o.IdleSample, "idle-sample", o.IdleSample, "how long the idle manager is sampled")
	fs.StringVar(&o.ManagerCPUProfile, "manager-cpuprofile", "", "write a CPU profile of the routed path's sm-manager to this file")
	fs.BoolVar(&o.Echo, "echo", o.Echo, "also measure the minimal echo cluster (sm-bench echo-cluster), direct and routed")
	fs.DurationVar(&o.Rest, "rest", o.Rest, "read the machine this long at the start and the end with every process idle (0: skip)")
	addPeerFlags(fs.FlagSet, &o)
	addNodeFlags(fs.FlagSet, &o)
	var err error
	if o.Progress, err = fs.parse(args); err != nil {
		return err
	}
	rep, err := runRoute(ctx, o)
	return finishReport("route", stdout, rep, rep != nil && len(rep.Cases) > 0, err)
}

// scenarioFlags is a scenario command's flag set, with the flags every
// scenario takes: the binaries it runs (--manager-bin, --harness-bin, and
// any added with binary) and -q.
type scenarioFlags struct {
	*flag.FlagSet
	name     string
	stderr   io.Writer
	quiet    *bool
	binaries []binaryFlag
}

// binaryFlag is a binary a scenario runs: the flag's value, and the binary's
// name to look for when it is not given.
type binaryFlag struct {
	value *string
	name  string
}

// newScenarioFlags returns the flag set of scenario name, usage and errors to
// stderr, with the sm-manager and cluster-harness binaries into managerBin
// and harnessBin.
func newScenarioFlags(name string, stderr io.Writer, managerBin, harnessBin *string) *scenarioFlags {
	fs := &scenarioFlags{FlagSet: flag.NewFlagSet("sm-bench "+name, flag.ContinueOnError), name: name, stderr: stderr}
	fs.SetOutput(stderr)
	fs.binary(managerBin, "sm-manager")
	fs.binary(harnessBin, "cluster-harness")
	fs.quiet = fs.Bool("q", false, "no progress lines on stderr")
	return fs
}

// binary adds the flag of binary name (--api-bin for sm-api) into v.
func (fs *scenarioFlags) binary(v *string, name string) {
	fs.StringVar(v, binaryFlagName(name), "", name+" binary (default: the one beside sm-bench, else $PATH)")
	fs.binaries = append(fs.binaries, binaryFlag{value: v, name: name})
}

// parse parses args (no arguments beside the flags) and resolves every
// binary (see findBinary). It returns where progress lines go: stderr, or
// nil with -q.
func (fs *scenarioFlags) parse(args []string) (io.Writer, error) {
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("%s: unexpected argument %q", fs.name, fs.Arg(0))
	}
	for _, b := range fs.binaries {
		var err error
		if *b.value, err = findBinary(*b.value, b.name); err != nil {
			return nil, err
		}
	}
	if *fs.quiet {
		return nil, nil
	}
	return fs.stderr, nil
}

// binaryFlagName is the flag that names binary name: manager-bin for
// sm-manager, harness-bin for cluster-harness.
func binaryFlagName(name string) string {
	return strings.TrimPrefix(strings.TrimPrefix(name, "sm-"), "cluster-") + "-bin"
}

// findBinary returns flagValue if set, else name beside the running
// executable, else name on $PATH.
func findBinary(flagValue, name string) (string, error) {
	if flagValue != "" {
		return filepath.Abs(flagValue)
	}
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("%s not found beside sm-bench or on $PATH (build with `go build -o bin/ ./cmd/...`, or pass --%s): %w",
			name, binaryFlagName(name), err)
	}
	return filepath.Abs(p)
}

// intList is a flag holding comma-separated positive integers.
type intList []int

func (l *intList) String() string {
	if l == nil {
		return ""
	}
	s := make([]string, len(*l))
	for i, v := range *l {
		s[i] = strconv.Itoa(v)
	}
	return strings.Join(s, ",")
}

func (l *intList) Set(v string) error {
	var out []int
	for f := range strings.SplitSeq(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	*l = out
	return nil
}

// scenarioReport is what a scenario's report offers its command: a table for
// people, JSON lines, and the invariants the run broke ("" when none).
type scenarioReport interface {
	WriteText(w io.Writer)
	WriteJSON(w io.Writer) error
	Broken() string
}

// finishReport prints rep (if the scenario got far enough to have figures),
// then turns the run's error or a broken invariant into the command's error.
func finishReport(name string, stdout io.Writer, rep scenarioReport, hasFigures bool, err error) error {
	if hasFigures {
		rep.WriteText(stdout)
		fmt.Fprintln(stdout)
		if jerr := rep.WriteJSON(stdout); err == nil {
			err = jerr
		}
	}
	if err != nil {
		return err
	}
	if why := rep.Broken(); why != "" {
		return fmt.Errorf("%s: %w: %s", name, errInvariant, why)
	}
	return nil
}

// encodeEach writes each of vs as one JSON line.
func encodeEach[T any](enc *json.Encoder, vs []T) error {
	for _, v := range vs {
		if err := enc.Encode(v); err != nil {
			return err
		}
	}
	return nil
}
