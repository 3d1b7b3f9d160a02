package ipc_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/sm-supervisor/sm/ipc"
)

// standIn is a stand-in for sm-manager, made of this package's own pieces
// (Reader, Decode, Encode) so that the examples run without one. It answers
// every REGISTER; a client's business op for target "0" it echoes, as the
// simulated bot would, and any other target is unknown_target; to a cluster
// it sends one ping, and hands the REPLY to replies.
type standIn struct {
	path    string
	ln      net.Listener
	wg      sync.WaitGroup
	replies chan *ipc.Frame
}

func startStandIn() *standIn {
	dir, err := os.MkdirTemp("", "sm-example-")
	if err != nil {
		panic(err)
	}
	s := &standIn{path: filepath.Join(dir, "sm.sock"), replies: make(chan *ipc.Frame, 1)}
	if s.ln, err = net.Listen("unix", s.path); err != nil {
		panic(err)
	}
	s.wg.Go(func() {
		for {
			nc, err := s.ln.Accept()
			if err != nil {
				return
			}
			s.wg.Go(func() { s.serve(nc) })
		}
	})
	return s
}

// Close stops the stand-in; call it after the clients' Close.
func (s *standIn) Close() {
	s.ln.Close()
	s.wg.Wait()
	os.RemoveAll(filepath.Dir(s.path))
}

func (s *standIn) serve(nc net.Conn) {
	defer nc.Close()
	r := ipc.NewReader(nc, ipc.DefaultOptions.MaxFrameBytes)
	send := func(f *ipc.Frame) { nc.Write(append(ipc.Encode(f), '\n')) }
	for {
		line, err := r.ReadFrame()
		if err != nil {
			return
		}
		f, err := ipc.Decode(line)
		switch {
		case err != nil:
			send(ipc.ReplyError("", ipc.Errorf(ipc.CodeBadFrame, "%v", err)))
		case f.Op == ipc.OpRegister:
			send(ipc.Reply(f.ID, json.RawMessage(`{"protocol":1}`)))
			if f.Role == ipc.RoleCluster {
				send(&ipc.Frame{Op: "ping", ID: "m1", Target: "0"})
			}
		case f.Op == ipc.OpReply:
			s.replies <- f
		case f.Target == "0":
			send(ipc.Reply(f.ID, f.Payload))
		default:
			send(ipc.ReplyError(f.ID, ipc.Errorf(ipc.CodeUnknownTarget, "%q is not a cluster of 1", f.Target)))
		}
	}
}

// A client dials the manager's socket, registers, and sends business ops by
// target; the manager routes each to its cluster and the REPLY back.
func ExampleDial() {
	mgr := startStandIn()
	defer mgr.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := ipc.Dial(ctx, ipc.ClientConfig{
		Path:     mgr.path, // sm-manager's socket, e.g. /run/sm/sm.sock
		Register: ipc.Frame{Role: ipc.RoleClient, Name: "example"},
	})
	if err != nil {
		fmt.Println("dial:", err)
		return
	}
	defer c.Close()

	reply, err := c.Request(ctx, &ipc.Frame{Op: "echo", Target: "0", Payload: json.RawMessage(`{"hello":"world"}`)})
	if err != nil {
		fmt.Println("echo:", err)
		return
	}
	fmt.Println(string(reply.Payload))
	// Output: {"hello":"world"}
}

// Every request gets exactly one REPLY: a result, or an error with a stable
// code to switch on. The context bounds the wait (ipc.ErrTimeout).
func ExampleClient_Request() {
	mgr := startStandIn()
	defer mgr.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := ipc.Dial(ctx, ipc.ClientConfig{Path: mgr.path, Register: ipc.Frame{Role: ipc.RoleClient, Name: "example"}})
	if err != nil {
		fmt.Println("dial:", err)
		return
	}
	defer c.Close()

	reqCtx, cancelReq := context.WithTimeout(ctx, time.Second)
	defer cancelReq()
	_, err = c.Request(reqCtx, &ipc.Frame{Op: "guild.sync", Target: "7"})
	switch ipc.CodeOf(err) {
	case "":
		fmt.Println("done")
	case ipc.CodeUnknownTarget:
		fmt.Println("no such cluster:", err)
	case ipc.CodeTimeout, ipc.CodeUnavailable:
		fmt.Println("try again later:", err)
	default:
		fmt.Println("failed:", err)
	}
	// Output: no such cluster: unknown_target: "7" is not a cluster of 1
}

// A cluster process registers with the token and numbers the manager put in
// its environment (SM_TOKEN, SM_CLUSTER, SM_GENERATION), and answers the
// business ops routed to it from its Handler, which runs on the read
// goroutine and must not block.
func ExampleClientConfig_clusterHandler() {
	mgr := startStandIn()
	defer mgr.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := ipc.Dial(ctx, ipc.ClientConfig{
		Path: mgr.path,
		Register: ipc.Frame{
			Role: ipc.RoleCluster, Cluster: ipc.Int(0), Generation: ipc.Int64(1),
			Token: "the SM_TOKEN value", PID: os.Getpid(),
		},
		Handler: func(c *ipc.Client, f *ipc.Frame) {
			switch f.Op {
			case "ping":
				c.Reply(f.ID, json.RawMessage(`{"pong":true}`), nil)
			case ipc.OpActivate, ipc.OpQuiesce:
				// notifications: no id, no REPLY
			default:
				c.Reply(f.ID, nil, ipc.Errorf("unknown_op", "no op %q here", f.Op))
			}
		},
	})
	if err != nil {
		fmt.Println("dial:", err)
		return
	}
	defer c.Close()

	select {
	case r := <-mgr.replies: // what the manager got back for its ping
		fmt.Println(r.ID, string(r.Payload))
	case <-ctx.Done():
		fmt.Println("no reply")
	}
	// Output: m1 {"pong":true}
}
