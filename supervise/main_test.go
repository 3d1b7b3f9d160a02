package supervise_test

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sm-supervisor/sm/supervise"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// procStat reads the state (field 3) and process group (field 5) of pid from
// /proc/pid/stat.
func procStat(pid int) (state string, pgrp int, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", 0, err
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 3 {
		return "", 0, errors.New("short stat: " + s)
	}
	pgrp, err = strconv.Atoi(fields[2])
	return fields[0], pgrp, err
}

// eventually polls cond every few milliseconds until it holds or d passes.
func eventually(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// gone reports whether the process recorded as pid with start time start has
// exited: no such pid, a zombie (nobody may reap orphans here), or another
// process that has recycled the pid.
func gone(pid int, start uint64) bool {
	got, err := supervise.StartTime(pid)
	return err != nil || got != start
}

// readPID waits for a shell script to write a pid to path.
func readPID(t *testing.T, path string) int {
	t.Helper()
	var pid int
	ok := eventually(10*time.Second, func() bool {
		b, err := os.ReadFile(path)
		if err != nil || !strings.HasSuffix(string(b), "\n") {
			return false
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil
	})
	if !ok {
		t.Fatalf("no pid written to %s", path)
	}
	return pid
}

// waitExited fails the test unless p's exit is reported within d.
func waitExited(t *testing.T, p supervise.Process, d time.Duration) {
	t.Helper()
	select {
	case <-p.Exited():
	case <-time.After(d):
		t.Fatalf("pid %d: exit not reported within %v", p.PID(), d)
	}
}

func exited(p supervise.Process) bool {
	select {
	case <-p.Exited():
		return true
	default:
		return false
	}
}

// unusedPID is a pid no process can have: one past the kernel's pid_max.
func unusedPID(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return n + 1
}

// sigkill kills pid's whole group; for cleanups, so ESRCH is fine.
func sigkill(pid int) { syscall.Kill(-pid, syscall.SIGKILL) }
