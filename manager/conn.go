package manager

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"time"

	"github.com/sm-supervisor/sm/ipc"
	"github.com/sm-supervisor/sm/unixsock"
)

// conn is one registered (or registering) connection.
type conn struct {
	id   uint64
	c    *ipc.Conn
	cred unixsock.Cred
	role string
	name string
	proc *proc // for role cluster; set once at REGISTER
	// client: registered as a client and counted in Manager.clients.
	// Only serve's goroutine uses it.
	client bool

	// out holds back what handling this connection's frames sends to others
	// (forwarded requests, routed replies) until no whole frame is left to
	// read: then it all leaves, one write per peer. Only serve's goroutine
	// uses it.
	out ipc.Batch
	// nout is the same for what leaves to other hosts over NATS (cross-host
	// routing); only serve's goroutine uses it.
	nout natsOut

	watching  atomic.Bool   // the connection watches the feed (again after a drop)
	watchStop chan struct{} // closed when the connection ends
}

func (c *conn) send(f *ipc.Frame) error { return c.c.SendFrame(f) }

func (c *conn) reply(id string, payload json.RawMessage) {
	if id == "" {
		return
	}
	if err := c.send(ipc.Reply(id, payload)); errors.Is(err, ipc.ErrFrameTooLarge) {
		// Still exactly one REPLY for the id.
		c.send(ipc.ReplyError(id, ipc.Errorf(ipc.CodeFrameTooLarge, "the reply (%d payload bytes) exceeds limits.max_frame_bytes", len(payload))))
	}
}

// replyErr answers id with an error. A frame without an id still learns why it
// was refused: the REPLY then carries no id.
func (c *conn) replyErr(id, code, format string, args ...any) {
	c.send(ipc.ReplyError(id, ipc.Errorf(code, format, args...)))
}

// refuse answers with an error and closes after flushing it.
func (c *conn) refuse(code, msg string) {
	c.send(ipc.ReplyError("", &ipc.Error{Code: code, Message: msg}))
	c.c.Close()
}

// serve runs one connection: peer check, REGISTER, then frames until it ends.
func (m *Manager) serve(c *conn) {
	watchDone := make(chan struct{})
	c.watchStop = watchDone
	defer func() {
		c.out.Flush()
		m.flushNATS(c)
		close(watchDone)
		c.c.Close()
		<-c.c.Done()
		if c.client {
			m.clients.Add(-1)
		}
		m.removeConn(c)
		if c.proc != nil {
			m.post(evDisconnect{p: c.proc, c: c})
		}
	}()
	nc := c.c.NetConn()
	cred, err := unixsock.PeerCred(nc)
	if err != nil {
		m.log.Warn("connection refused: no peer credentials", "conn", c.id, "err", err)
		c.refuse(ipc.CodeForbidden, "peer credentials unavailable")
		return
	}
	c.cred = cred
	if !m.uids[cred.UID] {
		m.log.Warn("connection refused: uid not allowed", "conn", c.id, "uid", cred.UID, "peer_pid", cred.PID)
		c.refuse(ipc.CodeForbidden, "uid not allowed (allowed_uids)")
		return
	}
	if !m.register(c) {
		return
	}
	dec := ipc.Decoder{MaxDepth: m.cfg.Limits.MaxJSONDepth}
	for {
		if !c.c.FrameBuffered() {
			c.out.Flush() // before the read waits for the socket
			m.flushNATS(c)
		}
		line, err := c.c.ReadFrame()
		if err != nil {
			if errors.Is(err, ipc.ErrFrameTooLarge) {
				c.replyErr("", ipc.CodeFrameTooLarge, "frame exceeds limits.max_frame_bytes (%d); skipped", m.cfg.Limits.MaxFrameBytes)
				continue
			}
			m.logClosed(c, err)
			return
		}
		if c.proc != nil {
			c.proc.frames.Add(1)
			// Most of what a cluster sends is replies, handed on at once:
			// decoded in place, payload unread and uncopied.
			if rf, ok := dec.DecodeReply(line); ok {
				m.completeReply(c, rf)
				continue
			}
		}
		f, err := dec.Decode(line)
		if err != nil {
			id := ""
			if f != nil {
				id = f.ID
			}
			c.replyErr(id, ipc.CodeBadFrame, "%s", messageOf(err))
			continue
		}
		m.handle(c, f)
	}
}

func (m *Manager) logClosed(c *conn, err error) {
	if cause := c.c.Cause(); cause != nil {
		m.log.Warn("connection cut off", "conn", c.id, "role", c.role, "name", c.name, "reason", cause)
		return
	}
	if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
		m.log.Info("connection closed", "conn", c.id, "role", c.role, "err", err)
	}
}

func messageOf(err error) string {
	var pe *ipc.Error
	if errors.As(err, &pe) {
		return pe.Message
	}
	return err.Error()
}

