package main_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sm-supervisor/sm/internal/natstest"
	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/ipc"
)

// clusterLoad keeps echo requests flowing to some clusters over one client
// connection and books every outcome: exactly one good REPLY per request.
type clusterLoad struct {
	sent, ok, dup atomic.Int64
	mu            sync.Mutex
	errs          map[string]int
	stop          chan struct{}
	wg            sync.WaitGroup
}

// startClusterLoad runs workers sending echoes round-robin over clusters
// through the socket sock, one request in flight each, until end.
func startClusterLoad(t *testing.T, sock string, clusters []int, workers int) *clusterLoad {
	t.Helper()
	l := &clusterLoad{errs: map[string]int{}, stop: make(chan struct{})}
	c, err := ipc.Dial(t.Context(), ipc.ClientConfig{
		Path: sock, Register: ipc.Frame{Role: ipc.RoleClient, Name: "load"},
		Handler: func(_ *ipc.Client, f *ipc.Frame) {
			if f.Op == ipc.OpReply {
				l.dup.Add(1) // a REPLY no request waits for
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	for w := range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				payload := fmt.Appendf(nil, `{"w":%d,"i":%d}`, w, i)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				l.sent.Add(1)
				r, err := c.Request(ctx, &ipc.Frame{Op: "echo", Target: strconv.Itoa(clusters[(w+i)%len(clusters)]), Payload: payload})
				cancel()
				switch {
				case err != nil:
					l.mu.Lock()
					l.errs[ipc.CodeOf(err)]++
					l.mu.Unlock()
				case string(r.Payload) != string(payload):
					l.mu.Lock()
					l.errs["bad_echo"]++
					l.mu.Unlock()
				default:
					l.ok.Add(1)
				}
			}
		}()
	}
	t.Cleanup(func() { c.Close() })
	return l
}

// end stops the load and fails the test unless every request got exactly
// one good REPLY.
func (l *clusterLoad) end(t *testing.T, what string) {
	t.Helper()
	close(l.stop)
	l.wg.Wait()
	time.Sleep(50 * time.Millisecond) // a duplicate would arrive by now
	t.Logf("%s: sent %d, ok %d, errors %v, duplicates %d", what, l.sent.Load(), l.ok.Load(), l.errs, l.dup.Load())
	if l.ok.Load() == 0 || l.ok.Load() != l.sent.Load() || len(l.errs) > 0 || l.dup.Load() > 0 {
		t.Fatalf("%s: the books do not balance", what)
	}
}

// TestMeshSurvivesNATSNodeLoss: two managers share twelve clusters through a
// 3-node JetStream cluster, their buckets kept by all three (mesh.replicas =
// 3). SIGKILL the node leading the leases bucket, under request load: its
// followers elect a new leader (NATS's raft: 4 to 9 s), the managers fail
// over to the other nodes, and nothing happens to the bot: no cluster is
// fenced or moved, every request gets its one REPLY. The lease is 20 s, the
// shortest that outlasts a leader election (docs/multihost.md).
func TestMeshSurvivesNATSNodeLoss(t *testing.T) {
	servers := natstest.StartCluster(t, 3, natstest.Options{Bin: testenv.Bin("nats-server")})
	url := natstest.URLs(servers)
	const extra = "lease = \"20s\"\nreplicas = 3\n"
	hosts := []*meshHost{startMeshHostWith(t, url, "a", 6, extra), startMeshHostWith(t, url, "b", 6, extra)}
	for _, h := range hosts {
		h.dial(t)
	}
	by := placed(t, hosts, 60*time.Second, "12 clusters placed on two hosts")
	pids := map[int]int{}
	for _, h := range hosts {
		for _, cs := range h.status(t).Clusters {
			if cs.HostID == h.id {
				pids[cs.ID] = cs.PID
			}
		}
	}

	js := jetStream(t, servers[0].URL)
	info := func(stream string) *jetstream.StreamInfo {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		s, err := js.Stream(ctx, stream)
		if err != nil {
			return nil
		}
		i, err := s.Info(ctx)
		if err != nil {
			return nil
		}
		return i
	}
	st := info("KV_sm_leases")
	if st == nil || st.Config.Replicas != 3 || st.Cluster == nil || st.Cluster.Leader == "" {
		t.Fatalf("the leases bucket is not kept by three servers: %+v", st)
	}
	leader := st.Cluster.Leader
	victim, _ := strconv.Atoi(strings.TrimPrefix(leader, "n"))
	if victim < 1 || victim > 3 {
		t.Fatalf("leader %q is none of n1..n3", leader)
	}
	survivor := servers[victim%3] // another node, for watching the election
	js = jetStream(t, survivor.URL)

	var loads []*clusterLoad
	for _, h := range hosts {
		loads = append(loads, startClusterLoad(t, h.sock, by[h.id], 4))
	}
	time.Sleep(500 * time.Millisecond)
	servers[victim-1].Kill()
	killed := time.Now()
	testenv.WaitFor(t, 30*time.Second, "a new leader of the leases bucket", func() bool {
		i := info("KV_sm_leases")
		return i != nil && i.Cluster != nil && i.Cluster.Leader != "" && i.Cluster.Leader != leader
	})
	elected := time.Since(killed)
	// Two renewals (every 5 s) after the election: every host's record fresh again.
	time.Sleep(10 * time.Second)
	for _, h := range hosts {
		for _, hs := range h.status(t).Hosts {
			if hs.LeaseAgeMS > 10_000 {
				t.Errorf("host %s sees %s's record %d ms old: renewals stopped", h.id, hs.ID, hs.LeaseAgeMS)
			}
		}
	}
	for i, l := range loads {
		l.end(t, "load on host "+hosts[i].id)
	}
	for _, h := range hosts {
		for _, cs := range h.status(t).Clusters {
			if want, ok := pids[cs.ID]; ok && cs.HostID == h.id && (cs.PID != want || cs.State != "ready") {
				t.Errorf("cluster %d on %s: pid %d (was %d), %s: the node's loss reached the bot", cs.ID, h.id, cs.PID, want, cs.State)
			}
		}
		if out := h.out.String(); strings.Contains(out, "lease not renewed in time") {
			t.Errorf("host %s fenced a cluster:\n%s", h.id, out)
		}
	}
	t.Logf("leases leader %s killed: a new one elected after %v; no cluster fenced or moved", leader, elected.Round(time.Millisecond))

	// The node comes back and catches up; still nothing moves.
	servers[victim-1].Restart()
	natstest.WaitJetStream(t, servers[victim-1].URL, 30*time.Second)
	if now := placed(t, hosts, 10*time.Second, "12 clusters still placed"); fmt.Sprint(now) != fmt.Sprint(by) {
		t.Fatalf("placement moved after the node came back: %v, was %v", now, by)
	}
}
