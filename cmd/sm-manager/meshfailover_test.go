package main_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/internal/activations"
	"github.com/sm-supervisor/sm/internal/natstest"
	"github.com/sm-supervisor/sm/internal/netns"
	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/ipc"
)

// TestMeshFailoverUnderLoad: three managers (each in its own network
// namespace when the test runs as root, else all on loopback) share twelve
// clusters through a real nats-server, and a client on each host's socket
// keeps requests in flight to that host's clusters. One manager and its
// clusters' process groups are SIGKILLed; the clients of the two left then
// send to all twelve cluster ids. The killed host's clusters answer again on
// the others within a lease plus their start (the bound here is generous
// for a loaded machine; the time is logged); every request the survivors
// sent got exactly one REPLY, an answer or unavailable (a cluster not held by
// that host, or not yet), none twice; and the simulated bots' own record
// (cluster-harness --record, shared by every process of every host) shows
// no two processes of one cluster ever activated at once.
func TestMeshFailoverUnderLoad(t *testing.T) {
	const lease = 2 * time.Second
	var nats *natstest.Server
	var wrap [3][]string // the command prefix of each host's manager
	if os.Geteuid() == 0 {
		hs := netns.New(t, 4)
		nats = natstest.Start(t, natstest.Options{Bin: testenv.Bin("nats-server"), Host: hs[0].Addr, Port: 4222, Exec: hs[0].Exec()})
		for i := range wrap {
			wrap[i] = hs[i+1].Exec()
		}
		t.Log("hosts: three network namespaces, NATS in a fourth")
	} else {
		nats = natstest.Start(t, natstest.Options{Bin: testenv.Bin("nats-server")})
		t.Log("not root: no network namespaces; the three hosts share loopback")
	}
	record := filepath.Join(t.TempDir(), "activations.jsonl")
	ids := []string{"a", "b", "c"}
	var hosts []*meshHost
	for i, id := range ids {
		hosts = append(hosts, startMeshHostIn(t, nats.URL, id, 6, wrap[i], "SM_HARNESS_FLAGS=--record="+record))
	}
	for _, h := range hosts {
		h.dial(t)
	}
	by := placed(t, hosts, 30*time.Second, "12 clusters ready across 3 hosts")
	by0 := by
	t.Logf("placed: %v", by)

	// Load: each host's own clusters, from a client on its own socket.
	var loads []*meshLoad
	for _, h := range hosts {
		loads = append(loads, startMeshLoad(t, h, by[h.id], 4))
	}
	time.Sleep(time.Second)

	// Host c dies with its clusters.
	c := hosts[2]
	var pids []int
	for _, cs := range c.status(t).Clusters {
		if cs.HostID == "c" && cs.PID > 0 {
			pids = append(pids, cs.PID)
		}
	}
	if len(pids) != len(by["c"]) {
		t.Fatalf("c's cluster pids %v, placement %v", pids, by["c"])
	}
	loads[2].stop()
	killed := time.Now()
	if err := c.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil {
			t.Fatalf("killing cluster group %d: %v", pid, err)
		}
	}
	gone := map[int]time.Time{}
	testenv.WaitFor(t, 10*time.Second, "c's clusters gone", func() bool {
		for _, pid := range pids {
			if _, ok := gone[pid]; !ok && syscall.Kill(pid, 0) != nil {
				gone[pid] = time.Now()
			}
		}
		return len(gone) == len(pids)
	})
	<-c.done
	// The survivors' clients now ask every cluster.
	all := make([]int, 12)
	for i := range all {
		all[i] = i
	}
	for _, l := range loads[:2] {
		l.retarget(all)
	}
	testenv.WaitFor(t, lease+20*time.Second, "every cluster answering again", func() bool {
		for cl := range 12 {
			if loads[0].okAfter(cl, killed).IsZero() && loads[1].okAfter(cl, killed).IsZero() {
				return false
			}
		}
		return true
	})
	var back time.Duration
	for _, cl := range by["c"] {
		at := loads[0].okAfter(cl, killed)
		if b := loads[1].okAfter(cl, killed); at.IsZero() || (!b.IsZero() && b.Before(at)) {
			at = b
		}
		back = max(back, at.Sub(killed))
	}
	t.Logf("c's %d clusters answered again %v after the kill (lease %v)", len(by["c"]), back.Round(time.Millisecond), lease)
	by = placed(t, hosts[:2], 10*time.Second, "12 clusters on a and b")
	t.Logf("after: %v", by)
	time.Sleep(500 * time.Millisecond)

	for i, l := range loads[:2] {
		b := l.stop()
		var gap uint64
		for _, cl := range by0["c"] {
			gap += l.unavail[cl]
		}
		t.Logf("host %s: %s; unavailable for c's old clusters (the gap, then those the other host took: no cross-host routing here): %d, for the other host's own: %d",
			ids[i], b, gap, b.errors[ipc.CodeUnavailable]-gap)
		if b.sent == 0 || b.ok == 0 {
			t.Errorf("host %s: no load: %s", ids[i], b)
		}
		if b.lost != 0 || b.dup != 0 || b.unknown != 0 || b.sent != b.ok+b.errorCount() {
			t.Errorf("host %s: books do not balance: %s", ids[i], b)
		}
		for code := range b.errors {
			if code != ipc.CodeUnavailable {
				t.Errorf("host %s: %d %s replies", ids[i], b.errors[code], code)
			}
		}
	}
	t.Logf("host c, its load stopped just before its death: %s", loads[2].stop())

	// The survivors stop their clusters (each records its exit); the killed
	// ones' exits are the times they were seen gone, later than the real
	// ones, so the check errs on the strict side.
	hosts[0].stop(t)
	hosts[1].stop(t)
	recs, err := activations.ReadFile(record)
	if err != nil {
		t.Fatal(err)
	}
	activated := 0
	for _, r := range recs {
		if r.Event == activations.Activate {
			activated++
		}
		if r.Host == "c" && r.Event == activations.Activate {
			if at, ok := gone[r.PID]; ok {
				recs = append(recs, activations.Record{Host: "c", Cluster: r.Cluster, Generation: r.Generation,
					PID: r.PID, Event: activations.Exit, UnixNano: at.UnixNano()})
			}
		}
	}
	if activated < 12+len(pids) {
		t.Fatalf("%d activations recorded, want at least %d (12, then c's %d again)", activated, 12+len(pids), len(pids))
	}
	if o := activations.Check(recs); len(o) > 0 {
		t.Fatalf("two processes of a cluster activated at once: %v", o)
	}
	t.Logf("%d records, %d activations: never two processes of a cluster activated at once", len(recs), activated)
}

