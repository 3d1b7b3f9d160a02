package supervise

import (
	"errors"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// ErrNotLeader means a process is not the leader of its own process group, or
// is pid 1: not a cluster, which Spawn always starts as a group leader. Such a
// process is never adopted, and its "group" is never signalled: kill(-1, …)
// reaches every process the manager may signal, and kill(-pid, …) for a pid
// that leads no group reaches whatever group now has that id.
var ErrNotLeader = errors.New("process does not lead its own process group")

// leadsGroup reports whether pid is more than 1 and leads its own process
// group (getpgid(pid) == pid). It names pid by number, so it speaks of the
// process that holds pid now; callers that did not start it check with its
// pidfd afterwards that it still does.
func leadsGroup(pid int) bool {
	if pid <= 1 {
		return false
	}
	pg, err := unix.Getpgid(pid)
	return err == nil && pg == pid
}

// group is a process that should lead its own process group, held through a
// pidfd where the kernel has them (f; nil before Linux 5.3), so that a signal
// can never reach a process that merely reuses its pid.
type group struct {
	pid int
	f   *os.File
}

// signal sends sig to the process and, if it still leads its group, to the
// whole group; a process that left its group gets sig alone. A process
// already gone is not an error.
func (g group) signal(sig syscall.Signal) error {
	if g.pid <= 1 {
		return fmt.Errorf("signal %v to pid %d: %w", sig, g.pid, ErrNotLeader)
	}
	var err error
	if leadsGroup(g.pid) {
		// If the pid was recycled since, the group is still named by the
		// pidfd's process (or, by number, checked again): see signalGroup.
		err = g.signalGroup(sig)
	} else {
		err = g.signalProcess(sig)
	}
	if err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signal %v to %d: %w", sig, g.pid, err)
	}
	return nil
}

// killLeftovers SIGKILLs what is left in the group once its leader exited:
// whatever the leader started dies with it, as no orphan may outlive its
// cluster.
func (g group) killLeftovers() {
	if g.pid > 1 {
		g.signalGroup(syscall.SIGKILL)
	}
}

// signalGroup signals the process group that the process leads.
//
// With a pidfd on Linux 6.9 or later, the kernel names the group by the
// pidfd's process itself (PIDFD_SIGNAL_PROCESS_GROUP): it reaches the
// processes whose group id is that process, even after the leader has been
// reaped, and nothing if the process leads no group. No recycled pid and no
// other group can be reached, so there is no window.
//
// Before 6.9 the group is named by number, kill(-pid): only if the process
// leads its group (getpgid) and, checked after that through the pidfd, is
// still not reaped, so the getpgid spoke of it and not of a process that
// reuses its pid. What is left is the instant between that check and the
// kill: the leader would have to be reaped there, by its parent, and its pid
// given to a new process that has made itself a group leader, which takes the
// kernel's pid counter wrapping round in that instant. A child of this process
// (Spawn) is reaped only by this process after its last signal, so for it
// there is no window either.
func (g group) signalGroup(sig syscall.Signal) error {
	if g.f != nil {
		err := g.pidfdSignal(sig, unix.PIDFD_SIGNAL_PROCESS_GROUP)
		if !errors.Is(err, syscall.EINVAL) {
			return err
		}
		// EINVAL: a kernel before 6.9, which has no such flag.
	}
	if !leadsGroup(g.pid) {
		return syscall.ESRCH
	}
	if g.f != nil {
		if err := g.pidfdSignal(0, 0); err != nil {
			return err // reaped since: the getpgid may have spoken of another
		}
	}
	return syscall.Kill(-g.pid, sig)
}

// signalProcess signals the process alone.
func (g group) signalProcess(sig syscall.Signal) error {
	if g.f == nil {
		return syscall.Kill(g.pid, sig)
	}
	return g.pidfdSignal(sig, 0)
}

// pidfdSignal is pidfd_send_signal on g.f. A closed pidfd (the process exited
// and its watch ended, or it was released) is ESRCH: the pid may be another's.
func (g group) pidfdSignal(sig syscall.Signal, flags int) error {
	raw, err := g.f.SyscallConn()
	if err != nil {
		return syscall.ESRCH
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = unix.PidfdSendSignal(int(fd), sig, nil, flags)
	}); err != nil {
		return syscall.ESRCH
	}
	return serr
}
