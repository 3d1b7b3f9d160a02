package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/sm-supervisor/sm/internal/jsonscan"
	"github.com/sm-supervisor/sm/ipc"
)

// The minimal echo cluster (issue 16): `sm-bench echo-cluster`, a cluster
// process that speaks just enough of the protocol to be supervised and
// routed to (REGISTER, HEARTBEAT with ready:true, QUIESCE → QUIESCED, and
// the echo and ping ops), and as little else as it can. It is the fastest
// end this machine gives the route scenario: beside cluster-harness it
// measures the router against the cheapest direct path, not only against
// the simulated bot's. One goroutine reads the socket's file descriptor with
// blocking read(2) calls (no poller, no scheduler hand-off), answers every
// request of a read in one write(2), and parses a frame with
// internal/jsonscan just far enough to find its op, id and payload, which
// it still checks to be valid JSON. A second goroutine sends the heartbeat.

// echoClusterName is the hidden sm-bench command that runs it.
const echoClusterName = "echo-cluster"

// echoClusterArgv is the echo cluster's command line: this executable with
// the hidden command.
func echoClusterArgv() ([]string, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("echo cluster: %w", err)
	}
	return []string{exe, echoClusterName}, nil
}

// runEchoClusterCmd is `sm-bench echo-cluster`: it runs the echo cluster on
// the SM_* environment a manager (or the bench's direct path) gives it.
func runEchoClusterCmd(_ context.Context, args []string, _, stderr io.Writer) error {
	if len(args) > 0 {
		return fmt.Errorf("%s takes no arguments (it reads SM_SOCKET, SM_CLUSTER, SM_GENERATION, SM_TOKEN)", echoClusterName)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sigs
		os.Exit(0) // nothing to drain: every reply is written before the next read
	}()
	err := runEchoCluster(os.Getenv)
	if errors.Is(err, errQuiesced) {
		return nil
	}
	return err
}

// errQuiesced ends the echo cluster cleanly: it was told to QUIESCE and said
// QUIESCED.
var errQuiesced = errors.New("quiesced")

// echoCluster is the process's one connection.
type echoCluster struct {
	fd  int
	pid int
	wmu sync.Mutex // one write(2) at a time: the loop's batch or a heartbeat
}

func runEchoCluster(getenv func(string) string) error {
	cluster, err1 := strconv.Atoi(getenv("SM_CLUSTER"))
	gen, err2 := strconv.ParseInt(getenv("SM_GENERATION"), 10, 64)
	if err := errors.Join(err1, err2); err != nil || getenv("SM_SOCKET") == "" {
		return fmt.Errorf("echo cluster: SM_SOCKET, SM_CLUSTER and SM_GENERATION must be set: %v", err)
	}
	nc, err := net.Dial("unix", getenv("SM_SOCKET"))
	if err != nil {
		return fmt.Errorf("echo cluster: %w", err)
	}
	// File dups the descriptor in blocking mode: reads wait in the kernel.
	f, err := nc.(*net.UnixConn).File()
	nc.Close()
	if err != nil {
		return fmt.Errorf("echo cluster: %w", err)
	}
	defer f.Close()
	e := &echoCluster{fd: int(f.Fd()), pid: os.Getpid()}

	reg := ipc.AppendFrame(nil, &ipc.Frame{Op: ipc.OpRegister, ID: "register", Role: ipc.RoleCluster,
		Cluster: ipc.Int(cluster), Generation: ipc.Int64(gen), Token: getenv("SM_TOKEN"), PID: e.pid})
	if err := e.write(append(reg, '\n')); err != nil {
		return err
	}
	r := echoReader{fd: e.fd, buf: make([]byte, 0, 64<<10)}
	line, err := r.line()
	if err != nil {
		return fmt.Errorf("echo cluster: REGISTER: %w", err)
	}
	reply, err := ipc.Decode(line)
	if err != nil || reply.Error != nil {
		return fmt.Errorf("echo cluster: REGISTER refused: %v%v", err, reply.Error)
	}
	var hello struct {
		IntervalMS int64 `json:"heartbeat_interval_ms"`
	}
	json.Unmarshal(reply.Payload, &hello)
	interval := time.Duration(hello.IntervalMS) * time.Millisecond
	if interval <= 0 {
		interval = time.Second
	}
	go e.heartbeat(interval)
	return e.serve(&r)
}

// heartbeat says ready:true every interval until a write fails.
func (e *echoCluster) heartbeat(interval time.Duration) {
	beat := []byte(`{"op":"HEARTBEAT","ready":true}` + "\n")
	for {
		if e.write(beat) != nil {
			return
		}
		time.Sleep(interval)
	}
}

