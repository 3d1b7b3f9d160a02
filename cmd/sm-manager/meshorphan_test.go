package main_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/internal/natstest"
	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/supervise"
)

// subreaper makes the test process the reaper of orphaned descendants (a
// SIGKILLed manager's clusters), so that it can read their exit status, until
// the test ends.
func subreaper(t *testing.T) {
	t.Helper()
	const prSetChildSubreaper = 36
	if _, _, e := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); e != 0 {
		t.Skipf("cannot become a child subreaper: %v", e)
	}
	t.Cleanup(func() { syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 0, 0) })
}

// orphanExit is one orphaned cluster process's end, as the test reaped it.
type orphanExit struct {
	pid    int
	status syscall.WaitStatus
	at     time.Time // when the test reaped it: never before it exited
}

// reapOrphan waits for pid, once it is the test's child (its parent died),
// and reports its exit.
func reapOrphan(pid int, out chan<- orphanExit) {
	for {
		var ws syscall.WaitStatus
		_, err := syscall.Wait4(pid, &ws, 0, nil)
		if err == syscall.EINTR {
			continue
		}
		if err == syscall.ECHILD { // not reparented yet
			time.Sleep(2 * time.Millisecond)
			continue
		}
		out <- orphanExit{pid: pid, status: ws, at: time.Now()}
		return
	}
}

// processStart is when pid started, from the kernel's count of 10 ms ticks
// since boot and the boot time read from /proc/uptime (10 ms too); it may be
// 20 ms early or late, so callers allow for startSlack.
func processStart(t *testing.T, pid int) time.Time {
	t.Helper()
	ticks, err := supervise.StartTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	up, err := strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	if err != nil {
		t.Fatal(err)
	}
	boot := now.Add(-time.Duration(up * float64(time.Second)))
	return boot.Add(time.Duration(ticks) * 10 * time.Millisecond)
}

const startSlack = 20 * time.Millisecond

// TestMeshOrphansExit: SIGKILL one manager of a mesh alone, its cluster
// processes left running: each exits with status 75 once it has not reached
// the socket for SM_ORPHAN_TIMEOUT_MS (lease/8 = 250 ms), before the other
// host, which takes the leases over once they expire, starts any of them.
func TestMeshOrphansExit(t *testing.T) {
	subreaper(t)
	srv := natstest.Start(t, natstest.Options{Bin: testenv.Bin("nats-server")})
	a := startMeshHost(t, srv.URL, "a", 6)
	b := startMeshHost(t, srv.URL, "b", 0)
	a.dial(t)
	b.dial(t)
	placed(t, []*meshHost{a, b}, 30*time.Second, "12 clusters ready on a and b")
	orphans := map[int]int{} // pid → cluster
	for _, cs := range a.status(t).Clusters {
		if cs.HostID == "a" && cs.PID > 0 {
			orphans[cs.PID] = cs.ID
		}
	}
	if len(orphans) != 6 {
		t.Fatalf("a runs %d clusters, want 6", len(orphans))
	}
	a.client.Close()
	a.client = nil
	killed := time.Now()
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	exits := make(chan orphanExit, len(orphans))
	for pid := range orphans {
		go reapOrphan(pid, exits)
	}
	exitAt := map[int]time.Time{} // cluster → when its orphan was reaped
	var slowest time.Duration
	for range orphans {
		select {
		case e := <-exits:
			if !e.status.Exited() || e.status.ExitStatus() != 75 {
				t.Errorf("cluster %d (pid %d) ended with %v, want exit status 75", orphans[e.pid], e.pid, e.status)
			}
			exitAt[orphans[e.pid]] = e.at
			slowest = max(slowest, e.at.Sub(killed))
		case <-time.After(20 * time.Second):
			t.Fatalf("orphans still running 20 s after their manager died: %d of %d reaped", len(exitAt), len(orphans))
		}
	}
	<-a.done
	t.Logf("a's 6 orphans exited 75 within %v of a's SIGKILL (SM_ORPHAN_TIMEOUT_MS 250; the fence would be at 1.5 s after the last renewal)", slowest.Round(time.Millisecond))
	if !strings.Contains(a.out.String(), "the manager's socket could not be reached") {
		t.Errorf("no orphan exit logged:\n%s", a.out.String())
	}

	// b takes a's clusters over, each started only after a's process exited.
	placed(t, []*meshHost{b}, 30*time.Second, "b runs all 12")
	var first time.Duration
	for _, cs := range b.status(t).Clusters {
		at, ok := exitAt[cs.ID]
		if !ok {
			continue
		}
		started := processStart(t, cs.PID)
		if !started.Add(-startSlack).After(at) {
			t.Errorf("cluster %d started on b at %v, before a's orphan was reaped at %v", cs.ID, started, at)
		}
		if d := started.Sub(killed); first == 0 || d < first {
			first = d
		}
	}
	t.Logf("b started the first of them %v after a's SIGKILL", first.Round(10*time.Millisecond))
}

