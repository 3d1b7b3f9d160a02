package testenv

import (
	"os/exec"
	"syscall"
	"testing"
)

// Sleeper starts `sleep 60`, in a process group of its own if ownGroup: a
// process the code under test must leave alone, or may adopt. It is killed
// and reaped when the test ends.
func Sleeper(t testing.TB, ownGroup bool) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: ownGroup}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}