// register reads the first frame, which must be REGISTER, and answers it.
func (m *Manager) register(c *conn) bool {
	nc := c.c.NetConn()
	nc.SetReadDeadline(time.Now().Add(m.cfg.Limits.RegisterTimeout.Duration))
	line, err := c.c.ReadFrame()
	nc.SetReadDeadline(time.Time{})
	switch {
	case errors.Is(err, ipc.ErrFrameTooLarge):
		c.refuse(ipc.CodeFrameTooLarge, "first frame exceeds limits.max_frame_bytes")
		return false
	case err != nil:
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			c.refuse(ipc.CodeNotRegistered, "no REGISTER within limits.register_timeout")
		}
		return false
	}
	f, err := (&ipc.Decoder{MaxDepth: m.cfg.Limits.MaxJSONDepth}).Decode(line)
	if err != nil {
		id := ""
		if f != nil {
			id = f.ID
		}
		c.send(ipc.ReplyError(id, ipc.Errorf(ipc.CodeNotRegistered, "first frame must be REGISTER: %s", messageOf(err))))
		c.c.Close()
		return false
	}
	if f.Op != ipc.OpRegister {
		c.send(ipc.ReplyError(f.ID, ipc.Errorf(ipc.CodeNotRegistered, "first frame must be REGISTER, got %s", f.Op)))
		c.c.Close()
		return false
	}
	switch f.Role {
	case ipc.RoleClient:
		// Clients, not clusters, are what max_connections bounds: checked
		// here, where the role is known, so that no client can take a
		// connection a supervised process is owed.
		if m.clients.Add(1) > int64(m.cfg.Limits.MaxConnections) {
			m.clients.Add(-1)
			m.log.Warn("client refused: limits.max_connections reached", "conn", c.id, "name", f.Name)
			c.send(ipc.ReplyError(f.ID, ipc.Errorf(ipc.CodeBusy, "too many client connections (limits.max_connections)")))
			c.c.Close()
			return false
		}
		c.client = true
		c.role, c.name = ipc.RoleClient, f.Name
		c.reply(f.ID, m.clientHello(c))
		m.log.Info("client registered", "conn", c.id, "name", f.Name, "peer_pid", c.cred.PID)
		return true
	case ipc.RoleCluster:
		r, err := ask(m, context.Background(), func(res chan<- registerResult) event { return evRegister{c: c, f: f, res: res} })
		if err != nil {
			r = registerResult{err: ipc.Errorf(ipc.CodeShuttingDown, "manager is shutting down")}
		}
		if r.err != nil {
			c.send(ipc.ReplyError(f.ID, r.err))
			c.c.Close()
			return false
		}
		c.reply(f.ID, r.payload)
		m.post(evRegistered{p: c.proc})
		return true
	default:
		c.send(ipc.ReplyError(f.ID, ipc.Errorf(ipc.CodeBadFrame, "REGISTER role must be %q or %q", ipc.RoleCluster, ipc.RoleClient)))
		c.c.Close()
		return false
	}
}

func (m *Manager) clientHello(c *conn) json.RawMessage {
	t := m.Topology()
	b, _ := json.Marshal(map[string]any{
		"conn":               c.id,
		"max_frame_bytes":    m.cfg.Limits.MaxFrameBytes,
		"protocol":           1,
		"total_shards":       t.Total,
		"shards_per_cluster": t.PerCluster,
		"clusters":           t.Clusters(),
	})
	return b
}

// handle dispatches one frame of a registered connection.
func (m *Manager) handle(c *conn, f *ipc.Frame) {
	switch f.Op {
	case ipc.OpReply:
		m.completeReply(c, f)
	case ipc.OpHeartbeat:
		if c.proc == nil {
			c.replyErr(f.ID, ipc.CodeForbidden, "HEARTBEAT is for cluster connections")
			return
		}
		m.heartbeat(c.proc, f, time.Now())
		c.reply(f.ID, nil)
	case ipc.OpQuiesced:
		if c.proc == nil {
			c.replyErr(f.ID, ipc.CodeForbidden, "QUIESCED is for cluster connections")
			return
		}
		m.post(evQuiesced{p: c.proc, resume: f.Resume, handoff: f.Handoff})
		c.reply(f.ID, nil)
	case ipc.OpRegister:
		c.replyErr(f.ID, ipc.CodeForbidden, "connection is already registered")
	case ipc.OpQuiesce, ipc.OpActivate, ipc.OpEvent:
		c.replyErr(f.ID, ipc.CodeForbidden, "%s is sent by the manager only", f.Op)
	case ipc.OpDeploy:
		m.deploy(c, f)
	case ipc.OpIdentify:
		m.post(evIdentify{c: c, f: f})
	case ipc.OpIdentifyCancel:
		m.post(evIdentifyCancel{c: c, f: f})
	case ipc.OpStatus:
		m.statusOp(c, f)
	case ipc.OpWatch:
		m.watch(c, f)
	default:
		m.forward(c, f)
	}
}
