// Package harnesstest is a stand-in for sm-manager's end of the socket, for
// tests of cluster processes: it listens on a Unix socket in a test's temporary
// directory, answers REGISTER, answers what the manager itself would answer,
// records every frame, and lets the test send frames and drop connections.
package harnesstest

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/discord"
	"github.com/sm-supervisor/sm/ipc"
)

// Options shape a Manager.
type Options struct {
	// Register answers each REGISTER; a reply with an error refuses it and
	// closes the connection. Nil means AcceptingWith(HeartbeatIntervalMS,
	// ...): the default reply, with "identify" if Identify is set and
	// "resume" if Resume is.
	Register func(reg *ipc.Frame) *ipc.Frame
	// HeartbeatIntervalMS goes in the default REGISTER reply; 0 leaves it out.
	HeartbeatIntervalMS int

	// Identify makes the fake a manager with an identify gate: the default
	// REGISTER reply says so (GateInfo), and Identify answers each IDENTIFY
	// request with the frame it returns (Grant, Deny), or not at all if it
	// returns nil, leaving the answer to the test (Conn.SendFrame). Either
	// way the IDENTIFY is recorded like every frame. Identify runs on the
	// connection's read goroutine: it must not block, and may run for two
	// connections at once. Without it an IDENTIFY gets unknown_target, as
	// from a manager older than the gate.
	Identify func(f *ipc.Frame) *ipc.Frame
	// IdentifyCancel answers each IDENTIFY_CANCEL as Identify does
	// IDENTIFY (nil: the test answers); without it an IDENTIFY_CANCEL with
	// an id gets unknown_target, as from a manager older than the op.
	IdentifyCancel func(f *ipc.Frame) *ipc.Frame
	// Resume goes in the default REGISTER reply as "resume", on every
	// registration.
	Resume []discord.ResumeState
}

// GateInfo is the "identify" object of the default REGISTER reply when
// Options.Identify is set.
var GateInfo = map[string]any{"gate": true, "spacing_ms": 5000, "max_concurrency": 1}

// Manual is an Options.Identify that answers nothing: the test answers each
// IDENTIFY itself.
func Manual(*ipc.Frame) *ipc.Frame { return nil }

// Grant is an Options.Identify that grants every IDENTIFY at once, and the
// grant a test sends: {"granted":true,"shard":n,"bucket":0}.
func Grant(f *ipc.Frame) *ipc.Frame {
	shard := -1
	if f.Shard != nil {
		shard = *f.Shard
	}
	return ipc.Reply(f.ID, json.RawMessage(fmt.Sprintf(`{"granted":true,"shard":%d,"bucket":0}`, shard)))
}

// Deny is the REPLY refusing f with code (forbidden, timeout, ...).
func Deny(f *ipc.Frame, code string) *ipc.Frame {
	return ipc.ReplyError(f.ID, ipc.Errorf(code, "denied by harnesstest"))
}

// Manager is a fake manager listening on Path.
type Manager struct {
	// Path is the socket; give it to the cluster process as SM_SOCKET.
	Path string

	t      testing.TB
	opts   Options
	ln     net.Listener
	conns  chan *Conn
	closed chan struct{}
	wg     sync.WaitGroup

	mu  sync.Mutex
	all []*Conn
}

