package harness

import "syscall"

// childProcAttr keeps an exec child in the harness's process group (so the
// manager's signal to the group reaches both) and has the kernel SIGKILL it
// if the harness dies first, so a harness killed alone leaves no orphan bot
// holding gateway sessions. (The signal follows the thread that forked; Go
// ends a thread only when a goroutine locked to it exits, which never happens
// here.)
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
