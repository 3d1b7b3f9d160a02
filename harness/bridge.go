package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/sm-supervisor/sm/ipc"
)

// OpRegistered is the line the bridge writes to its child after each
// registration with the manager, carrying the REGISTER reply's payload.
const OpRegistered = "REGISTERED"

// childQueue bounds the lines waiting for the child to read its stdin.
const childQueue = 1024

// bridge runs a child bot and relays frames between it and the manager: each
// frame for the cluster becomes a line on the child's stdin, each line of the
// child's stdout a frame to the manager. The harness does the REGISTER itself,
// so the child never holds the token.
type bridge struct {
	cfg    Config
	log    *slog.Logger
	client *ipc.Client
	lines  chan []byte // for the child's stdin, newline-terminated

	mu sync.Mutex
	// pending holds the ids of the child's requests sent to the manager and
	// not answered yet: if the connection ends first, their answers never
	// come, and the bridge answers them itself (see registered).
	pending map[string]struct{}
}

// runBridge starts the child and relays until it exits; the child's exit status
// becomes an ExitError. ctx ending stops the child (SIGTERM, then SIGKILL after
// ShutdownTimeout) and returns nil.
func runBridge(ctx context.Context, cfg Config) error {
	b := &bridge{cfg: cfg, log: cfg.Logger, lines: make(chan []byte, childQueue), pending: make(map[string]struct{})}

	// Pipes as *os.File: exec hands them to the child without copying
	// goroutines, so Wait may run while the harness still reads and writes.
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("child stdin pipe: %w", err)
	}
	stdoutR, stdoutW, err := os.Pipe()
	if err != nil {
		stdinR.Close()
		stdinW.Close()
		return fmt.Errorf("child stdout pipe: %w", err)
	}
	cmd := exec.Command(cfg.Command[0], cfg.Command[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdinR, stdoutW, cfg.Stderr
	cmd.Env = childEnv(os.Environ())
	cmd.SysProcAttr = childProcAttr()
	// Only when Stderr is no *os.File does exec copy it; then a grandchild
	// holding it open must not keep Wait from returning.
	cmd.WaitDelay = flushTimeout
	err = cmd.Start()
	stdinR.Close()
	stdoutW.Close()
	if err != nil {
		stdinW.Close()
		stdoutR.Close()
		return fmt.Errorf("start %q: %w", cfg.Command[0], err)
	}
	b.log = b.log.With("child", cmd.Process.Pid)
	// Logs at info are public: the command line goes to DEBUG only.
	b.log.Info("child started")
	b.log.Debug("child command", "command", cfg.Command)
	b.client = newClient(cfg, b.log, b.toChild, b.registered)

	quit := make(chan struct{})
	var writer sync.WaitGroup
	writer.Go(func() { b.writeChild(stdinW, quit) })
	readDone := make(chan struct{})
	go func() { defer close(readDone); b.readChild(stdoutR) }()
	waitDone := make(chan error, 1)
	go func() { waitDone <- cmd.Wait() }()
	clientCtx, stopClient := context.WithCancel(ctx)
	clientDone := make(chan struct{})
	var clientErr error
	go func() { clientErr = b.client.Run(clientCtx); close(clientDone) }()

	result := b.supervise(ctx, cmd.Process, waitDone, clientDone, &clientErr)

	// The child is gone. Relay what it printed last, make sure the manager has
	// read it (say, a final QUIESCED), then take the plumbing down.
	select {
	case <-readDone:
	case <-time.After(flushTimeout):
		b.log.Warn("child's stdout is still open (a grandchild?): closing it")
	}
	stdoutR.Close()
	<-readDone
	if ctx.Err() == nil && b.client.Connected() {
		if err := flush(b.client); err != nil {
			b.log.Warn("the child's last frames may not have reached the manager", "err", err)
		}
	}
	stopClient()
	<-clientDone
	close(quit)
	stdinW.Close() // unblocks a write to a child that stopped reading
	writer.Wait()
	return result
}

// supervise waits for the child to exit, forwarding signals to it, and stops
// it when ctx ends or the manager refuses the registration (*clientErr, valid
// once clientDone is closed). It returns Run's result.
func (b *bridge) supervise(ctx context.Context, child *os.Process, waitDone <-chan error, clientDone <-chan struct{}, clientErr *error) error {
	var (
		stopping error // why the harness stopped the child, if it did
		kill     <-chan time.Time
		ctxDone  = ctx.Done()
	)
	stop := func(why error) {
		if stopping != nil {
			return
		}
		stopping = why
		b.log.Info("stopping child", "why", why)
		if err := child.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
			b.log.Warn("signal child", "err", err)
		}
		kill = time.After(b.cfg.ShutdownTimeout)
	}
	for {
		select {
		case err := <-waitDone:
			b.log.Info("child exited", "status", err)
			switch {
			case stopping == nil:
				return childExit(err)
			case errors.Is(stopping, context.Canceled):
				return nil // the caller asked for the stop: a clean one
			default:
				return stopping
			}
		case sig := <-b.cfg.Signals:
			b.log.Info("forwarding signal to child", "signal", sig.String())
			if err := child.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
				b.log.Warn("signal child", "err", err)
			}
		case <-ctxDone:
			ctxDone = nil
			if orphaned(ctx) {
				// No grace: another host may start this cluster soon.
				stopping = orphanError(b.cfg.Env.OrphanTimeout)
				b.log.Error("orphaned: killing child", "why", stopping)
				if err := child.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
					b.log.Warn("kill child", "err", err)
				}
				continue
			}
			stop(context.Canceled)
		case <-clientDone:
			clientDone = nil
			if *clientErr != nil { // refused; nil means ctx ended, handled above
				b.log.Error("registration refused: stopping", "err", *clientErr)
				stop(*clientErr)
			}
		case <-kill:
			kill = nil
			b.log.Warn("child ignored SIGTERM: killing it", "timeout", b.cfg.ShutdownTimeout)
			if err := child.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
				b.log.Warn("kill child", "err", err)
			}
		}
	}
}

