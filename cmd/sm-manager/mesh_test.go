package main_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sm-supervisor/sm/internal/natstest"
	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/ipc"
	"github.com/sm-supervisor/sm/manager"
)

// The mesh tests run real sm-manager processes joined through a real
// nats-server, with a 2 s lease: renewals every 500 ms, the fence at 1.5 s.

// meshHost is one sm-manager process of a mesh.
type meshHost struct {
	id, sock string
	cmd      *exec.Cmd
	out      *testenv.Buffer
	done     chan struct{}
	client   *ipc.Client
}

// meshConfig writes the config of host id: 12 clusters of the simulated bot.
func meshConfig(t *testing.T, url, id string, maxClusters int, extra string) (path, sock string) {
	t.Helper()
	dir := t.TempDir()
	sock = filepath.Join(dir, "sm.sock")
	lease := "lease = \"2s\"\n" // unless extra sets its own
	if strings.Contains(extra, "lease =") {
		lease = ""
	}
	doc := fmt.Sprintf(`socket = %q
[topology]
total_shards = 24
shards_per_cluster = 2
[cluster]
command = [%q, "--simulate", "--connect-delay=1ms", "--event-interval=0"]
[heartbeat]
interval = "50ms"
timeout = "1s"
[restart]
stop_grace = "500ms"
[shutdown]
timeout = "3s"
[status]
listen = ""
[admin]
listen = ""
[discord]
identify_spacing = "1ms"
[mesh]
nats_url = %q
host_id = %q
max_clusters = %d
%s%s`, sock, testenv.Bin("cluster-harness"), url, id, maxClusters, lease, extra)
	path = filepath.Join(dir, "sm.toml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path, sock
}

// startMeshHost starts sm-manager for host id; the test's cleanup stops it
// (SIGTERM, then SIGKILL) unless the test killed it.
func startMeshHost(t *testing.T, url, id string, maxClusters int) *meshHost {
	t.Helper()
	return startMeshHostWith(t, url, id, maxClusters, "")
}

// startMeshHostWith is startMeshHost with extra [mesh] keys.
func startMeshHostWith(t *testing.T, url, id string, maxClusters int, extra string) *meshHost {
	t.Helper()
	path, sock := meshConfig(t, url, id, maxClusters, extra)
	return startMeshHostAt(t, id, path, sock)
}

// startMeshHostAt is startMeshHost with a config already written; prefix,
// if any, wraps the command (ip netns exec NS: the host in a namespace).
func startMeshHostAt(t *testing.T, id, path, sock string, prefix ...string) *meshHost {
	t.Helper()
	h := &meshHost{id: id, sock: sock, out: &testenv.Buffer{}, done: make(chan struct{})}
	argv := append(slices.Clone(prefix), testenv.Bin("sm-manager"), "-config", path)
	h.cmd = exec.Command(argv[0], argv[1:]...)
	h.cmd.Stdout, h.cmd.Stderr = h.out, h.out
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = h.cmd.Wait(); close(h.done) }()
	t.Cleanup(func() {
		h.stop(t)
		if t.Failed() {
			t.Logf("host %s:\n%s", id, h.out.String())
		}
	})
	return h
}

// stop ends the manager with SIGTERM (SIGKILL after 15 s) and waits for it.
func (h *meshHost) stop(t *testing.T) {
	if h.client != nil {
		h.client.Close()
	}
	select {
	case <-h.done:
		return
	default:
	}
	_ = h.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-h.done:
	case <-time.After(15 * time.Second):
		t.Errorf("host %s did not stop within 15s", h.id)
		_ = h.cmd.Process.Kill()
		<-h.done
	}
}

