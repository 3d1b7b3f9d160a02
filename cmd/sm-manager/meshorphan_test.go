package main_test

import (
	"os"
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
