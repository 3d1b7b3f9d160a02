package supervise_test

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/supervise"
)

// pidnsHelperEnv makes TestPIDNamespaceHelper run: it is set only for the test
// binary that TestAdoptPID1SignalsNothing starts inside a new PID namespace.
const pidnsHelperEnv = "SM_TEST_PIDNS_HELPER"

// TestAdoptPID1SignalsNothing: a state file naming pid 1 (with pid 1's real
// start time) must not make the manager signal every process it may reach,
// which kill(-1, …) does. It runs the check in a new PID namespace, where
// pid 1 is a shell and the only other processes are the helper and its
// bystanders, so a failure kills nothing outside.
func TestAdoptPID1SignalsNothing(t *testing.T) {
	t.Parallel()
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("no unshare(1)")
	}
	if os.Geteuid() != 0 {
		t.Skip("a PID namespace needs root here")
	}
	// sh is pid 1 and runs the helper as its child (the echo after it keeps
	// sh from exec'ing it); when sh exits, the kernel kills what is left.
	cmd := exec.Command(unshare, "--pid", "--fork", "--mount-proc", "/bin/sh", "-c",
		`"$0" -test.run='^TestPIDNamespaceHelper$' -test.v; echo "helper exit $?"`, os.Args[0])
	cmd.Env = append(os.Environ(), pidnsHelperEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("unshare: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "helper exit 0") {
		t.Errorf("in a PID namespace:\n%s", out)
	}
}

// TestPIDNamespaceHelper is TestAdoptPID1SignalsNothing's half inside the
// namespace: it adopts pid 1 as a state file would make the manager do, stops
// it as a survivor that never came back is stopped, and checks that its own
// two bystanders (one in its process group, one leading its own) survive.
func TestPIDNamespaceHelper(t *testing.T) {
	if os.Getenv(pidnsHelperEnv) == "" {
		t.Skip("runs only inside TestAdoptPID1SignalsNothing's PID namespace")
	}
	if os.Getpid() == 1 {
		t.Fatal("the helper must not be pid 1 itself")
	}
	var bystanders []*exec.Cmd
	for _, own := range []bool{false, true} {
		bystanders = append(bystanders, testenv.Sleeper(t, own))
	}
	start, err := supervise.StartTime(1)
	if err != nil {
		t.Fatal(err)
	}
	p, err := supervise.Adopt(1, start)
	if !errors.Is(err, supervise.ErrNotLeader) {
		t.Errorf("Adopt(1) = %v; want ErrNotLeader", err)
	}
	if err == nil {
		// What the manager does with a survivor that never registers.
		p.Signal(syscall.SIGTERM)
		p.Signal(syscall.SIGKILL)
		p.(interface{ Release() }).Release()
		<-p.Exited()
	}
	// A signal is delivered soon after kill returns; a bystander it reached
	// is a zombie well within this.
	time.Sleep(300 * time.Millisecond)
	for _, b := range bystanders {
		if state, _, err := procStat(b.Process.Pid); err != nil || state == "Z" {
			t.Errorf("bystander %d was signalled: state %q, %v", b.Process.Pid, state, err)
		}
	}
}

// TestAdoptRefusesNonLeader: every cluster leads its own process group, so a
// recorded pid that does not (here a child of the test, in the test's group)
// is not a cluster, and is not adopted, signalled or stopped.
func TestAdoptRefusesNonLeader(t *testing.T) {
	t.Parallel()
	cmd := testenv.Sleeper(t, false)
	start, err := supervise.StartTime(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	p, err := supervise.Adopt(cmd.Process.Pid, start)
	if !errors.Is(err, supervise.ErrNotLeader) {
		t.Errorf("Adopt(non-leader %d) = %v, %v; want ErrNotLeader", cmd.Process.Pid, p, err)
	}
	if err == nil {
		p.(interface{ Release() }).Release()
		<-p.Exited()
	}
}