// dial connects a client to the host's socket once it is up.
func (h *meshHost) dial(t *testing.T) *ipc.Client {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := ipc.Dial(t.Context(), ipc.ClientConfig{Path: h.sock, Register: ipc.Frame{Role: ipc.RoleClient, Name: "test"}})
		if err == nil {
			h.client = c
			return c
		}
		select {
		case <-h.done:
			t.Fatalf("host %s exited: %s", h.id, h.out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("host %s not up: %v", h.id, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (h *meshHost) status(t *testing.T) manager.Status {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	r, err := h.client.Request(ctx, &ipc.Frame{Op: ipc.OpStatus})
	if err != nil {
		t.Fatalf("STATUS on %s: %v", h.id, err)
	}
	var st manager.Status
	if err := json.Unmarshal(r.Payload, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// running is what a host's own STATUS says it runs: its ready, routed
// clusters, which must all name it as their holder.
func (h *meshHost) running(t *testing.T, st manager.Status) []int {
	t.Helper()
	var out []int
	for _, c := range st.Clusters {
		if c.State == "ready" && c.Routed {
			if c.HostID != h.id {
				t.Fatalf("host %s runs cluster %d, whose lease names %q", h.id, c.ID, c.HostID)
			}
			out = append(out, c.ID)
		}
	}
	return out
}

// placed waits until hosts between them run every one of the 12 clusters,
// each on one host, and returns who runs what. Any cluster running on two
// hosts at once fails the test.
func placed(t *testing.T, hosts []*meshHost, within time.Duration, what string) map[string][]int {
	t.Helper()
	var by map[string][]int
	testenv.WaitFor(t, within, what, func() bool {
		by = map[string][]int{}
		where := map[int]string{}
		for _, h := range hosts {
			for _, c := range h.running(t, h.status(t)) {
				if other, ok := where[c]; ok {
					t.Fatalf("cluster %d runs on %s and %s", c, other, h.id)
				}
				where[c] = h.id
				by[h.id] = append(by[h.id], c)
			}
		}
		return len(where) == 12
	})
	return by
}

// TestMeshHostsShareAndFailOver: three managers place twelve clusters 4/4/4
// within their capacity (6 each) and show the whole mesh in STATUS; a
// request for a cluster another host holds reaches it; when one manager
// and its clusters are SIGKILLed, the other two take its clusters within a
// lease plus their start, never running one twice.
func TestMeshHostsShareAndFailOver(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{Bin: testenv.Bin("nats-server")})
	var hosts []*meshHost
	for _, id := range []string{"a", "b", "c"} { // together: placement waits a renewal interval for them
		hosts = append(hosts, startMeshHost(t, srv.URL, id, 6))
	}
	for _, h := range hosts {
		h.dial(t)
	}
	by := placed(t, hosts, 30*time.Second, "12 clusters ready across 3 hosts")
	for _, h := range hosts {
		if len(by[h.id]) != 4 {
			t.Fatalf("placement %v, want 4 clusters on each host", by)
		}
	}
	t.Logf("placed: %v", by)

	// Every host's STATUS shows the whole mesh.
	testenv.WaitFor(t, 10*time.Second, "every STATUS shows 3 hosts and every holder", func() bool {
		for _, h := range hosts {
			st := h.status(t)
			if len(st.Hosts) != 3 {
				return false
			}
			for _, hs := range st.Hosts {
				if hs.Capacity != 6 || len(hs.Clusters) != 4 || hs.LeaseAgeMS < 0 || hs.Self != (hs.ID == h.id) {
					return false
				}
			}
			for _, c := range st.Clusters {
				if !slices.Contains(by[c.HostID], c.ID) {
					return false
				}
			}
		}
		return true
	})

	// A request reaches a cluster of its host, and one of another host's
	// (cross-host routing: TestMeshRoutesEveryTarget tries every target).
	a, b := hosts[0], hosts[1]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if r, err := a.client.Request(ctx, &ipc.Frame{Op: "echo", Target: strconv.Itoa(by["a"][0]), Payload: json.RawMessage(`1`)}); err != nil || string(r.Payload) != "1" {
		t.Fatalf("echo to a's own cluster: %v %s", err, r.Payload)
	}
	testenv.WaitFor(t, 10*time.Second, "a request from a reaches b's cluster", func() bool {
		r, err := a.client.Request(ctx, &ipc.Frame{Op: "echo", Target: strconv.Itoa(by["b"][0]), Payload: json.RawMessage(`2`)})
		return err == nil && string(r.Payload) == "2"
	})
	// DEPLOY is refused in a mesh, and changes nothing.
	if _, err := b.client.Request(ctx, &ipc.Frame{Op: ipc.OpDeploy}); ipc.CodeOf(err) != ipc.CodeUnavailable {
		t.Fatalf("DEPLOY in a mesh: %v", err)
	}

	// Host c dies with its clusters: the manager and every process group.
	c := hosts[2]
	var pids []int
	for _, cs := range c.status(t).Clusters {
		if cs.HostID == "c" && cs.PID > 0 {
			pids = append(pids, cs.PID)
		}
	}
	if len(pids) != 4 {
		t.Fatalf("c's cluster pids: %v", pids)
	}
	c.client.Close()
	c.client = nil
	killed := time.Now()
	if err := c.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil {
			t.Fatalf("killing cluster group %d: %v", pid, err)
		}
	}
	<-c.done // after the groups: the clusters hold the manager's output pipe open
	by = placed(t, hosts[:2], 30*time.Second, "c's clusters taken over by a and b")
	t.Logf("all 12 ready on a and b %v after c was killed: %v", time.Since(killed).Round(time.Millisecond), by)
	for id, cs := range by {
		if len(cs) > 6 {
			t.Fatalf("host %s runs %d clusters, above its capacity 6: %v", id, len(cs), by)
		}
	}
	testenv.WaitFor(t, 10*time.Second, "c's host record gone", func() bool { return len(a.status(t).Hosts) == 2 })
	for _, pid := range pids {
		testenv.WaitFor(t, 5*time.Second, "c's clusters gone", func() bool { return syscall.Kill(pid, 0) != nil })
	}

	// The others leave cleanly, releasing their leases.
	a.stop(t)
	b.stop(t)
	// A context of its own: the one above may have run out during the failover.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	kv, err := jetStream(t, srv.URL).KeyValue(ctx2, "sm_leases")
	if err != nil {
		t.Fatal(err)
	}
	if keys, err := kv.Keys(ctx2); !errors.Is(err, jetstream.ErrNoKeysFound) {
		t.Fatalf("leases left after both hosts left: %v %v", keys, err)
	}
}

// jetStream connects the test itself to the mesh's NATS server, closed at
// the test's end.
func jetStream(t *testing.T, url string, opts ...nats.Option) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// TestMeshWrongCredentials: a manager whose NATS credentials the server
// refuses does not start: a clear error naming the key at fault (never the
// secret), no socket, and nothing written to NATS.
func TestMeshWrongCredentials(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{Bin: testenv.Bin("nats-server"), Auth: `authorization { token: "right-token-1234" }`})
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("wrong-token-5678\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	path, sock := meshConfig(t, srv.URL, "a", 0, fmt.Sprintf("token_file = %q\n", tok))
	if out, err := exec.Command(testenv.Bin("sm-manager"), "-config", path, "-check").CombinedOutput(); err != nil {
		t.Fatalf("-check (which does not connect) = %v:\n%s", err, out)
	}
	out, err := exec.Command(testenv.Bin("sm-manager"), "-config", path).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "refused this host") || !strings.Contains(string(out), "mesh.token_file") {
		t.Fatalf("sm-manager with a wrong token = %v:\n%s", err, out)
	}
	if strings.Contains(string(out), "wrong-token") || strings.Contains(string(out), "right-token") {
		t.Fatalf("a token in the output:\n%s", out)
	}
	if _, err := os.Stat(sock); err == nil {
		t.Error("the refused manager made its socket")
	}
	js := jetStream(t, srv.URL, nats.Token("right-token-1234"))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := js.KeyValue(ctx, "sm_hosts"); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Fatalf("the refused manager joined: sm_hosts is %v", err)
	}
}

// TestMeshFencesWhenCutOff: a manager that can no longer renew its leases
// (the NATS server is gone) kills its clusters by the fence, without
// waiting for the server; once the server is back, it takes them again.
func TestMeshFencesWhenCutOff(t *testing.T) {
	srv := natstest.Start(t, natstest.Options{Bin: testenv.Bin("nats-server")})
	h := startMeshHost(t, srv.URL, "a", 0)
	h.dial(t)
	placed(t, []*meshHost{h}, 30*time.Second, "12 clusters ready on one host")
	var pids []int
	for _, cs := range h.status(t).Clusters {
		pids = append(pids, cs.PID)
	}
	srv.Kill()
	cut := time.Now()
	for _, pid := range pids {
		testenv.WaitFor(t, 10*time.Second, "every cluster fenced", func() bool { return syscall.Kill(pid, 0) != nil })
	}
	t.Logf("12 clusters fenced %v after the server died (fence at 1.5 s after the last renewal)", time.Since(cut).Round(time.Millisecond))
	for _, cs := range h.status(t).Clusters {
		if cs.State == "ready" || cs.PID != 0 {
			t.Fatalf("cluster %d still runs after the fence: %+v", cs.ID, cs)
		}
	}
	if !strings.Contains(h.out.String(), "lease not renewed in time") {
		t.Fatalf("no fence logged:\n%s", h.out.String())
	}
	srv.Restart()
	placed(t, []*meshHost{h}, 30*time.Second, "12 clusters ready again after the server came back")
}
