package manager

import (
	"encoding/json"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/recycle"
)

// The heartbeat's optional figures: numbers are read, anything else is
// Unknown, and the rest of the payload is ignored.
func TestBeatFigures(t *testing.T) {
	for _, tc := range []struct {
		beat string
		heap int64
		lag  time.Duration
	}{
		{`{"heap_bytes":1048576,"loop_lag_ms":12.5,"guilds":3}`, 1 << 20, 12500 * time.Microsecond},
		{`{"heap_bytes":2e9}`, 2e9, recycle.Unknown},
		{`{"loop_lag_ms":0}`, recycle.Unknown, 0},
		{`{"heap_bytes":"1","loop_lag_ms":null}`, recycle.Unknown, recycle.Unknown},
		{`{"heap_bytes":-5,"loop_lag_ms":-1}`, recycle.Unknown, recycle.Unknown},
		{`[1,2]`, recycle.Unknown, recycle.Unknown},
		{`{"heap_bytes":`, recycle.Unknown, recycle.Unknown},
		{``, recycle.Unknown, recycle.Unknown},
	} {
		heap, lag := beatFigures(json.RawMessage(tc.beat))
		if heap != tc.heap || lag != tc.lag {
			t.Errorf("beatFigures(%s) = %d, %v; want %d, %v", tc.beat, heap, lag, tc.heap, tc.lag)
		}
	}
}

// A cluster's RSS counts its process group: a bridge's child, a bot's
// workers. A real process group here: a shell leading it, a sleep in it.
func TestGroupRSS(t *testing.T) {
	if _, err := os.Stat("/proc/self/statm"); err != nil {
		t.Skip("no /proc here")
	}
	cmd := exec.Command("/bin/sh", "-c", "sleep 30 & wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() { syscall.Kill(-pid, syscall.SIGKILL); cmd.Wait() })
	own, ok := processRSS(pid)
	if !ok || own <= 0 {
		t.Fatalf("processRSS(%d) = %d, %v", pid, own, ok)
	}
	deadline := time.Now().Add(10 * time.Second)
	for groupRSS(map[int]bool{pid: true})[pid] <= 0 {
		if time.Now().After(deadline) {
			t.Fatal("the group's child never counted")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := groupRSS(map[int]bool{os.Getpid(): true})[pid]; n != 0 {
		t.Errorf("a group not asked for counted %d", n)
	}
	s := sampleProcesses([]recycleTarget{{cluster: 2, seq: 9, pid: pid, beat: json.RawMessage(`{"heap_bytes":7}`)}}, time.Now())
	if len(s) != 1 || s[0].RSS <= own || s[0].Heap != 7 || s[0].Lag != recycle.Unknown || s[0].Proc != 9 {
		t.Errorf("sample %+v (own RSS %d)", s, own)
	}
	if s := sampleProcesses([]recycleTarget{{cluster: 0, pid: 1 << 30}}, time.Now()); s[0].RSS != recycle.Unknown {
		t.Errorf("a gone process's RSS: %+v", s[0])
	}
}
