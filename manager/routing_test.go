package manager_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/ipc"
)

type pong struct {
	Pong       bool  `json:"pong"`
	Cluster    int   `json:"cluster"`
	Generation int64 `json:"generation"`
	PID        int   `json:"pid"`
}

func pingOf(t *testing.T, f *ipc.Frame) pong {
	t.Helper()
	var p pong
	if err := json.Unmarshal(f.Payload, &p); err != nil {
		t.Fatalf("ping reply %s: %v", f.Payload, err)
	}
	return p
}

func TestRoutingEveryTargetKind(t *testing.T) {
	e := start(t, testConfig(t))
	e.WaitReady()
	c := e.client("t")
	// 8 shards, 2 per cluster. Guild 4194304 = 1<<22 → shard 1 → cluster 0;
	// guild 5<<22 → shard 5 → cluster 2.
	for _, tc := range []struct {
		target  string
		cluster int
	}{
		{"0", 0}, {"3", 3}, {"shard:0", 0}, {"shard:7", 3}, {"shard:4", 2},
		{"guild:4194304", 0}, {"guild:" + strconv.FormatUint(5<<22, 10), 2},
		{"guild:" + strconv.FormatUint(15<<22, 10), 3}, // 15 % 8 = 7
	} {
		r, err := request(t, c, "ping", tc.target, nil, 3*time.Second)
		if err != nil {
			t.Fatalf("ping %s: %v", tc.target, err)
		}
		if got := pingOf(t, r).Cluster; got != tc.cluster {
			t.Errorf("target %s answered by cluster %d, want %d", tc.target, got, tc.cluster)
		}
	}
	for _, target := range []string{"", "4", "-1", "x", "shard:8", "shard:-1", "guild:abc", "guild:"} {
		_, err := request(t, c, "ping", target, nil, 3*time.Second)
		if ipc.CodeOf(err) != ipc.CodeUnknownTarget {
			t.Errorf("target %q: got %v, want %s", target, err, ipc.CodeUnknownTarget)
		}
	}
}

