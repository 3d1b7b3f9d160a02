package bench

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// A fleet's cluster processes, as /proc shows them. Each scenario's manager
// runs on a socket in the scenario's own temp dir and hands it to its
// clusters as SM_SOCKET, so a process whose environment names that socket is
// one of this fleet's and no one else's: the scenarios find, check and, as a
// last resort, kill their cluster processes by it.

// fleetProc is a cluster process of a fleet, as /proc shows it.
type fleetProc struct {
	PID   int  `json:"pid"`
	PPID  int  `json:"ppid"`
	State byte `json:"-"`
}

func (p fleetProc) String() string {
	return fmt.Sprintf("pid %d (ppid %d, state %c)", p.PID, p.PPID, p.State)
}

// scanFleetProcs lists the processes whose environment names socket as
// SM_SOCKET, the cluster processes of the manager on that socket, and the
// zombie children of managerPID (a zombie's environment can no longer be
// read; -1 for none).
func scanFleetProcs(socket string, managerPID int) []fleetProc {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []fleetProc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		st, ok := readProcStat(pid)
		if !ok {
			continue
		}
		if st.State == 'Z' && st.PPID == managerPID && managerPID > 0 {
			out = append(out, st)
			continue
		}
		if onSocket(pid, socket) {
			out = append(out, st)
		}
	}
	return out
}

// onSocket reports whether pid's environment names socket as its SM_SOCKET.
func onSocket(pid int, socket string) bool {
	env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	return err == nil && bytes.Contains(append([]byte{0}, env...), []byte("\x00SM_SOCKET="+socket+"\x00"))
}

// readProcStat reads a process's state and parent from /proc/<pid>/stat.
func readProcStat(pid int) (fleetProc, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return fleetProc{}, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return fleetProc{}, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 || len(f[0]) != 1 {
		return fleetProc{}, false
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return fleetProc{}, false
	}
	return fleetProc{PID: pid, PPID: ppid, State: f[0][0]}, true
}

// ourCluster reports whether pid is a live cluster process of the fleet on
// socket: the check before any signal, so a reused pid is never hit.
func ourCluster(pid int, socket string) bool {
	if pid <= 0 {
		return false
	}
	st, ok := readProcStat(pid)
	return ok && st.State != 'Z' && onSocket(pid, socket)
}

// procAlive reports whether pid names a live process (not a zombie).
func procAlive(pid int) bool {
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		return false
	}
	st, ok := readProcStat(pid)
	return ok && st.State != 'Z'
}

// leftovers lists the live cluster processes of the fleet on socket.
func leftovers(socket string) []int {
	var pids []int
	for _, p := range scanFleetProcs(socket, -1) {
		if procAlive(p.PID) {
			pids = append(pids, p.PID)
		}
	}
	return pids
}

// reapLeftovers SIGKILLs what leftovers finds and says how many there were: a
// scenario's safety net, and the check that a stopped manager left nothing.
func reapLeftovers(socket string) int {
	pids := leftovers(socket)
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGKILL)
	}
	return len(pids)
}