// startMeshHostIn is startMeshHost with the manager's command behind
// prefix (ip netns exec NS) and extra environment.
func startMeshHostIn(t *testing.T, url, id string, maxClusters int, prefix []string, env ...string) *meshHost {
	t.Helper()
	path, sock := meshConfig(t, url, id, maxClusters, "")
	h := &meshHost{id: id, sock: sock, out: &testenv.Buffer{}, done: make(chan struct{})}
	argv := append(slices.Clone(prefix), testenv.Bin("sm-manager"), "-config", path)
	h.cmd = exec.Command(argv[0], argv[1:]...)
	h.cmd.Env = append(os.Environ(), env...)
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

// meshLoad keeps requests in flight from one client of a host's socket, each
// an echo with a payload of its own, and keeps exact books.
type meshLoad struct {
	client *ipc.Client
	cancel context.CancelFunc
	wg     sync.WaitGroup
	dup    atomic.Uint64 // REPLYs with an id no request waits for
	unk    atomic.Uint64 // REPLYs with no id

	mu      sync.Mutex // guards the fields below
	targets []int
	books   meshBooks
	ok      map[int][]time.Time // per cluster: when it answered (sent times)
	unavail map[int]uint64      // per cluster: unavailable replies
	stopped bool
}

type meshBooks struct {
	sent, ok, lost, dup, unknown uint64
	errors                       map[string]uint64
}

func (b meshBooks) errorCount() uint64 {
	var n uint64
	for _, v := range b.errors {
		n += v
	}
	return n
}

func (b meshBooks) String() string {
	return fmt.Sprintf("sent %d: ok %d, errors %v, lost %d, duplicate %d, unknown %d", b.sent, b.ok, b.errors, b.lost, b.dup, b.unknown)
}

// startMeshLoad starts workers requests in flight at once on a new client
// of h, to targets in turn.
func startMeshLoad(t *testing.T, h *meshHost, targets []int, workers int) *meshLoad {
	t.Helper()
	l := &meshLoad{targets: slices.Clone(targets), ok: map[int][]time.Time{}, unavail: map[int]uint64{}, books: meshBooks{errors: map[string]uint64{}}}
	c, err := ipc.Dial(t.Context(), ipc.ClientConfig{Path: h.sock, Register: ipc.Frame{Role: ipc.RoleClient, Name: "load"},
		Handler: func(_ *ipc.Client, f *ipc.Frame) {
			if f.Op == ipc.OpReply && f.ID != "" {
				l.dup.Add(1)
			} else if f.Op == ipc.OpReply {
				l.unk.Add(1)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	l.client = c
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	for w := range workers {
		l.wg.Go(func() { l.work(ctx, w) })
	}
	t.Cleanup(func() { l.stop() })
	return l
}

func (l *meshLoad) work(ctx context.Context, w int) {
	for n := 0; ctx.Err() == nil; n++ {
		l.mu.Lock()
		target := l.targets[(w+n)%len(l.targets)]
		l.mu.Unlock()
		payload, _ := json.Marshal(fmt.Sprintf("w%d-n%d", w, n))
		// Its own deadline, past the manager's (requests.timeout, 10 s):
		// a stop lets what is in flight finish.
		rctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		sent := time.Now()
		r, err := l.client.Request(rctx, &ipc.Frame{Op: "echo", Target: strconv.Itoa(target), Payload: payload})
		cancel()
		l.mu.Lock()
		switch {
		case r != nil && r.Error != nil:
			l.books.sent++
			l.books.errors[r.Error.Code]++
			if r.Error.Code == ipc.CodeUnavailable {
				l.unavail[target]++
			}
		case r != nil && string(r.Payload) != string(payload):
			l.books.sent++
			l.books.errors["bad_payload"]++
		case r != nil:
			l.books.sent++
			l.books.ok++
			l.ok[target] = append(l.ok[target], sent)
		case errors.Is(err, ipc.ErrTimeout):
			l.books.sent++
			l.books.lost++
		default: // the connection is gone (host c): never sent, or lost with it
			l.books.errors["connection_lost"]++
			l.books.sent++
		}
		l.mu.Unlock()
		if r == nil && !errors.Is(err, ipc.ErrTimeout) {
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// retarget makes the workers ask targets from now on.
func (l *meshLoad) retarget(targets []int) {
	l.mu.Lock()
	l.targets = slices.Clone(targets)
	l.mu.Unlock()
}

// okAfter is when cluster c first answered a request sent after at, zero if
// it has not yet.
func (l *meshLoad) okAfter(c int, at time.Time) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.ok[c] {
		if s.After(at) {
			return s
		}
	}
	return time.Time{}
}

// stop ends the load, waits for what is in flight, closes the client and
// returns the books (again and again).
func (l *meshLoad) stop() meshBooks {
	l.cancel()
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.stopped {
		l.stopped = true
		l.client.Close()
	}
	b := l.books
	b.errors = maps.Clone(b.errors)
	b.dup, b.unknown = l.dup.Load(), l.unk.Load()
	return b
}
