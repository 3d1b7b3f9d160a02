package supervise

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// pidReuseHelperEnv makes TestPIDReuseHelper run: it is set only for the test
// binary that TestAdoptedPIDReuseSignalsNothing starts in a new PID namespace.
const pidReuseHelperEnv = "SM_TEST_PIDREUSE_HELPER"

// TestAdoptedPIDReuseSignalsNothing: an adopted cluster is not the manager's
// child, so its real parent may reap it and the kernel may give its pid to a
// new process that leads its own group, before the manager signals. Nothing
// the manager then does through the old handle may reach the new process or
// its group. The pid is reused on purpose (ns_last_pid, as CRIU does), which
// needs a PID namespace of its own, so the check runs in one (as root, with
// unshare) where a failure kills nothing outside.
func TestAdoptedPIDReuseSignalsNothing(t *testing.T) {
	t.Parallel()
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("no unshare(1)")
	}
	if os.Geteuid() != 0 {
		t.Skip("a PID namespace and ns_last_pid need root here")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// sh is pid 1 and runs the helper as its child (the echo after it keeps
	// sh from exec'ing it). When sh exits, the kernel kills what is left in
	// the namespace; if unshare is killed (the timeout), --kill-child kills sh.
	cmd := exec.CommandContext(ctx, unshare, "--pid", "--fork", "--kill-child", "--mount-proc",
		"/bin/sh", "-c",
		`"$0" -test.run='^TestPIDReuseHelper$' -test.v; echo "helper exit $?"`, os.Args[0])
	cmd.Env = append(os.Environ(), pidReuseHelperEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("unshare: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "--- SKIP: TestPIDReuseHelper") {
		t.Skipf("in the PID namespace, the reuse could not be arranged:\n%s", out)
	}
	if !strings.Contains(string(out), "--- PASS: TestPIDReuseHelper") ||
		!strings.Contains(string(out), "helper exit 0") {
		t.Errorf("in a PID namespace:\n%s", out)
	}
}

// TestPIDReuseHelper is TestAdoptedPIDReuseSignalsNothing's half inside the
// namespace. It adopts a group leader it started itself, lets it exit and
// reaps it as its real parent, has the kernel give the same pid to a new
// group leader (with a second member in its group), and then does through the
// old handle all the manager does: SIGTERM and SIGKILL, Stop, the SIGKILL of
// the leftovers, and Adopt of the recorded pid and start time. It does so both
// with the handle whose watch has seen the exit and with the same pidfd as a
// watch that has not woken yet sees it (the window: exit, reap and reuse all
// before that goroutine runs). Then the new processes must not have been
// signalled.
func TestPIDReuseHelper(t *testing.T) {
	if os.Getenv(pidReuseHelperEnv) == "" {
		t.Skip("runs only inside TestAdoptedPIDReuseSignalsNothing's PID namespace")
	}
	if os.Getpid() == 1 {
		t.Fatal("the helper must not be pid 1 itself")
	}

	old := startLeader(t, 0)
	pid := old.Process.Pid
	// The start time counts clock ticks (10 ms): the old process must live
	// into a later tick than the one its successor starts in, or the start
	// time could not tell them apart.
	time.Sleep(30 * time.Millisecond)
	awake, start := adoptNow(t, pid)
	// The same pidfd, as a watch that has not yet woken holds it: the handle's
	// own watch closes its copy as soon as it sees the exit.
	asleep := &adopted{g: group{pid: pid, f: dupFile(t, awake.g.f)}, exited: make(chan struct{})}
	defer asleep.g.f.Close()

	// The cluster exits and its real parent, not the manager, reaps it.
	if err := old.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-awake.Exited():
	case <-time.After(5 * time.Second):
		t.Fatal("the adopted process's exit was not reported")
	}
	old.Wait()

	leader, member := reusePID(t, pid)
	if got, err := StartTime(pid); err != nil || got == start {
		t.Fatalf("pid %d reused in the same clock tick (start %d, now %d, %v)", pid, start, got, err)
	}

	// The handle whose watch has seen the exit.
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		if err := awake.Signal(sig); err != nil {
			t.Errorf("Signal(%v) after the exit: %v", sig, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := Stop(ctx, awake, 50*time.Millisecond); err != nil {
		t.Errorf("Stop after the exit: %v", err)
	}
	if got := awake.ExitStatus(); got != "exited (adopted; status unknown)" {
		t.Errorf("ExitStatus = %q; want the adopted process's exit", got)
	}

	// The handle whose watch has not woken: every signal goes through the
	// pidfd while it is still open. A cancelled context makes Stop send both
	// SIGTERM and SIGKILL at once and return without a confirmed exit.
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		if err := asleep.Signal(sig); err != nil {
			t.Errorf("Signal(%v) before the watch woke: %v", sig, err)
		}
	}
	cancelled, cancelNow := context.WithCancel(context.Background())
	cancelNow()
	if err := Stop(cancelled, asleep, time.Hour); !errors.Is(err, context.Canceled) {
		t.Errorf("Stop before the watch woke = %v; want no confirmed exit yet", err)
	}
	// The watch wakes at last: the pidfd is readable, so it reports the exit
	// and SIGKILLs the leftovers of the group, through the still open pidfd.
	asleep.wait()
	if !isClosed(asleep.Exited()) || asleep.ExitStatus() != "exited (adopted; status unknown)" {
		t.Errorf("late watch: exited %v, status %q; want the original's exit",
			isClosed(asleep.Exited()), asleep.ExitStatus())
	}
	if err := Stop(ctx, asleep, 50*time.Millisecond); err != nil {
		t.Errorf("Stop after the late watch: %v", err)
	}

	// A manager restarted on the state file: the recorded pid and start time
	// name the old process, which is gone.
	if p, err := Adopt(pid, start); !errors.Is(err, ErrGone) {
		t.Errorf("Adopt(%d, old start) after reuse = %v, %v; want ErrGone", pid, p, err)
		if err == nil {
			p.(*adopted).Release()
			<-p.Exited()
		}
	}

	// Every signal above was sent, synchronously, before this one. A fatal
	// signal that reached a process first ends it first (SIGKILL at once; a
	// pending SIGTERM, 15, is taken before SIGVTALRM, 26), so each must die
	// of SIGVTALRM.
	for _, c := range []*exec.Cmd{leader, member} {
		c.Process.Signal(syscall.SIGVTALRM)
		c.Wait()
		ws := c.ProcessState.Sys().(syscall.WaitStatus)
		if !ws.Signaled() || ws.Signal() != syscall.SIGVTALRM {
			t.Errorf("new process %d (group %d) was signalled through the old handle: %v",
				c.Process.Pid, pid, c.ProcessState)
		}
	}
}

// startLeader starts a sleep that leads its own process group (pgid 0) or
// joins group pgid, and kills it when the test ends unless it was reaped.
func startLeader(t *testing.T, pgid int) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pgid: pgid}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return cmd
}

