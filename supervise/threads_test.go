package supervise_test

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/supervise"
)

// threads is the number of OS threads of this process.
func threads(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no Threads: line in /proc/self/status")
	return 0
}

// Waiting for a child holds no OS thread: a manager of 512 clusters had 522
// threads, one blocked in waitid per child. The exit still arrives.
func TestWaitingForChildrenHoldsNoThreads(t *testing.T) {
	const n = 64
	before := threads(t)
	var ps []supervise.Process
	for range n {
		ps = append(ps, spawn(t, supervise.ExecSpawner{}, sh("exec sleep 30")))
	}
	time.Sleep(200 * time.Millisecond) // every waiter is parked by now
	if grew := threads(t) - before; grew >= n/2 {
		t.Errorf("%d children waited for with %d more threads", n, grew)
	}
	for _, p := range ps {
		syscall.Kill(p.PID(), syscall.SIGKILL)
	}
	for _, p := range ps {
		waitExited(t, p, 10*time.Second)
		if !strings.Contains(p.ExitStatus(), "killed") {
			t.Errorf("pid %d: exit status %q, want killed", p.PID(), p.ExitStatus())
		}
	}
}
