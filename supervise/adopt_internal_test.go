package supervise

import (
	"syscall"
	"testing"
	"time"
)

// adoptNow adopts pid as it is now, and returns the handle and the start
// time it was adopted at.
func adoptNow(t *testing.T, pid int) (*adopted, uint64) {
	t.Helper()
	start, err := StartTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	proc, err := Adopt(pid, start)
	if err != nil {
		t.Fatal(err)
	}
	return proc.(*adopted), start
}

// TestReleasedIsNotSignalled: once released, the pidfd is closed and nothing
// vouches for the pid any more, so Signal must not reach it (or its group).
func TestReleasedIsNotSignalled(t *testing.T) {
	t.Parallel()
	pid := startLeader(t, 0).Process.Pid
	p, start := adoptNow(t, pid)

	p.Release()
	// At once: the watch may not have noticed the release yet.
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Errorf("Signal after Release: %v", err)
	}
	select {
	case <-p.Exited(): // the watch has ended: no goroutine left behind
	case <-time.After(10 * time.Second):
		t.Fatal("the watch outlived Release")
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Errorf("Signal after Release: %v", err)
	}
	time.Sleep(50 * time.Millisecond)
	if got, err := StartTime(pid); err != nil || got != start {
		t.Errorf("released process %d was signalled: StartTime = %d, %v", pid, got, err)
	}
}