// reusePID has the kernel give pid, free again, to a new group leader: the
// namespace's next pid is set to pid by writing pid-1 to ns_last_pid just
// before the fork. One of the Go runtime's threads may take it in between
// (a thread takes a pid too), so it tries a few times; it skips the test if
// it cannot be arranged. It returns the new leader and a second member of its
// group.
func reusePID(t *testing.T, pid int) (leader, member *exec.Cmd) {
	t.Helper()
	for range 5 {
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
			t.Skipf("pid %d is taken by another process or thread", pid)
		}
		if err := os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(strconv.Itoa(pid-1)), 0); err != nil {
			t.Skipf("cannot set the next pid: %v", err)
		}
		c := startLeader(t, 0)
		if c.Process.Pid != pid {
			c.Process.Kill()
			c.Wait()
			continue
		}
		member = startLeader(t, pid)
		for _, p := range []int{pid, member.Process.Pid} {
			if pg, err := unix.Getpgid(p); err != nil || pg != pid {
				t.Fatalf("process %d in group %d, %v; want %d", p, pg, err, pid)
			}
		}
		return c, member
	}
	t.Skipf("the kernel did not give pid %d to a new process in 5 tries", pid)
	return nil, nil
}

// dupFile duplicates f's descriptor (close-on-exec).
func dupFile(t *testing.T, f *os.File) *os.File {
	t.Helper()
	raw, err := f.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var nfd int
	var derr error
	if err := raw.Control(func(fd uintptr) {
		nfd, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		t.Fatal(err)
	}
	if derr != nil {
		t.Fatal(derr)
	}
	return os.NewFile(uintptr(nfd), f.Name())
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
