package bench

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"time"
)

// errKilled means a child did not stop when asked and was killed.
var errKilled = errors.New("killed")

// child is a process the bench started, with its exit watched.
type child struct {
	name   string
	cmd    *exec.Cmd
	exited chan struct{}
	err    error // from Wait, once exited is closed
}

func startChild(name string, argv, env []string, logw io.Writer) (*child, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logw, logw
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, exited: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		close(c.exited)
	}()
	return c, nil
}

func (c *child) pid() int { return c.cmd.Process.Pid }

// why returns err, or that the process exited if it has: the likelier cause.
func (c *child) why(err error) error {
	select {
	case <-c.exited:
		return fmt.Errorf("%s exited (%v) (see its log)", c.name, c.err)
	default:
		return err
	}
}

// stop sends sig (nil: none, the process is already on its way out), waits up
// to grace for the exit, then kills. A non-zero exit is an error.
func (c *child) stop(sig os.Signal, grace time.Duration) error {
	if sig != nil {
		c.cmd.Process.Signal(sig)
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-c.exited:
	case <-t.C:
		c.cmd.Process.Kill()
		<-c.exited
		return fmt.Errorf("%s (pid %d) did not exit within %v of being asked to: %w", c.name, c.pid(), grace, errKilled)
	}
	if c.err != nil {
		var ee *exec.ExitError
		if errors.As(c.err, &ee) {
			return fmt.Errorf("%s (pid %d) exited with %s", c.name, c.pid(), ee.ProcessState)
		}
		return fmt.Errorf("%s (pid %d): %w", c.name, c.pid(), c.err)
	}
	return nil
}
