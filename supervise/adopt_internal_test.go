package supervise

import (
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestReleasedIsNotSignalled: once released, the pidfd is closed and nothing
// vouches for the pid any more, so Signal must not reach it (or its group).
func TestReleasedIsNotSignalled(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	defer cmd.Wait()
	defer syscall.Kill(-pid, syscall.SIGKILL)
	start, err := StartTime(pid)
	if err != nil {
		t.Fatal(err)
	}
	proc, err := Adopt(pid, start)
	if err != nil {
		t.Fatal(err)
	}
	p := proc.(*adopted)

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
