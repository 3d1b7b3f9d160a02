package bench

import (
	"bufio"
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
	if testing.Short() {
		t.Skip("starts real processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, progress bytes.Buffer
	err := Main(ctx, []string{"route",
		"--manager-bin", bin("sm-manager"), "--harness-bin", bin("cluster-harness"),
		"--duration=300ms", "--warmup=100ms", "--clusters=3", "--idle-sample=200ms",
		"--peers=false", // TestPeerComparison runs them
	}, &out, &progress)
	t.Logf("progress:\n%s\noutput:\n%s", &progress, &out)
	if err != nil {
		t.Fatal(err)
	}

	var cases, summaries, idle int
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var c struct {
			RouteCase
			Clusters      int     `json:"clusters"`
			ManagerCPUPct float64 `json:"manager_cpu_percent"`
		}
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			t.Fatalf("JSON line %s: %v", line, err)
		}
		switch c.Path {
		case PathDirect, PathRouted:
			cases++
			if why := c.Broken(); why != "" {
				t.Errorf("%s %d: %s", c.Path, c.InFlight, why)
			}
			if c.OK == 0 || c.ReqPerS <= 0 || c.P50US <= 0 || c.P99US < c.P50US {
				t.Errorf("%s %d: empty figures: %s", c.Path, c.InFlight, line)
			}
			if c.Path == PathRouted && (c.ThroughputRatio <= 0 || c.ManagerRSSKiB <= 0) {
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