// childExit turns the child's Wait error into the harness's result: nil for
// status 0, an ExitError with its code, or 128+n for death by signal n, as a
// shell reports it.
func childExit(err error) error {
	if err == nil {
		return nil
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return fmt.Errorf("wait for child: %w", err)
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return &ExitError{Code: signalExitCode(ws.Signal()), Reason: "child killed by " + ws.Signal().String()}
	}
	return &ExitError{Code: ee.ExitCode(), Reason: "child exited"}
}

// registered tells the child about each registration with the manager, the
// whole REGISTER reply payload included (resume state, identify gate). First
// it answers the child's requests still waiting for the previous connection
// with unavailable: their answers were lost with it (an IDENTIFY may have
// waited minutes for its slot), and the child asks again after REGISTERED.
//
// A request the child sends in the instant between the new connection's
// registration and this call is answered so too, though the manager has it;
// the manager's own answer then reaches the child as a REPLY to an id it has
// already seen answered, which a bot drops.
func (b *bridge) registered(_ *ipc.Client, reply *ipc.Frame) {
	logRegistration(b.log, b.cfg.Env, reply)
	b.mu.Lock()
	lost := slices.Sorted(maps.Keys(b.pending))
	clear(b.pending)
	b.mu.Unlock()
	if len(lost) > 0 {
		b.log.Warn("the connection to the manager ended before it answered the child's requests: answering them unavailable", "ids", lost)
	}
	for _, id := range lost {
		b.enqueue(ipc.ReplyError(id, ipc.Errorf(ipc.CodeUnavailable, "the connection to the manager was lost before it answered: ask again")))
	}
	b.enqueue(&ipc.Frame{Op: OpRegistered, Payload: reply.Payload})
}

