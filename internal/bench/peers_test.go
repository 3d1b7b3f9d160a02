package bench

import (
	"encoding/json"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestPeerModeFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want peerMode
	}{
		{nil, peersAuto},
		{[]string{"--peers"}, peersOn},
		{[]string{"--peers=true"}, peersOn},
		{[]string{"--peers=false"}, peersOff},
		{[]string{"--peers=auto"}, peersAuto},
	} {
		var o routeOptions
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		addPeerFlags(fs, &o)
		if err := fs.Parse(tc.args); err != nil || o.Peers != tc.want {
			t.Errorf("%q: got %v, %v; want %v", tc.args, o.Peers.String(), err, tc.want.String())
		}
	}
	var m peerMode
	if err := m.Set("maybe"); err == nil {
		t.Error(`Set("maybe") accepted`)
	}
}

func TestReadPeerLines(t *testing.T) {
	self := os.Getpid()
	in := "(node:1) [CLUSTER_MANAGER] Warning: ...\n" +
		`{"mark":"open","api":"broadcastEval","pids":{"client":` + strconv.Itoa(self) + `}}` + "\n" +
		`{"mark":"close","api":"broadcastEval"}` + "\n" +
		`{"peer":"discord-hybrid-sharding","version":"3.0.1","api":"broadcastEval","in_flight":64,"req_s":12000.5,"p50_us":4000,"p99_us":9000,"payload_bytes":200,"window_s":5,"requests":60002,"sent":70000,"ok":70000,"errors":0,"bad_payload":0,"lost":0}` + "\n"
	lines, err := readPeerLines(strings.NewReader(in), 64, 200)
	if err != nil || len(lines) != 1 || lines[0].ReqS != 12000.5 || lines[0].API != "broadcastEval" {
		t.Fatalf("got %+v, %v", lines, err)
	}
	if m := lines[0].meter; m == nil || m.err != nil || m.before["client"].at.IsZero() || m.after["client"].at.IsZero() {
		t.Errorf("window not sampled: %+v", m)
	}
	if _, err := readPeerLines(strings.NewReader(in), 1, 200); err == nil {
		t.Error("a line at another in-flight count was accepted")
	}

	rep := &routeReport{Options: routeOptions{InFlight: []int{64}}}
	for i, api := range []string{"broadcastEval", "request", "broadcastEval", "request", "broadcastEval", "request"} {
		peer := []float64{10000, 8000}[i%2] + float64(i)
		rep.Peers = append(rep.Peers, peerCase{API: api, InFlight: 64, Round: i/2 + 1, ReqPerS: peer, RoutedReqPerS: 60000, Ratio: 60000 / peer})
	}
	s := rep.PeerSummaries()
	if len(s) != 2 || !s[0].Fastest || s[1].Fastest || s[0].Rounds != 3 || s[0].PeerReqPerS != 10002 {
		t.Fatalf("summaries %+v", s)
	}
}

// TestPeerComparison runs the route scenario with the peer harness and the
// Node case, briefly. It needs node and an installed internal/bench/peers (npm
// ci there); without them it is skipped, so that go test never depends on npm
// or the network.
func TestPeerComparison(t *testing.T) {
	if _, err := exec.LookPath("node"); err != nil {
		t.Skip("node is not on $PATH")
	}
	if _, err := os.Stat(filepath.Join("peers", "node_modules", peerName)); err != nil {
		t.Skip("internal/bench/peers/node_modules is missing (npm ci in internal/bench/peers)")
	}
	out := runScenario(t, 2*time.Minute, "route",
		"--inflight=4", "--duration=300ms", "--warmup=100ms", "--drain=2s", "--peers", "--node")
	text := out.String()
	var cases, summaries int
	for _, line := range jsonLines(t, strings.NewReader(text)) {
		var c struct {
			peerCase
			Fastest    bool `json:"fastest"`
			NodeRounds int  `json:"node_rounds"`
		}
		if json.Unmarshal([]byte(line), &c) != nil {
			continue
		}
		switch c.Path {
		case "peer":
			cases++
			if c.Version == "" || c.InFlight != 4 || c.PayloadBytes != 200 || c.OK == 0 || c.ReqPerS <= 0 || c.Ratio <= 0 ||
				c.Errors+c.BadPayload+c.Lost > 0 || c.Mode != "process" || c.TotalShards != 2 || c.Clusters != 2 ||
				c.CPUUSPerReq["manager"] <= 0 || c.CPUUSPerReq["client"] <= 0 || c.CPUUSPerReq["target"] <= 0 ||
				c.NodeRatio <= 0 || c.NodeCPUUSPerReq["node"] <= 0 {
				t.Errorf("peer case: %s", line)
			}
		case "peer_summary":
			summaries++
			if c.NodeRounds != 1 || c.NodeRatio <= 0 {
				t.Errorf("peer summary without the Node case: %s", line)
			}
		}
	}
	if cases != len(peerAPIs) || summaries != len(peerAPIs) {
		t.Fatalf("%d peer cases and %d summaries, want %d each", cases, summaries, len(peerAPIs))
	}
	if !strings.Contains(text, "sm routed / discord-hybrid-sharding") || !strings.Contains(text, "sm routed to the Node cluster / discord-hybrid-sharding") {
		t.Error("no comparison in the text output")
	}
}