func TestEchoPayloadByteForByte(t *testing.T) {
	e := start(t, testConfig(t))
	e.WaitReady()
	c := e.client("t")
	payload := []byte(`{"a": [1, 2,   3], "s":"h\u00e9llo \"q\"", "n":null}`)
	r, err := request(t, c, "echo", "1", payload, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(r.Payload, payload) {
		t.Fatalf("echo changed the payload:\n got %s\nwant %s", r.Payload, payload)
	}
}

// pingAll sends a ping to every cluster and decodes its one REPLY.
func pingAll(t *testing.T, e *env) ipc.Broadcast {
	t.Helper()
	r, err := request(t, e.client("t"), "ping", ipc.TargetAll, nil, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var all ipc.Broadcast
	if err := json.Unmarshal(r.Payload, &all); err != nil {
		t.Fatalf("%s: %v", r.Payload, err)
	}
	if len(all.Results) != 4 {
		t.Fatalf("got %d results, want 4: %s", len(all.Results), r.Payload)
	}
	return all
}

func TestBroadcast(t *testing.T) {
	e := start(t, testConfig(t))
	e.WaitReady()
	for i, res := range pingAll(t, e).Results {
		var p pong
		if res.Cluster != i || res.Error != nil || json.Unmarshal(res.Payload, &p) != nil || p.Cluster != i {
			t.Errorf("result %d = %+v", i, res)
		}
	}
}

func TestBroadcastWithOneClusterDown(t *testing.T) {
	cfg := testConfig(t)
	// Cluster 2 never becomes ready, so it is never routed.
	cfg.Cluster.Env = map[string]string{"SM_HARNESS_FLAGS_2": "--fail-ready"}
	e := start(t, cfg)
	testenv.WaitFor(t, 10*time.Second, "clusters 0, 1, 3 routed", func() bool {
		st := e.MustStatus()
		return st.Clusters[0].Routed && st.Clusters[1].Routed && st.Clusters[3].Routed
	})
	for i, res := range pingAll(t, e).Results {
		if i == 2 {
			if res.Error == nil || res.Error.Code != ipc.CodeUnavailable {
				t.Errorf("cluster 2: got %+v, want unavailable", res)
			}
			continue
		}
		if res.Error != nil || len(res.Payload) == 0 {
			t.Errorf("cluster %d: got %+v, want a payload", i, res)
		}
	}
}

// Two clients use the same request ids at the same time; each gets its own replies.
func TestIDCollisionsBetweenClients(t *testing.T) {
	e := start(t, testConfig(t))
	e.WaitReady()
	a, b := e.rawClient("a"), e.rawClient("b")
	const n = 200
	var wg sync.WaitGroup
	for _, rc := range []*rawConn{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range n {
				rc.send(fmt.Sprintf(`{"op":"echo","id":"%d","target":"%d","payload":{"from":%q,"i":%d}}`, i, i%4, rc.name, i))
			}
		}()
	}
	wg.Wait()
	for _, rc := range []*rawConn{a, b} {
		seen := map[string]bool{}
		for range n {
			f := rc.read(t, 5*time.Second)
			var p struct {
				From string `json:"from"`
				I    int    `json:"i"`
			}
			if err := json.Unmarshal(f.Payload, &p); err != nil {
				t.Fatalf("%s: %s: %v", rc.name, f.Payload, err)
			}
			if p.From != rc.name || strconv.Itoa(p.I) != f.ID {
				t.Fatalf("client %s got reply %s for id %s", rc.name, f.Payload, f.ID)
			}
			if seen[f.ID] {
				t.Fatalf("client %s got id %s twice", rc.name, f.ID)
			}
			seen[f.ID] = true
		}
	}
}

func TestRequestDeadline(t *testing.T) {
	cfg := testConfig(t)
	cfg.Cluster.Command = append(cfg.Cluster.Command, "--op-delay=2s")
	e := start(t, cfg)
	e.WaitReady()
	c := e.client("t")
	start := time.Now()
	r, err := c.Request(t.Context(), &ipc.Frame{Op: "ping", Target: "1", TimeoutMS: 200})
	if ipc.CodeOf(err) != ipc.CodeTimeout {
		t.Fatalf("got %v %v, want timeout", r, err)
	}
	if el := time.Since(start); el > 1500*time.Millisecond {
		t.Fatalf("timeout took %v", el)
	}
}

// A reply sent by a cluster just before it dies still reaches its sender; a
// request the dead process held fails at once with unavailable, not at the deadline.
func TestReplyThenClusterDies(t *testing.T) {
	cfg := testConfig(t)
	cfg.Cluster.Command = append(cfg.Cluster.Command, "--op-delay=300ms")
	e := start(t, cfg)
	st := e.WaitReady()
	c := e.client("t")
	r, err := request(t, c, "ping", "2", nil, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if pingOf(t, r).PID != st.Clusters[2].PID {
		t.Fatal("wrong pid")
	}
	errc := make(chan error, 1)
	go func() {
		_, err := request(t, c, "ping", "2", nil, 10*time.Second)
		errc <- err
	}()
	time.Sleep(100 * time.Millisecond)
	syscall.Kill(st.Clusters[2].PID, syscall.SIGKILL)
	select {
	case err := <-errc:
		if ipc.CodeOf(err) != ipc.CodeUnavailable {
			t.Fatalf("got %v, want unavailable", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("request to a dead cluster hung")
	}
}

// While a cluster restarts, its requests wait and are delivered once it is back.
func TestRequestsWaitForRestartingCluster(t *testing.T) {
	e := start(t, testConfig(t))
	st := e.WaitReady()
	c := e.client("t")
	old := st.Clusters[1].PID
	syscall.Kill(old, syscall.SIGKILL)
	testenv.WaitFor(t, 5*time.Second, "cluster 1 unrouted", func() bool { return !e.MustStatus().Clusters[1].Routed })
	r, err := request(t, c, "ping", "1", nil, 5*time.Second)
	if err != nil {
		t.Fatalf("request during restart: %v", err)
	}
	if p := pingOf(t, r); p.PID == old || p.Cluster != 1 {
		t.Fatalf("answered by %+v, want the new process of cluster 1", p)
	}
}

func TestWaitingQueueBound(t *testing.T) {
	cfg := testConfig(t)
	cfg.Limits.MaxWaiting = 2
	cfg.Cluster.Env = map[string]string{"SM_HARNESS_FLAGS_0": "--fail-ready"}
	e := start(t, cfg)
	testenv.WaitFor(t, 10*time.Second, "cluster 1 routed", func() bool { return e.MustStatus().Clusters[1].Routed })
	rc := e.rawClient("q")
	for i := range 3 {
		rc.send(fmt.Sprintf(`{"op":"ping","id":"w%d","target":"0","timeout_ms":400}`, i))
	}
	codes := map[string]string{}
	for range 3 {
		f := rc.read(t, 3*time.Second)
		if f.Error == nil {
			t.Fatalf("unexpected success %+v", f)
		}
		codes[f.ID] = f.Error.Code
	}
	if codes["w2"] != ipc.CodeBusy || codes["w0"] != ipc.CodeUnavailable || codes["w1"] != ipc.CodeUnavailable {
		t.Fatalf("codes = %v, want w0,w1 unavailable and w2 busy", codes)
	}
}