// toChild is the client's handler: every frame from the manager goes to the
// child, payload bytes unchanged, including the REPLYs to the child's own
// requests (ipc.Client hands over every REPLY that is not to a request of its
// own, and the bridge makes none). It runs on the client's read goroutine, so
// a child that stops reading gets busy replies rather than stalling the socket.
func (b *bridge) toChild(c *ipc.Client, f *ipc.Frame) {
	if f.Op == ipc.OpReply {
		b.mu.Lock()
		delete(b.pending, f.ID)
		b.mu.Unlock()
	}
	if b.enqueue(f) {
		return
	}
	if f.ID != "" && f.Op != ipc.OpReply {
		if err := c.Reply(f.ID, nil, ipc.Errorf(ipc.CodeBusy, "cluster %d is not reading its input", b.cfg.Env.Cluster)); err != nil {
			b.log.Warn("reply not sent", "op", f.Op, "id", f.ID, "err", err)
		}
	}
}

// enqueue queues f for the child's stdin, reporting false if the queue is full.
func (b *bridge) enqueue(f *ipc.Frame) bool {
	line := append(ipc.AppendFrame(nil, f), '\n')
	select {
	case b.lines <- line:
		return true
	default:
		b.log.Error("child is not reading its input: dropped a frame", "op", f.Op, "id", f.ID)
		return false
	}
}

// writeChild feeds queued lines to the child's stdin until quit. After a write
// fails (the child closed its stdin or exited) it keeps draining the queue.
func (b *bridge) writeChild(w io.Writer, quit <-chan struct{}) {
	broken := false
	for {
		select {
		case line := <-b.lines:
			if broken {
				continue
			}
			if _, err := w.Write(line); err != nil {
				if !errors.Is(err, os.ErrClosed) { // closed by runBridge: we are done
					b.log.Warn("child's stdin is closed", "err", err)
				}
				broken = true
			}
		case <-quit:
			return
		}
	}
}

// readChild relays the child's stdout, one frame per line, until it closes.
func (b *bridge) readChild(r io.Reader) {
	fr := ipc.NewReader(r, b.cfg.MaxFrameBytes)
	for {
		line, err := fr.ReadFrame()
		if errors.Is(err, ipc.ErrFrameTooLarge) {
			b.log.Warn("dropped a line from the child over the frame limit", "max_frame_bytes", b.cfg.MaxFrameBytes)
			continue
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, os.ErrClosed) {
				b.log.Warn("reading the child's stdout", "err", err)
			}
			return
		}
		f, err := ipc.Decode(line)
		if err != nil {
			b.log.Warn("dropped a line from the child that is not a frame", "err", err, "line", clip(line, 200))
			continue
		}
		b.fromChild(f)
	}
}

// fromChild sends one of the child's frames to the manager, unchanged (the
// structural fields, such as resume on HEARTBEAT and QUIESCED, included). A
// request that cannot be sent is answered to the child at once, so it never
// waits in vain.
func (b *bridge) fromChild(f *ipc.Frame) {
	if f.Op == ipc.OpRegister {
		b.log.Warn("dropped the child's REGISTER: the harness registers for it")
		return
	}
	request := f.ID != "" && f.Op != ipc.OpReply
	if request {
		// Before sending: the answer may come before Send returns.
		b.mu.Lock()
		b.pending[f.ID] = struct{}{}
		b.mu.Unlock()
	}
	err := b.client.Send(f)
	if err == nil {
		return
	}
	if request {
		b.mu.Lock()
		delete(b.pending, f.ID)
		b.mu.Unlock()
	}
	if f.ID == "" || f.Op == ipc.OpReply {
		level := slog.LevelWarn
		if errors.Is(err, ipc.ErrUnavailable) && f.Op == ipc.OpHeartbeat {
			level = slog.LevelDebug // routine while the manager restarts
		}
		b.log.Log(context.Background(), level, "could not send the child's frame", "op", f.Op, "id", f.ID, "err", err)
		return
	}
	b.log.Warn("could not send the child's request: answering it", "op", f.Op, "id", f.ID, "err", err)
	code := ipc.CodeUnavailable
	if errors.Is(err, ipc.ErrFrameTooLarge) {
		code = ipc.CodeFrameTooLarge
	}
	b.enqueue(ipc.ReplyError(f.ID, ipc.Errorf(code, "not sent to the manager: %v", err)))
}

// clip shortens a dropped line for the log.
func clip(b []byte, n int) string {
	if len(b) <= n {
		return string(b)
	}
	return string(b[:n]) + "…"
}
