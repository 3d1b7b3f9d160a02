package supervise

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// ErrGone means a process to adopt is no longer the one that was recorded: it
// exited, or its pid now belongs to another process.
var ErrGone = errors.New("process is gone")

// StartTime returns the kernel's start time of pid (clock ticks since boot,
// field 22 of /proc/pid/stat). With the pid it names one process for good:
// a recycled pid has another start time.
func StartTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("pid %d: %w", pid, ErrGone)
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("pid %d: unreadable stat", pid)
	}
	fields := strings.Fields(s[i+1:])
	// fields[0] is the state (field 3); the start time is field 22.
	if len(fields) < 20 {
		return 0, fmt.Errorf("pid %d: short stat", pid)
	}
	if fields[0] == "Z" || fields[0] == "X" {
		return 0, fmt.Errorf("pid %d: %w (zombie)", pid, ErrGone)
	}
	return strconv.ParseUint(fields[19], 10, 64)
}

// Adopt watches a running process this process did not start (a cluster that
// survived a manager restart) through a pidfd, so its exit is known from the
// kernel and signals can never reach a recycled pid. start must be the
// StartTime recorded when it was spawned. A pid that is 1 or does not lead
// its own process group is no cluster: ErrNotLeader.
func Adopt(pid int, start uint64) (Process, error) {
	if pid <= 1 {
		return nil, fmt.Errorf("adopt pid %d: %w", pid, ErrNotLeader)
	}
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if errors.Is(err, unix.ESRCH) {
		return nil, fmt.Errorf("adopt pid %d: %w", pid, ErrGone)
	}
	if err != nil {
		return nil, fmt.Errorf("pidfd of %d: %w", pid, err)
	}
	leads := leadsGroup(pid)
	// Checked after opening the pidfd and asking for the group: if the start
	// time still matches now, the pidfd and the getpgid both spoke of the
	// recorded process.
	if got, err := StartTime(pid); err != nil || got != start {
		unix.Close(fd)
		return nil, fmt.Errorf("adopt pid %d: %w", pid, ErrGone)
	}
	if !leads {
		unix.Close(fd)
		return nil, fmt.Errorf("adopt pid %d: %w", pid, ErrNotLeader)
	}
	f := os.NewFile(uintptr(fd), "pidfd:"+strconv.Itoa(pid))
	p := &adopted{g: group{pid: pid, f: f}, exited: make(chan struct{})}
	go p.wait()
	return p, nil
}

type adopted struct {
	g      group // its pidfd, closed when the watch ends
	exited chan struct{}
	mu     sync.Mutex
	status string
}

// wait returns when the process exits (waitReadable on its pidfd).
func (p *adopted) wait() {
	defer close(p.exited)
	err := waitReadable(p.g.f)
	switch {
	case err == nil:
		// Not our child: the exit code belongs to its new parent. What the
		// leader left in its group dies with it, as with spawned ones.
		p.setStatus("exited (adopted; status unknown)")
		p.g.killLeftovers()
	default:
		p.setStatus("watch closed: " + err.Error())
	}
	p.g.f.Close()
}

// waitReadable blocks in the runtime's poller, holding no thread, until the
// pidfd f is readable, which it becomes when its process exits; or until f
// is closed (an error).
func waitReadable(f *os.File) error {
	raw, err := f.SyscallConn()
	if err != nil {
		return err
	}
	return raw.Read(func(fd uintptr) bool {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		return err == nil && n > 0
	})
}

func (p *adopted) setStatus(s string) {
	p.mu.Lock()
	p.status = s
	p.mu.Unlock()
}

func (p *adopted) PID() int                { return p.g.pid }
func (p *adopted) Exited() <-chan struct{} { return p.exited }

func (p *adopted) ExitStatus() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.status
}

// Signal signals the process and the group it leads, both through the pidfd
// (see group.signalGroup), so a recycled pid is never signalled.
func (p *adopted) Signal(sig syscall.Signal) error {
	select {
	case <-p.exited:
		return nil
	default:
	}
	return p.g.signal(sig)
}

// Release stops watching (the manager is exiting and leaves the process running).
func (p *adopted) Release() { p.g.f.Close() }
