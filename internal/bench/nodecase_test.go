package bench

import (
	"encoding/json"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestRoundOrder(t *testing.T) {
	paths := []string{pathDirect, pathRouted, pathNode, pathPeer}
	if got := roundOrder(paths, 1); !slices.Equal(got, paths) {
		t.Errorf("round 1: %v", got)
	}
	if got, want := roundOrder(paths, 2), []string{pathPeer, pathNode, pathRouted, pathDirect}; !slices.Equal(got, want) {
		t.Errorf("round 2: %v, want %v", got, want)
	}
	if got := roundOrder(paths, 3); !slices.Equal(got, paths) {
		t.Errorf("round 3: %v", got)
	}
	if paths[0] != pathDirect {
		t.Error("roundOrder changed its argument")
	}
}

// TestCompareRound checks that a round's ratios come out right whatever order
// its cases ran in: each peer case against the routed and the Node case of its
// own round and in-flight count.
func TestCompareRound(t *testing.T) {
	rep := &routeReport{Options: routeOptions{InFlight: []int{64}}}
	for round := 1; round <= 2; round++ {
		k := float64(round)
		for _, c := range roundOrder([]string{pathDirect, pathRouted, pathNode}, round) {
			rps := map[string]float64{pathDirect: 300000, pathRouted: 150000, pathNode: 90000}[c] * k
			rep.Cases = append(rep.Cases, routeCase{Path: c, InFlight: 64, Round: round, ReqPerS: rps, P50US: 100 * k,
				CPUUSPerReq: map[string]float64{"bench": 2, "manager": 3, c: 1}})
		}
		rep.Peers = append(rep.Peers, peerCase{API: "broadcastEval", InFlight: 64, Round: round, ReqPerS: 30000 * k,
			CPUUSPerReq: map[string]float64{"client": 10, "manager": 14, "target": 7}})
		rep.compareRound(64, round)
	}
	for _, c := range rep.Cases {
		if c.Path == pathRouted && c.ThroughputRatio != 0.5 {
			t.Errorf("round %d: routed/direct %v, want 0.5", c.Round, c.ThroughputRatio)
		}
	}
	for _, p := range rep.Peers {
		if p.Ratio != 5 || p.NodeRatio != 3 || p.NodeReqPerS != 90000*float64(p.Round) || p.NodeCPUUSPerReq["manager"] != 3 {
			t.Errorf("round %d: peer case %+v", p.Round, p)
		}
	}
	s := rep.PeerSummaries()
	if len(s) != 1 || s[0].NodeRounds != 2 || s[0].NodeRatio != 3 || s[0].NodeManagerCPUUSPerReq != 3 || s[0].NodeTotalCPUUSPerReq != 6 {
		t.Fatalf("peer summaries %+v", s)
	}
	ns := rep.NodeSummaries()
	if len(ns) != 1 || ns[0].Rounds != 2 || ns[0].ReqPerS != 135000 || ns[0].CPUUSPerReq["node"] != 1 || ns[0].TotalCPUUSPerReq != 6 {
		t.Fatalf("node summaries %+v", ns)
	}
}

// TestNodeCase runs the route scenario with the Node cluster, briefly, over
// two rounds: the Node cases must have exact books, the three processes'
// CPU, and run in the alternating order. It needs node, not npm: the cluster
// imports clients/node from this checkout.
func TestNodeCase(t *testing.T) {
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node is not on $PATH")
	}
	if _, err := nodeCommand(routeOptions{NodeScript: "no/such/cluster.mjs"}); err == nil {
		t.Error("a missing --node-script was accepted")
	}
	out := runScenario(t, 2*time.Minute, "route",
		"--inflight=4", "--rounds=2", "--duration=300ms", "--warmup=100ms", "--drain=2s", "--node", "--peers=false", "--echo=false", "--rest=0")
	text := out.String()
	var order []string
	var summaries int
	for _, line := range jsonLines(t, strings.NewReader(text)) {
		var c struct {
			routeCase
			Rounds int `json:"rounds"`
		}
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			t.Fatalf("JSON line %s: %v", line, err)
		}
		switch c.Path {
		case pathDirect, pathRouted, pathNode:
			order = append(order, c.Path)
			if why := c.Broken(); why != "" {
				t.Errorf("%s round %d: %s", c.Path, c.Round, why)
			}
			if c.OK == 0 || c.ReqPerS <= 0 || c.P50US <= 0 {
				t.Errorf("%s round %d: empty figures: %s", c.Path, c.Round, line)
			}
			if c.Path == pathRouted && c.ThroughputRatio <= 0 {
				t.Errorf("routed round %d: no ratio: %s", c.Round, line)
			}
			if c.Path == pathNode {
				for _, k := range []string{"bench", "manager", "node"} {
					if c.CPUUSPerReq[k] <= 0 {
						t.Errorf("node round %d: no CPU for %s: %s", c.Round, k, line)
					}
				}
				if c.ManagerRSSKiB <= 0 {
					t.Errorf("node round %d: no manager RSS: %s", c.Round, line)
				}
			}
		case "node_summary":
			summaries++
			if c.Rounds != 2 {
				t.Errorf("node summary: %s", line)
			}
		}
	}
	want := []string{pathDirect, pathRouted, pathNode, pathNode, pathRouted, pathDirect}
	if !slices.Equal(order, want) {
		t.Errorf("cases ran in the order %v, want %v", order, want)
	}
	if summaries != 1 || !strings.Contains(text, "routed to the Node cluster (@sm-supervisor/client) at 4 in flight") {
		t.Errorf("%d node summaries, or none in the text", summaries)
	}
}
