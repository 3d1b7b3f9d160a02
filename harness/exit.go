package harness

import (
	"fmt"
	"os"
	"syscall"
)

// ExitError is returned by Run when the process should exit with a particular
// code: an injected crash, --exit-on-start, an exec child's own exit status.
type ExitError struct {
	Code   int
	Reason string
}

// Error says which code and why.
func (e *ExitError) Error() string { return fmt.Sprintf("exit status %d: %s", e.Code, e.Reason) }

// signalExitCode is the status a shell reports for a process killed by sig.
func signalExitCode(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return 128 + int(s)
	}
	return 1
}
