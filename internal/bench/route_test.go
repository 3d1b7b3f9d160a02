package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestRouteScenario runs the whole route scenario, briefly, against freshly
// built binaries: it must finish with exact books and non-zero figures.
func TestRouteScenario(t *testing.T) {
	out := runScenario(t, 2*time.Minute, "route",
		"--duration=300ms", "--warmup=100ms", "--clusters=3", "--idle-sample=200ms", "--rest=200ms", "--inflight=64,1",
		"--peers=false", // TestPeerComparison runs them
	)
	var cases, summaries, idle, rest int
	var order []string
	for _, line := range jsonLines(t, out) {
		var c struct {
			routeCase
			Routed        string  `json:"routed"`
			Clusters      int     `json:"clusters"`
			ManagerCPUPct float64 `json:"manager_cpu_percent"`
		}
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			t.Fatalf("JSON line %s: %v", line, err)
		}
		switch c.Path {
		case pathDirect, pathRouted, pathEchoDirect, pathEchoRouted:
			cases++
			if c.InFlight == 1 {
				order = append(order, c.Path)
			}
			if why := c.Broken(); why != "" {
				t.Errorf("%s %d: %s", c.Path, c.InFlight, why)
			}
			if c.OK == 0 || c.ReqPerS <= 0 || c.P50US <= 0 || c.P99US < c.P50US {
				t.Errorf("%s %d: empty figures: %s", c.Path, c.InFlight, line)
			}
			routed := c.Path == pathRouted || c.Path == pathEchoRouted
			if routed && (c.ThroughputRatio <= 0 || c.ManagerRSSKiB <= 0 || c.CPUUSPerReq["manager"] <= 0) {
				t.Errorf("%s %d: no ratio, manager RSS or CPU: %s", c.Path, c.InFlight, line)
			}
			// CPU is read in the kernel's 10 ms ticks: a short window on a
			// loaded machine can hold none of a light process's, so only a
			// window long enough to hold several must show some.
			if cluster := map[bool]string{true: "echo", false: "harness"}[strings.HasPrefix(c.Path, "echo")]; (c.CPUUSPerReq[cluster] <= 0 || c.CPUUSPerReq["bench"] <= 0) && c.WindowS >= 1 {
				t.Errorf("%s %d: no CPU for the bench or the %s over %.2f s: %s", c.Path, c.InFlight, cluster, c.WindowS, line)
			}
		case pathRest:
			rest++
			if c.RestAt != map[int]string{1: "start", 2: "end"}[rest] || c.CPUPercent["manager"] < 0 || c.WindowS <= 0 {
				t.Errorf("rest reading %d: %s", rest, line)
			}
		case "summary":
			summaries++
			if c.Routed != pathRouted && c.Routed != pathEchoRouted {
				t.Errorf("summary of %q: %s", c.Routed, line)
			}
		case "idle":
			idle++
			if c.Clusters != 3 || c.ManagerRSSKiB <= 0 {
				t.Errorf("idle: %s", line)
			}
		default:
			t.Errorf("unexpected line %s", line)
		}
	}
	if cases != 8 || summaries != 4 || idle != 1 || rest != 2 {
		t.Fatalf("got %d cases, %d summaries, %d idle lines, %d rest readings; want 8, 4, 1, 2", cases, summaries, idle, rest)
	}
	if want := []string{pathDirect, pathRouted, pathEchoDirect, pathEchoRouted}; !slices.Equal(order, want) {
		t.Errorf("cases at 1 in flight ran in the order %v, want %v", order, want)
	}
}

func TestEchoPayload(t *testing.T) {
	for _, n := range []int{12, 13, 200, 4096} {
		p := echoPayload(n)
		if len(p) != n || !json.Valid(p) {
			t.Errorf("echoPayload(%d) = %d bytes %q", n, len(p), p)
		}
	}
}

func TestIntList(t *testing.T) {
	var l intList
	if err := l.Set("1, 64,256"); err != nil || l.String() != "1,64,256" {
		t.Fatalf("Set: %v, %v", l, err)
	}
	for _, bad := range []string{"", "0", "x", "1,,2", "-3"} {
		if err := l.Set(bad); err == nil {
			t.Errorf("Set(%q) accepted", bad)
		}
	}
}

func TestMainUsage(t *testing.T) {
	var out, errw bytes.Buffer
	if err := Main(context.Background(), []string{"nope"}, &out, &errw); err == nil || !strings.Contains(errw.String(), "route") {
		t.Fatalf("unknown scenario: err %v, usage %q", err, &errw)
	}
	if err := Main(context.Background(), []string{"route", "-h"}, &out, &errw); err != nil {
		t.Fatalf("route -h: %v", err)
	}
}
