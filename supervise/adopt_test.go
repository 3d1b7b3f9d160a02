package supervise_test

import (
	"errors"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/supervise"
)

// startGroup starts argv as the leader of its own process group, as a cluster
// is, but with os/exec, so that the supervise package did not start it. The
// cleanup kills the group and reaps the leader.
func startGroup(t *testing.T, argv ...string) (*exec.Cmd, uint64) {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sigkill(cmd.Process.Pid)
		cmd.Wait() // a no-op error if the test reaped it already
	})
	start, err := supervise.StartTime(cmd.Process.Pid)
	if err != nil {
		t.Fatalf("StartTime(%d): %v", cmd.Process.Pid, err)
	}
	return cmd, start
}

// adopt adopts pid and makes sure its watch has ended before the test does.
func adopt(t *testing.T, pid int, start uint64) supervise.Process {
	t.Helper()
	p, err := supervise.Adopt(pid, start)
	if err != nil {
		t.Fatalf("Adopt(%d, %d): %v", pid, start, err)
	}
	t.Cleanup(func() {
		sigkill(pid)
		waitExited(t, p, 10*time.Second)
	})
	return p
}

func TestAdoptReportsExit(t *testing.T) {
	t.Parallel()
	cmd, start := startGroup(t, "sleep", "60")
	p := adopt(t, cmd.Process.Pid, start)
	if p.PID() != cmd.Process.Pid {
		t.Errorf("PID() = %d, want %d", p.PID(), cmd.Process.Pid)
	}
	select {
	case <-p.Exited():
		t.Fatal("Exited closed while the process runs")
	case <-time.After(50 * time.Millisecond):
	}

	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	// Seen while it is a zombie, before its parent (the test) reaps it.
	waitExited(t, p, 10*time.Second)
	if state, _, err := procStat(cmd.Process.Pid); err != nil || state != "Z" {
		t.Errorf("pid %d: state %q, %v; want a zombie until reaped", cmd.Process.Pid, state, err)
	}
	if err := cmd.Wait(); err == nil {
		t.Error("killed process exited 0")
	}
	if got, want := p.ExitStatus(), "exited (adopted; status unknown)"; got != want {
		t.Errorf("ExitStatus() = %q, want %q", got, want)
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Errorf("Signal after exit: %v", err)
	}
}

func TestAdoptGone(t *testing.T) {
	t.Parallel()

	t.Run("wrong start time", func(t *testing.T) {
		cmd, start := startGroup(t, "sleep", "60")
		for _, wrong := range []uint64{start - 1, start + 1, 0} {
			if p, err := supervise.Adopt(cmd.Process.Pid, wrong); !errors.Is(err, supervise.ErrGone) {
				t.Errorf("Adopt(pid, %d) = %v, %v; want ErrGone", wrong, p, err)
			}
		}
		// Untouched: still running, and adoptable with the right start time.
		if state, _, err := procStat(cmd.Process.Pid); err != nil || state == "Z" {
			t.Errorf("pid %d: state %q, %v; want running", cmd.Process.Pid, state, err)
		}
		adopt(t, cmd.Process.Pid, start)
	})

	t.Run("no such pid", func(t *testing.T) {
		if _, err := supervise.Adopt(unusedPID(t), 1); !errors.Is(err, supervise.ErrGone) {
			t.Errorf("err = %v, want ErrGone", err)
		}
	})

	t.Run("exited and reaped", func(t *testing.T) {
		cmd := exec.Command("sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		start, err := supervise.StartTime(cmd.Process.Pid)
		cmd.Process.Kill()
		cmd.Wait()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := supervise.Adopt(cmd.Process.Pid, start); !errors.Is(err, supervise.ErrGone) {
			t.Errorf("err = %v, want ErrGone", err)
		}
	})

	t.Run("zombie", func(t *testing.T) {
		pid, reap := zombie(t)
		defer reap()
		if _, err := supervise.Adopt(pid, 1); !errors.Is(err, supervise.ErrGone) {
			t.Errorf("err = %v, want ErrGone", err)
		}
	})
}

func TestAdoptSignal(t *testing.T) {
	t.Parallel()

	t.Run("reaches the process", func(t *testing.T) {
		t.Parallel()
		cmd, start := startGroup(t, "sleep", "60")
		p := adopt(t, cmd.Process.Pid, start)
		if err := p.Signal(syscall.SIGTERM); err != nil {
			t.Fatalf("Signal: %v", err)
		}
		waitExited(t, p, 10*time.Second)
		var ee *exec.ExitError
		if err := cmd.Wait(); !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGTERM {
			t.Errorf("Wait = %v, want killed by SIGTERM", err)
		}
	})

	t.Run("reaches its group", func(t *testing.T) {
		t.Parallel()
		pidFile := filepath.Join(t.TempDir(), "pid")
		cmd, start := startGroup(t, "/bin/sh", "-c", `sleep 60 & echo $! >"$1"; wait`, "sh", pidFile)
		child := readPID(t, pidFile)
		t.Cleanup(func() { syscall.Kill(child, syscall.SIGKILL) }) // if the test failed
		childStart, err := supervise.StartTime(child)
		if err != nil {
			t.Fatal(err)
		}
		p := adopt(t, cmd.Process.Pid, start)
		if err := p.Signal(syscall.SIGTERM); err != nil {
			t.Fatalf("Signal: %v", err)
		}
		waitExited(t, p, 10*time.Second)
		if !eventually(10*time.Second, func() bool { return gone(child, childStart) }) {
			t.Errorf("the leader's child %d survived a signal to the group", child)
		}
	})
}