// Start listens on a new socket and serves it until the test ends.
func Start(t testing.TB, opts Options) *Manager {
	t.Helper()
	dir := t.TempDir()
	// sun_path holds 108 bytes; long test names make long temp dirs.
	if len(dir) > 90 {
		var err error
		if dir, err = os.MkdirTemp("", "smh"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
	}
	path := filepath.Join(dir, "m.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatalf("harnesstest: listen: %v", err)
	}
	if opts.Register == nil {
		extra := map[string]any{}
		if opts.Identify != nil {
			extra["identify"] = GateInfo
		}
		if len(opts.Resume) > 0 {
			extra["resume"] = opts.Resume
		}
		opts.Register = AcceptingWith(opts.HeartbeatIntervalMS, extra)
	}
	m := &Manager{Path: path, t: t, opts: opts, ln: ln, conns: make(chan *Conn, 16), closed: make(chan struct{})}
	m.wg.Go(m.accept)
	t.Cleanup(m.Close)
	return m
}

// AcceptingWith returns a Register func that accepts every REGISTER with the
// payload a real manager sends (shard fields left out: the fake knows no
// topology), naming hbMS as the heartbeat interval unless it is 0, and with
// extra fields in the reply payload, such as "identify" and "resume".
func AcceptingWith(hbMS int, extra map[string]any) func(reg *ipc.Frame) *ipc.Frame {
	return func(reg *ipc.Frame) *ipc.Frame {
		p := map[string]any{"active": false}
		maps.Copy(p, extra)
		if reg.Cluster != nil {
			p["cluster"] = *reg.Cluster
		}
		if reg.Generation != nil {
			p["generation"] = *reg.Generation
		}
		if hbMS > 0 {
			p["heartbeat_interval_ms"] = hbMS
		}
		b, _ := json.Marshal(p)
		return ipc.Reply(reg.ID, b)
	}
}

// Refusing returns a Register func that refuses every REGISTER with code.
func Refusing(code string) func(reg *ipc.Frame) *ipc.Frame {
	return func(reg *ipc.Frame) *ipc.Frame {
		return ipc.ReplyError(reg.ID, ipc.Errorf(code, "refused by harnesstest"))
	}
}

func (m *Manager) accept() {
	for {
		nc, err := m.ln.Accept()
		if err != nil {
			return
		}
		c := &Conn{t: m.t, conn: ipc.NewConn(nc, ipc.Options{}), frames: make(chan *ipc.Frame, 4096), done: make(chan struct{})}
		m.mu.Lock()
		m.all = append(m.all, c)
		m.mu.Unlock()
		m.wg.Go(func() { m.serve(c) })
	}
}

// serve answers REGISTER, then records frames until the connection ends.
func (m *Manager) serve(c *Conn) {
	defer close(c.done)
	defer c.conn.Abort(nil)
	line, err := c.conn.ReadFrame()
	if err != nil {
		return
	}
	reg, err := ipc.Decode(line)
	if err != nil || reg.Op != ipc.OpRegister {
		c.conn.SendFrame(ipc.ReplyError("", ipc.Errorf(ipc.CodeNotRegistered, "first frame must be REGISTER")))
		c.conn.Close()
		<-c.conn.Done()
		return
	}
	reply := m.opts.Register(reg)
	c.conn.SendFrame(reply)
	if reply.Error != nil {
		c.conn.Close()
		<-c.conn.Done()
		return
	}
	c.Register = reg
	select {
	case m.conns <- c:
	case <-m.closed:
		return
	}
	for {
		line, err := c.conn.ReadFrame()
		if err != nil {
			return
		}
		f, err := ipc.Decode(line)
		if err != nil {
			c.conn.SendFrame(ipc.ReplyError("", ipc.Errorf(ipc.CodeBadFrame, "%v", err)))
			continue
		}
		switch {
		case f.Op == ipc.OpIdentify && m.opts.Identify != nil:
			if r := m.opts.Identify(f); r != nil {
				c.conn.SendFrame(r)
			}
		case f.Op == ipc.OpIdentifyCancel && m.opts.IdentifyCancel != nil:
			if r := m.opts.IdentifyCancel(f); r != nil {
				c.conn.SendFrame(r)
			}
		case f.ID != "" && f.Op != ipc.OpReply && f.Target == "":
			// A request to no target is the manager's to answer, as the real one does.
			c.conn.SendFrame(ipc.ReplyError(f.ID, ipc.Errorf(ipc.CodeUnknownTarget, "op has no target")))
		}
		select {
		case c.frames <- f:
		case <-m.closed:
			return
		}
	}
}

// Accept returns the next connection whose REGISTER was accepted, failing the
// test if none comes within timeout.
func (m *Manager) Accept(timeout time.Duration) *Conn {
	m.t.Helper()
	select {
	case c := <-m.conns:
		return c
	case <-time.After(timeout):
		m.t.Fatalf("harnesstest: no cluster registered within %v", timeout)
		return nil
	}
}

// Close stops listening, drops every connection and waits for the fake's
// goroutines. It runs at the end of the test on its own.
func (m *Manager) Close() {
	select {
	case <-m.closed:
		return
	default:
	}
	close(m.closed)
	m.ln.Close()
	m.mu.Lock()
	for _, c := range m.all {
		c.conn.Abort(nil)
	}
	m.mu.Unlock()
	m.wg.Wait()
	m.mu.Lock()
	for _, c := range m.all {
		<-c.conn.Done()
	}
	m.mu.Unlock()
}

// Conn is one registered connection to the fake manager.
type Conn struct {
	// Register is the REGISTER frame the connection opened with.
	Register *ipc.Frame

	t      testing.TB
	conn   *ipc.Conn
	frames chan *ipc.Frame
	done   chan struct{}
}

// Send writes raw as one frame, byte for byte.
func (c *Conn) Send(raw string) {
	c.t.Helper()
	if err := c.conn.Send([]byte(raw)); err != nil {
		c.t.Fatalf("harnesstest: send %s: %v", raw, err)
	}
}

// SendFrame writes f.
func (c *Conn) SendFrame(f *ipc.Frame) {
	c.t.Helper()
	if err := c.conn.SendFrame(f); err != nil {
		c.t.Fatalf("harnesstest: send %s: %v", f.Op, err)
	}
}

// ErrNoFrame is what Next reports when no frame came in time.
var ErrNoFrame = errors.New("no frame")

// Next returns the next frame the cluster sent, or an error wrapping
// ErrNoFrame if none came within timeout (or the connection ended).
func (c *Conn) Next(timeout time.Duration) (*ipc.Frame, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case f := <-c.frames:
		return f, nil
	case <-t.C:
		return nil, fmt.Errorf("%w within %v", ErrNoFrame, timeout)
	case <-c.done:
		select {
		case f := <-c.frames:
			return f, nil
		default:
			return nil, fmt.Errorf("%w: connection closed", ErrNoFrame)
		}
	}
}

// Expect skips frames until one matches, failing the test if none does within
// timeout. what names the frame for the failure message.
func (c *Conn) Expect(timeout time.Duration, what string, match func(*ipc.Frame) bool) *ipc.Frame {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		f, err := c.Next(time.Until(deadline))
		if err != nil {
			c.t.Fatalf("harnesstest: waiting for %s: %v", what, err)
			return nil
		}
		if match(f) {
			return f
		}
	}
}

// ExpectOp waits for the next frame with op.
func (c *Conn) ExpectOp(timeout time.Duration, op string) *ipc.Frame {
	c.t.Helper()
	return c.Expect(timeout, op, func(f *ipc.Frame) bool { return f.Op == op })
}

// ExpectReply waits for the REPLY to id.
func (c *Conn) ExpectReply(timeout time.Duration, id string) *ipc.Frame {
	c.t.Helper()
	return c.Expect(timeout, "REPLY "+id, func(f *ipc.Frame) bool { return f.Op == ipc.OpReply && f.ID == id })
}

// Drop cuts the connection, as a manager that dies does.
func (c *Conn) Drop() {
	c.conn.Abort(nil)
	<-c.done
}
