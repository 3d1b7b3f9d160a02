// Package supervise is the supervision of cluster processes: what to do about
// them, decided by one pure state machine per cluster (Cluster) and the
// restart policy, and the processes themselves, started in their own process
// groups and stopped (SIGTERM, grace, SIGKILL, confirmed exit).
package supervise

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Spec is what to run: argv, extra environment (KEY=VALUE) and working directory.
type Spec struct {
	Argv []string
	Env  []string
	Dir  string
}

// Process is a started cluster process.
type Process interface {
	// PID is the process id, which is also its process group id.
	PID() int
	// Signal sends sig to the process and the process group it leads; never
	// to a group it does not lead, and never to pid 1's.
	Signal(sig syscall.Signal) error
	// Exited is closed once the kernel has reported the process's exit.
	Exited() <-chan struct{}
	// ExitStatus describes how it exited; valid after Exited is closed.
	ExitStatus() string
}

// Spawner starts processes. The manager takes one as a field so tests and
// benchmarks can wrap it.
type Spawner interface {
	Spawn(spec Spec) (Process, error)
}

// ExecSpawner starts real processes with os/exec, each the leader of a new
// process group so a stop reaches everything it started, and reaps each one.
type ExecSpawner struct {
	// Stdout and Stderr receive the children's output; nil means the manager's own.
	Stdout, Stderr io.Writer
}

// Spawn starts spec and a goroutine that waits for it.
func (s ExecSpawner) Spawn(spec Spec) (Process, error) {
	if len(spec.Argv) == 0 {
		return nil, errors.New("spawn: empty command")
	}
	cmd := exec.Command(spec.Argv[0], spec.Argv[1:]...)
	cmd.Env = append(os.Environ(), spec.Env...)
	cmd.Dir = spec.Dir
	cmd.Stdout, cmd.Stderr = s.Stdout, s.Stderr
	if cmd.Stdout == nil {
		cmd.Stdout = os.Stdout
	}
	if cmd.Stderr == nil {
		cmd.Stderr = os.Stderr
	}
	// No Pdeathsig: clusters must outlive a manager restart and are re-adopted.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// Output to a writer that is not a file is copied through pipes, which Wait
	// reads to EOF. The group is killed before that, so only a process that left
	// the group (setsid) can hold them open; it must not hold up Exited.
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		return nil, &SpawnError{Command: spec.Argv[0], Err: err}
	}
	pid := cmd.Process.Pid
	p := &execProcess{cmd: cmd, g: group{pid: pid}, exited: make(chan struct{})}
	// Race-free: only this process can reap its child, so the pid cannot
	// name another process before Wait. Where pidfds are missing (Linux
	// before 5.3) f stays nil and the child is named by number.
	if fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK); err == nil {
		p.g.f = os.NewFile(uintptr(fd), "pidfd:"+strconv.Itoa(pid))
	}
	go p.wait()
	return p, nil
}

// SpawnError is a command that could not be started. Error names the
// command, for the manager's log and the socket's STATUS; Public says the
// same with no path, argument or environment, for the public status feed.
type SpawnError struct {
	Command string // argv[0]
	Err     error  // from os/exec: it names the command's path, or the directory's
}

// Error is "spawn <command>: <os/exec's error>", paths and all.
func (e *SpawnError) Error() string { return "spawn " + e.Command + ": " + e.Err.Error() }

// Unwrap is Err, so errors.Is(err, fs.ErrNotExist) and the like work.
func (e *SpawnError) Unwrap() error { return e.Err }

// Public is "spawn failed", with the system's reason when there is one
// ("spawn failed: no such file or directory").
func (e *SpawnError) Public() string {
	var errno syscall.Errno
	if errors.As(e.Err, &errno) {
		return "spawn failed: " + errno.Error()
	}
	return "spawn failed"
}

type execProcess struct {
	cmd    *exec.Cmd
	g      group // its pidfd, closed once it is reaped
	exited chan struct{}
	status string
}

func (p *execProcess) wait() {
	// Whatever the leader left behind in its group dies with it: no orphans.
	// The group is killed when the leader exits but before it is reaped (and
	// before Wait, which waits for output pipes the group may hold): while it
	// is a zombie its pid, the group's id, cannot be reused.
	awaitExit(p.g)
	p.g.killLeftovers()
	err := p.cmd.Wait()
	if p.cmd.ProcessState != nil {
		// Not err, which is exec.ErrWaitDelay for a clean exit whose output
		// pipes were held open.
		p.status = p.cmd.ProcessState.String()
	} else {
		p.status = err.Error()
	}
	if p.g.f != nil {
		p.g.f.Close()
	}
	close(p.exited)
}

// awaitExit returns once child g has exited, without reaping it. It waits on
// its pidfd in the runtime's poller, so a fleet of children holds no thread
// each; where pidfds are missing (Linux before 5.3) it blocks a thread in
// waitid(WNOWAIT) instead.
func awaitExit(g group) {
	if g.f != nil && waitReadable(g.f) == nil {
		return
	}
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, g.pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err != syscall.EINTR {
			return
		}
	}
}

func (p *execProcess) PID() int                { return p.g.pid }
func (p *execProcess) Exited() <-chan struct{} { return p.exited }
func (p *execProcess) ExitStatus() string      { return p.status }

// Signal signals the process and the group it leads (see group.signal): a
// child that has left its group gets sig alone.
func (p *execProcess) Signal(sig syscall.Signal) error {
	select {
	case <-p.exited:
		return nil
	default:
	}
	return p.g.signal(sig)
}

// Stop ends p: SIGTERM to its group, then SIGKILL after grace, and returns once
// the kernel confirms the exit or ctx is done.
func Stop(ctx context.Context, p Process, grace time.Duration) error {
	if err := p.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.Exited():
		return nil
	case <-t.C:
	case <-ctx.Done():
	}
	if err := p.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	select {
	case <-p.Exited():
		return nil
	case <-ctx.Done():
		return fmt.Errorf("stop pid %d: %w", p.PID(), ctx.Err())
	}
}

// ResolveCommand makes argv[0] absolute: a bare name is looked up first beside
// the manager's own executable (so a release directory works as a unit), then
// in PATH; a relative path is taken from base.
func ResolveCommand(argv []string, base string) ([]string, error) {
	if len(argv) == 0 {
		return nil, errors.New("empty command")
	}
	out := append([]string(nil), argv...)
	name := argv[0]
	switch {
	case filepath.IsAbs(name):
	case filepath.Base(name) != name:
		out[0] = filepath.Join(base, name)
	default:
		if self, err := os.Executable(); err == nil {
			cand := filepath.Join(filepath.Dir(self), name)
			if st, err := os.Stat(cand); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
				out[0] = cand
				return out, nil
			}
		}
		path, err := exec.LookPath(name)
		if err != nil {
			return nil, fmt.Errorf("command %q: %w", name, err)
		}
		out[0] = path
	}
	return out, nil
}

// CheckExecutable says why path cannot be run as a command, or nil: it must
// be a regular file this process may execute (its effective ids, as execve
// judges them).
func CheckExecutable(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", path)
	}
	if err := unix.Faccessat(unix.AT_FDCWD, path, unix.X_OK, unix.AT_EACCESS); err != nil {
		return fmt.Errorf("%s is not executable: %w", path, err)
	}
	return nil
}
