package manager_test

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/ipc"
)

// rawConn is a hand-driven protocol connection, for testing what the manager
// does with input no well-behaved client would send.
type rawConn struct {
	t    *testing.T
	name string
	nc   net.Conn
	r    *ipc.Reader
}

func (e *env) dialRaw(name string) *rawConn {
	e.t.Helper()
	nc, err := net.Dial("unix", e.cfg.Socket)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { nc.Close() })
	return &rawConn{t: e.t, name: name, nc: nc, r: ipc.NewReader(nc, 4<<20)}
}

// rawClient dials and registers as a client.
func (e *env) rawClient(name string) *rawConn {
	e.t.Helper()
	rc := e.dialRaw(name)
	rc.send(`{"op":"REGISTER","id":"r","role":"client","name":"` + name + `"}`)
	if f := rc.read(e.t, 5*time.Second); f.ID != "r" || f.Error != nil {
		e.t.Fatalf("register: %+v", f)
	}
	return rc
}

func (rc *rawConn) send(line string) { rc.write([]byte(line + "\n")) }

func (rc *rawConn) write(b []byte) {
	rc.nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := rc.nc.Write(b); err != nil {
		rc.t.Errorf("%s: write: %v", rc.name, err)
	}
}

func (rc *rawConn) read(t *testing.T, timeout time.Duration) *ipc.Frame {
	t.Helper()
	rc.nc.SetReadDeadline(time.Now().Add(timeout))
	line, err := rc.r.ReadFrame()
	if err != nil {
		t.Fatalf("%s: read: %v", rc.name, err)
	}
	f, err := ipc.Decode(line)
	if err != nil {
		t.Fatalf("%s: decode %q: %v", rc.name, line, err)
	}
	return f
}

// expectError reads one frame and checks it is a REPLY with id and code.
func (rc *rawConn) expectError(t *testing.T, id, code string) {
	t.Helper()
	f := rc.read(t, 5*time.Second)
	if f.Op != ipc.OpReply || f.ID != id || f.Error == nil || f.Error.Code != code {
		t.Fatalf("%s: got %s, want REPLY id=%q error %s", rc.name, ipc.Encode(f), id, code)
	}
}

// expectClosed checks the manager closed the connection.
func (rc *rawConn) expectClosed(t *testing.T) {
	t.Helper()
	rc.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		_, err := rc.r.ReadFrame()
		if err == nil {
			continue
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
			return
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("%s: connection still open", rc.name)
		}
		return // ECONNRESET and the like: closed
	}
}
