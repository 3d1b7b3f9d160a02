package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestRouteScenario runs the whole route scenario, briefly, against freshly
// built binaries: it must finish with exact books and non-zero figures.
func TestRouteScenario(t *testing.T) {
	out := runScenario(t, 2*time.Minute, "route",
		"--duration=300ms", "--warmup=100ms", "--clusters=3", "--idle-sample=200ms",
		"--peers=false", // TestPeerComparison runs them
	)
	var cases, summaries, idle int
	for _, line := range jsonLines(t, out) {
		var c struct {
			routeCase
			Clusters      int     `json:"clusters"`
			ManagerCPUPct float64 `json:"manager_cpu_percent"`
		}
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			t.Fatalf("JSON line %s: %v", line, err)
		}
		switch c.Path {
		case pathDirect, pathRouted:
			cases++
			if why := c.Broken(); why != "" {
				t.Errorf("%s %d: %s", c.Path, c.InFlight, why)
			}
			if c.OK == 0 || c.ReqPerS <= 0 || c.P50US <= 0 || c.P99US < c.P50US {
				t.Errorf("%s %d: empty figures: %s", c.Path, c.InFlight, line)
			}
			if c.Path == pathRouted && (c.ThroughputRatio <= 0 || c.ManagerRSSKiB <= 0) {
				t.Errorf("routed %d: no ratio or manager RSS: %s", c.InFlight, line)
			}
		case "summary":
			summaries++
		case "idle":
			idle++
			if c.Clusters != 3 || c.ManagerRSSKiB <= 0 {
				t.Errorf("idle: %s", line)
			}
		default:
			t.Errorf("unexpected line %s", line)
		}
	}
	if cases != 4 || summaries != 2 || idle != 1 {
		t.Fatalf("got %d cases, %d summaries, %d idle lines; want 4, 2, 1", cases, summaries, idle)
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