// serve answers frames until the connection ends or a QUIESCE came.
func (e *echoCluster) serve(r *echoReader) error {
	var out []byte
	for {
		line, err := r.line()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil // the manager went away; nothing of ours is owed
			}
			return fmt.Errorf("echo cluster: %w", err)
		}
		var quiesce bool
		out, quiesce = e.answer(out, line)
		if quiesce {
			out = append(out, `{"op":"QUIESCED"}`+"\n"...)
		}
		if !r.buffered() || quiesce {
			if err := e.write(out); err != nil {
				return fmt.Errorf("echo cluster: %w", err)
			}
			out = out[:0]
		}
		if quiesce {
			return errQuiesced
		}
	}
}

// answer appends the answer to one frame, if it is owed one, to out, and
// reports whether the frame was a QUIESCE.
func (e *echoCluster) answer(out, line []byte) ([]byte, bool) {
	op, id, payload, ok := echoFields(line)
	if !ok {
		// Not the shape a manager forwards: decode it properly.
		f, err := ipc.Decode(line)
		if err != nil {
			return ipc.AppendFrame(out, ipc.ReplyError("", ipc.Errorf(ipc.CodeBadFrame, "%v", err))), false
		}
		op, payload = []byte(f.Op), f.Payload
		if f.ID != "" {
			id, _ = json.Marshal(f.ID)
		}
	}
	switch string(op) {
	case "echo":
		return appendEchoReply(out, id, payload), false
	case "ping":
		return appendEchoReply(out, id, append(strconv.AppendInt([]byte(`{"pid":`), int64(e.pid), 10), '}')), false
	case ipc.OpQuiesce:
		return out, true
	case ipc.OpActivate, ipc.OpReply:
		return out, false
	}
	if id == nil {
		return out, false
	}
	out = append(out, `{"op":"REPLY","id":`...)
	out = append(out, id...)
	return append(out, `,"error":{"code":"unknown_op","message":"the echo cluster answers echo and ping"}}`+"\n"...), false
}

// appendEchoReply appends the REPLY to the request whose id token (a JSON
// string, quotes included; nil: no reply is owed) is id.
func appendEchoReply(out, id, payload []byte) []byte {
	if id == nil {
		return out
	}
	out = append(out, `{"op":"REPLY","id":`...)
	out = append(out, id...)
	if len(payload) > 0 {
		out = append(out, `,"payload":`...)
		out = append(out, payload...)
	}
	return append(out, "}\n"...)
}

// echoFields reads the op, the id token (quotes included) and the payload of
// a frame whose keys are op, id, target and payload, each once, in any
// order, with no escapes in the strings; for anything else it reports false.
func echoFields(line []byte) (op, id, payload []byte, ok bool) {
	s := jsonscan.New(line)
	if !s.Eat('{') {
		return nil, nil, nil, false
	}
	for {
		key, ok := s.PlainString()
		if !ok || !s.Eat(':') {
			return nil, nil, nil, false
		}
		switch string(key) {
		case "op":
			if op != nil {
				return nil, nil, nil, false
			}
			if op, ok = s.PlainString(); !ok {
				return nil, nil, nil, false
			}
		case "id":
			start := s.Pos()
			if id != nil {
				return nil, nil, nil, false
			}
			if _, ok = s.PlainString(); !ok {
				return nil, nil, nil, false
			}
			id = line[start:s.Pos()]
		case "target":
			if _, ok = s.PlainString(); !ok {
				return nil, nil, nil, false
			}
		case "payload":
			if payload != nil {
				return nil, nil, nil, false
			}
			if payload, ok = s.RawView(); !ok {
				return nil, nil, nil, false
			}
		default:
			return nil, nil, nil, false
		}
		if s.Eat('}') {
			return op, id, payload, op != nil && s.Done()
		}
		if !s.Eat(',') {
			return nil, nil, nil, false
		}
	}
}

// write writes b whole.
func (e *echoCluster) write(b []byte) error {
	e.wmu.Lock()
	defer e.wmu.Unlock()
	for len(b) > 0 {
		n, err := syscall.Write(e.fd, b)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// echoReader splits what blocking reads of fd bring into lines.
type echoReader struct {
	fd   int
	buf  []byte
	head int // start of the next line in buf
}

// buffered reports whether a whole line is waiting.
func (r *echoReader) buffered() bool { return bytes.IndexByte(r.buf[r.head:], '\n') >= 0 }

// line returns the next line without its newline, valid until the next call.
func (r *echoReader) line() ([]byte, error) {
	for {
		if i := bytes.IndexByte(r.buf[r.head:], '\n'); i >= 0 {
			l := r.buf[r.head : r.head+i]
			r.head += i + 1
			return l, nil
		}
		// Move the partial line to the front, grow if it fills the buffer.
		n := copy(r.buf[:cap(r.buf)], r.buf[r.head:])
		r.buf, r.head = r.buf[:n], 0
		if n == cap(r.buf) {
			r.buf = append(r.buf, make([]byte, n)...)[:n]
		}
		m, err := syscall.Read(r.fd, r.buf[n:cap(r.buf)])
		switch {
		case err == syscall.EINTR:
			continue
		case err != nil:
			return nil, err
		case m == 0:
			return nil, io.EOF
		}
		r.buf = r.buf[:n+m]
	}
}
