package bench

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/internal/testenv"
)

// TestMeshScenario runs the mesh scenario briefly against freshly built
// binaries and a real nats-server: both paths at both in-flight counts, in
// alternating order, with exact books, non-zero figures, a CPU reading of
// every process, and a summary per in-flight count.
func TestMeshScenario(t *testing.T) {
	out := runScenario(t, 3*time.Minute, "mesh", "--nats-server-bin", testenv.Bin("nats-server"),
		"--duration=300ms", "--warmup=100ms", "--inflight=64,1", "--rounds=2")
	var cases, summaries int
	var first []string
	for _, line := range jsonLines(t, out) {
		var c struct {
			routeCase
			SameHostReqPerS float64 `json:"same_host_req_per_s"`
		}
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			t.Fatalf("JSON line %s: %v", line, err)
		}
		switch c.Path {
		case pathSameHost, pathCrossHost:
			cases++
			if c.InFlight == 64 && len(first) < 4 {
				first = append(first, c.Path)
			}
			if why := c.Broken(); why != "" || c.ErrorCount() != 0 {
				t.Errorf("%s %d: %s (%d errors)", c.Path, c.InFlight, why, c.ErrorCount())
			}
			if c.OK == 0 || c.ReqPerS <= 0 || c.P50US <= 0 {
				t.Errorf("%s %d: empty figures: %s", c.Path, c.InFlight, line)
			}
			if c.Path == pathCrossHost && c.ThroughputRatio <= 0 {
				t.Errorf("cross-host %d: no ratio: %s", c.InFlight, line)
			}
			// Every process of the path is metered. CPU is read in the
			// kernel's 10 ms ticks, so a 0.3 s window on a loaded machine
			// may hold none of a light process's: only its presence is
			// checked (TestRouteScenario says the same of its windows).
			procs := []string{"bench", "echo", "manager"}
			if c.Path == pathCrossHost {
				procs = append(procs, "manager b", "nats")
			}
			for _, k := range procs {
				if v, ok := c.CPUUSPerReq[k]; !ok || v < 0 {
					t.Errorf("%s %d: no CPU reading of %s: %s", c.Path, c.InFlight, k, line)
				}
			}
		case "summary":
			summaries++
			if c.ThroughputRatio <= 0 || c.SameHostReqPerS <= 0 {
				t.Errorf("summary: %s", line)
			}
		default:
			t.Errorf("unexpected line %s", line)
		}
	}
	if cases != 8 || summaries != 2 {
		t.Fatalf("%d cases and %d summaries, want 8 and 2", cases, summaries)
	}
	if want := []string{pathSameHost, pathCrossHost, pathCrossHost, pathSameHost}; !slices.Equal(first, want) {
		t.Errorf("order of the rounds at 64 in flight %v, want %v (alternating)", first, want)
	}
}