// TestMeshSuccessorAdopts: SIGKILL a mesh manager alone and start it again
// at once with the same state directory: the successor takes over its
// previous boot's host record and leases (the boot id is in the state file)
// and adopts the same cluster processes, rather than waiting out the lease
// and fencing them. Lease 8 s here, so SM_ORPHAN_TIMEOUT_MS is 1 s: the
// successor must be up within it.
func TestMeshSuccessorAdopts(t *testing.T) {
	subreaper(t) // the killed manager's clusters become the test's children
	srv := natstest.Start(t, natstest.Options{Bin: testenv.Bin("nats-server")})
	path, sock := meshConfig(t, srv.URL, "a", 0, fmt.Sprintf("[state]\ndir = %q\n", t.TempDir()))
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(strings.Replace(string(doc), `lease = "2s"`, `lease = "8s"`, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	first := startMeshHostAt(t, "a", path, sock)
	first.dial(t)
	placed(t, []*meshHost{first}, 30*time.Second, "a runs the 12 clusters")
	pids := map[int]int{}
	for _, cs := range first.status(t).Clusters {
		pids[cs.ID] = cs.PID
	}
	// The state file names this boot before the manager dies.
	testenv.WaitFor(t, 5*time.Second, "the state file names the mesh boot", func() bool {
		b, _ := os.ReadFile(filepath.Join(stateDirOf(t, path), "manager-state.json"))
		return strings.Contains(string(b), `"mesh_boot"`)
	})
	first.client.Close()
	first.client = nil
	killed := time.Now()
	if err := first.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	second := startMeshHostAt(t, "a", path, sock)
	second.dial(t)
	var adoptedIn time.Duration
	testenv.WaitFor(t, 20*time.Second, "the successor runs the same 12 processes", func() bool {
		st := second.status(t)
		if len(st.Clusters) != 12 {
			return false
		}
		for _, cs := range st.Clusters {
			if cs.State != "ready" || !cs.Routed || cs.HostID != "a" || cs.PID != pids[cs.ID] {
				return false
			}
		}
		adoptedIn = time.Since(killed)
		return true
	})
	out := second.out.String()
	if !strings.Contains(out, "took over the previous boot's leases") {
		t.Fatalf("no takeover logged:\n%s", out)
	}
	if strings.Contains(out, "fencing cluster") || strings.Contains(first.out.String(), "could not be reached") {
		t.Fatalf("a cluster was fenced or orphaned across the restart:\nfirst:\n%s\nsecond:\n%s", first.out.String(), out)
	}
	if hs := second.status(t).Hosts; len(hs) != 1 || !hs[0].Self || len(hs[0].Clusters) != 12 {
		t.Fatalf("hosts after the takeover: %+v", hs)
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "took over") {
			t.Log(l)
		}
	}
	t.Logf("the successor adopted all 12 processes (same pids, leases taken over) %v after the SIGKILL; the lease is 8 s", adoptedIn.Round(time.Millisecond))
	// The old boot's processes were never this test's to reap: none exited.
	for c, pid := range pids {
		if syscall.Kill(pid, 0) != nil {
			t.Fatalf("cluster %d's process %d is gone", c, pid)
		}
	}
	second.stop(t)
	// The killed manager ends once its adopted clusters stop (they held its output pipe).
	<-first.done
	reapAll(pids)
}

// reapAll reaps the given processes if they became the test's children.
func reapAll(pids map[int]int) {
	for _, pid := range pids {
		var ws syscall.WaitStatus
		syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
	}
}

// stateDirOf reads [state] dir back from a config written by meshConfig.
func stateDirOf(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, _ := strings.Cut(string(b), "[state]\ndir = ")
	line, _, _ := strings.Cut(rest, "\n")
	dir, err := strconv.Unquote(line)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}
