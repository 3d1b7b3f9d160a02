package ipc_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/backoff"
	"github.com/sm-supervisor/sm/ipc"
)

// fakeServer is a stand-in for the manager: a real Unix socket whose accepted
// connections are ipc.Conns. It answers each REGISTER with what answer returns
// and hands every registered connection to the test as a peer.
type fakeServer struct {
	t      *testing.T
	path   string
	ln     net.Listener
	answer func(n int, reg *ipc.Frame) *ipc.Frame // reply to the n-th REGISTER (from 0)

	peers     chan *peer      // registered connections
	registers chan *ipc.Frame // every REGISTER received, refused or not
	quit      chan struct{}
	wg        sync.WaitGroup
	mu        sync.Mutex
	conns     []*ipc.Conn
}

// peer is the server's end of one registered connection.
type peer struct {
	*ipc.Conn
	reg *ipc.Frame
	in  chan *ipc.Frame // frames after REGISTER; closed when the connection ends
}

func acceptAll(int, *ipc.Frame) *ipc.Frame {
	return ipc.Reply("", json.RawMessage(`{"first_shard":0,"last_shard":3}`))
}

func newFakeServer(t *testing.T, answer func(n int, reg *ipc.Frame) *ipc.Frame) *fakeServer {
	t.Helper()
	s := &fakeServer{
		t:         t,
		path:      filepath.Join(t.TempDir(), "sm.sock"),
		answer:    answer,
		peers:     make(chan *peer, 16),
		registers: make(chan *ipc.Frame, 16),
		quit:      make(chan struct{}),
	}
	ln, err := net.Listen("unix", s.path)
	if err != nil {
		t.Fatal(err)
	}
	s.ln = ln
	s.wg.Add(1)
	go s.acceptLoop()
	t.Cleanup(s.stop)
	return s
}

func (s *fakeServer) stop() {
	close(s.quit)
	s.ln.Close()
	s.mu.Lock()
	for _, c := range s.conns {
		c.Abort(nil)
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func (s *fakeServer) acceptLoop() {
	defer s.wg.Done()
	for n := 0; ; n++ {
		nc, err := s.ln.Accept()
		if err != nil {
			return
		}
		c := ipc.NewConn(nc, ipc.Options{})
		s.mu.Lock()
		s.conns = append(s.conns, c)
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serve(n, c)
	}
}

// next reads and decodes c's next frame. It reports false once c ends, or
// when the frame does not decode: an error, what says which frame.
func (s *fakeServer) next(c *ipc.Conn, what string) (*ipc.Frame, bool) {
	line, err := c.ReadFrame()
	if err != nil {
		return nil, false
	}
	f, err := ipc.Decode(line)
	if err != nil {
		s.t.Errorf("server: %s: %v", what, err)
		return nil, false
	}
	return f, true
}

func (s *fakeServer) serve(n int, c *ipc.Conn) {
	defer s.wg.Done()
	defer func() { c.Abort(nil); <-c.Done() }()
	reg, ok := s.next(c, "first frame")
	if !ok {
		return
	}
	select {
	case s.registers <- reg:
	default:
		s.t.Errorf("server: too many REGISTERs")
	}
	ans := s.answer(n, reg)
	if ans == nil {
		<-s.quit // never answer
		return
	}
	ans.ID = reg.ID
	if err := c.SendFrame(ans); err != nil {
		s.t.Errorf("server: send REGISTER reply: %v", err)
		return
	}
	if ans.Error != nil {
		c.Close() // refused: flush the reply, then hang up
		<-c.Done()
		return
	}
	p := &peer{Conn: c, reg: reg, in: make(chan *ipc.Frame, 256)}
	defer close(p.in)
	s.peers <- p
	for {
		f, ok := s.next(c, "bad frame from client")
		if !ok {
			return
		}
		select {
		case p.in <- f:
		case <-s.quit:
			return
		}
	}
}

// nextPeer waits for the next registered connection.
func (s *fakeServer) nextPeer() *peer {
	s.t.Helper()
	select {
	case p := <-s.peers:
		return p
	case <-time.After(5 * time.Second):
		s.t.Fatal("no client registered within 5s")
		return nil
	}
}

// recv waits for the next frame the client sent on p.
func (p *peer) recv(t *testing.T) *ipc.Frame {
	t.Helper()
	select {
	case f, ok := <-p.in:
		if !ok {
			t.Fatal("connection closed while waiting for a frame")
		}
		return f
	case <-time.After(5 * time.Second):
		t.Fatal("no frame from the client within 5s")
		return nil
	}
}

func (p *peer) send(t *testing.T, f *ipc.Frame) {
	t.Helper()
	if err := p.SendFrame(f); err != nil {
		t.Fatal(err)
	}
}

// dial connects a client with Dial and closes it when the test ends.
func dial(t *testing.T, cfg ipc.ClientConfig) *ipc.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := ipc.Dial(ctx, cfg)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// runClient starts c.Run in the background; the returned channel yields its
// result. The run is cancelled and waited for when the test ends.
func runClient(t *testing.T, c *ipc.Client) <-chan error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	finished := make(chan struct{})
	go func() { done <- c.Run(ctx); close(finished) }()
	t.Cleanup(func() { cancel(); <-finished })
	return done
}

func fastBackoff() backoff.Policy {
	return backoff.Policy{Min: 5 * time.Millisecond, Max: 20 * time.Millisecond}
}

func TestClientRegistersFirst(t *testing.T) {
	srv := newFakeServer(t, acceptAll)
	var mu sync.Mutex
	var connectReply *ipc.Frame
	reg := ipc.Frame{Role: ipc.RoleCluster, Cluster: ipc.Int(3), Generation: ipc.Int64(5), Token: "s3cret", PID: 1234}
	c := dial(t, ipc.ClientConfig{
		Path:     srv.path,
		Register: reg,
		OnConnect: func(_ *ipc.Client, r *ipc.Frame) {
			mu.Lock()
			connectReply = r
			mu.Unlock()
		},
	})
	p := srv.nextPeer()
	got := p.reg
	if got.Op != ipc.OpRegister || got.ID == "" {
		t.Fatalf("first frame = %+v, want a REGISTER with an id", got)
	}
	want := reg
	want.Op, want.ID = ipc.OpRegister, got.ID
	if fmt.Sprint(ipc.Encode(got)) != fmt.Sprint(ipc.Encode(&want)) {
		t.Fatalf("REGISTER = %s, want %s", ipc.Encode(got), ipc.Encode(&want))
	}
	if !c.Connected() {
		t.Fatal("Connected() = false after Dial")
	}
	mu.Lock()
	defer mu.Unlock()
	if connectReply == nil || string(connectReply.Payload) != `{"first_shard":0,"last_shard":3}` {
		t.Fatalf("OnConnect got %+v", connectReply)
	}
}

func TestClientRegisterAsClient(t *testing.T) {
	srv := newFakeServer(t, acceptAll)
	dial(t, ipc.ClientConfig{Path: srv.path, Register: ipc.Frame{Role: ipc.RoleClient, Name: "sm-api"}})
	got := srv.nextPeer().reg
	if string(ipc.Encode(got)) != fmt.Sprintf(`{"op":"REGISTER","id":%q,"role":"client","name":"sm-api"}`, got.ID) {
		t.Fatalf("REGISTER = %s", ipc.Encode(got))
	}
}

// TestClientRequestCorrelation answers 100 concurrent requests in a shuffled
// order and checks that each caller gets its own reply.
func TestClientRequestCorrelation(t *testing.T) {
	srv := newFakeServer(t, acceptAll)
	c := dial(t, ipc.ClientConfig{Path: srv.path, Register: ipc.Frame{Role: ipc.RoleClient, Name: "t"}})
	p := srv.nextPeer()
	const n = 100

	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			reply, err := c.Request(ctx, &ipc.Frame{Op: "work", Target: "1", ID: "ignored", Payload: json.RawMessage(fmt.Sprint(i))})
			if err != nil {
				errs <- fmt.Errorf("request %d: %w", i, err)
				return
			}
			if want := fmt.Sprintf(`{"answer":%d}`, i); string(reply.Payload) != want {
				errs <- fmt.Errorf("request %d got reply %s, want %s", i, reply.Payload, want)
			}
		})
	}
	reqs := make([]*ipc.Frame, 0, n)
	ids := make(map[string]bool)
	for range n {
		f := p.recv(t)
		if f.Op != "work" || f.Target != "1" || f.ID == "" || f.ID == "ignored" {
			t.Fatalf("request frame = %+v", f)
		}
		if ids[f.ID] {
			t.Fatalf("id %q used twice", f.ID)
		}
		ids[f.ID] = true
		reqs = append(reqs, f)
	}
	rand.Shuffle(len(reqs), func(i, j int) { reqs[i], reqs[j] = reqs[j], reqs[i] })
	for _, f := range reqs {
		p.send(t, ipc.Reply(f.ID, json.RawMessage(`{"answer":`+string(f.Payload)+`}`)))
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestClientRequestErrorReply(t *testing.T) {
	srv := newFakeServer(t, acceptAll)
	c := dial(t, ipc.ClientConfig{Path: srv.path})
	p := srv.nextPeer()
	go func() {
		f, ok := <-p.in
		if ok {
			p.SendFrame(ipc.ReplyError(f.ID, ipc.Errorf(ipc.CodeUnknownTarget, "no cluster 99")))
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	reply, err := c.Request(ctx, &ipc.Frame{Op: "x", Target: "99"})
	var pe *ipc.Error
	if !errors.As(err, &pe) || pe.Code != ipc.CodeUnknownTarget || pe.Message != "no cluster 99" {
		t.Fatalf("err = %v, want the unknown_target reply", err)
	}
	if reply == nil || reply.Error != pe {
		t.Fatalf("reply = %+v, want the reply frame with the error", reply)
	}
}

// TestClientRequestTimeout checks that a request nobody answers fails with
// ErrTimeout at its deadline, and that a reply arriving after that goes to the
// handler rather than to a forgotten waiter.
func TestClientRequestTimeout(t *testing.T) {
	srv := newFakeServer(t, acceptAll)
	late := make(chan *ipc.Frame, 1)
	c := dial(t, ipc.ClientConfig{Path: srv.path, Handler: func(_ *ipc.Client, f *ipc.Frame) { late <- f }})
	p := srv.nextPeer()

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Request(ctx, &ipc.Frame{Op: "slow", Target: "1"})
	if !errors.Is(err, ipc.ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
	if ipc.CodeOf(err) != ipc.CodeTimeout {
		t.Fatalf("CodeOf = %s", ipc.CodeOf(err))
	}
	if d := time.Since(start); d < 100*time.Millisecond || d > 3*time.Second {
		t.Fatalf("timed out after %v, want ~100ms", d)
	}
	f := p.recv(t)
	p.send(t, ipc.Reply(f.ID, json.RawMessage(`"too late"`)))
	select {
	case got := <-late:
		if got.Op != ipc.OpReply || got.ID != f.ID {
			t.Fatalf("handler got %+v", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("late reply never reached the handler")
	}

	// A cancelled (not timed-out) request reports the cancellation.
	ctx2, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if _, err := c.Request(ctx2, &ipc.Frame{Op: "x"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled request: err = %v", err)
	}
}

func TestClientDisconnected(t *testing.T) {
	c := ipc.NewClient(ipc.ClientConfig{Path: filepath.Join(t.TempDir(), "none.sock")})
	if _, err := c.Request(context.Background(), &ipc.Frame{Op: "x"}); !errors.Is(err, ipc.ErrUnavailable) {
		t.Fatalf("Request before Run: %v, want ErrUnavailable", err)
	}
	if err := c.Send(&ipc.Frame{Op: "x"}); !errors.Is(err, ipc.ErrUnavailable) {
		t.Fatalf("Send before Run: %v, want ErrUnavailable", err)
	}
	if err := c.Reply("1", nil, nil); !errors.Is(err, ipc.ErrUnavailable) {
		t.Fatalf("Reply before Run: %v, want ErrUnavailable", err)
	}
	if err := c.Reply("", nil, nil); err != nil {
		t.Fatalf("Reply to a notification: %v, want nil", err)
	}
	if c.Connected() {
		t.Fatal("Connected before Run")
	}
	// Without Reconnect, Run gives up on the first failed dial.
	err := c.Run(context.Background())
	if err == nil {
		t.Fatal("Run against no server succeeded")
	}
	if err := c.WaitConnected(context.Background()); !errors.Is(err, ipc.ErrClosed) {
		t.Fatalf("WaitConnected after Run returned: %v, want ErrClosed", err)
	}
}

// TestClientPendingFailOnDrop checks that requests in flight when the
// connection drops fail with unavailable instead of waiting for their deadline.
func TestClientPendingFailOnDrop(t *testing.T) {
	srv := newFakeServer(t, acceptAll)
	c := ipc.NewClient(ipc.ClientConfig{Path: srv.path})
	done := runClient(t, c)
	p := srv.nextPeer()
	wctx, wcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer wcancel()
	if err := c.WaitConnected(wctx); err != nil {
		t.Fatal(err)
	}
	const n = 10
	errs := make(chan error, n)
	for range n {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			reply, err := c.Request(ctx, &ipc.Frame{Op: "x", Target: "1"})
			if reply != nil && (reply.Error == nil || reply.Error.Code != ipc.CodeUnavailable) {
				err = fmt.Errorf("reply %+v", reply)
			}
			errs <- err
		}()
	}
	for range n {
		p.recv(t)
	}
	p.Abort(nil) // the manager goes away with the requests unanswered
	for range n {
		select {
		case err := <-errs:
			if ipc.CodeOf(err) != ipc.CodeUnavailable {
				t.Errorf("request error = %v, want code unavailable", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("pending request not failed when the connection dropped")
		}
	}
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Run without Reconnect returned nil after the connection dropped")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after the connection dropped")
	}
	if c.Connected() {
		t.Fatal("still Connected after the drop")
	}
	if _, err := c.Request(context.Background(), &ipc.Frame{Op: "x"}); !errors.Is(err, ipc.ErrUnavailable) {
		t.Fatalf("Request after the drop: %v, want ErrUnavailable", err)
	}
}

// TestClientReconnect drops the connection twice and checks that the client
// registers again each time, with the same REGISTER, and serves requests after.
func TestClientReconnect(t *testing.T) {
	srv := newFakeServer(t, acceptAll)
	connects := make(chan struct{}, 8)
	reg := ipc.Frame{Role: ipc.RoleCluster, Cluster: ipc.Int(1), Generation: ipc.Int64(2), Token: "tok", PID: 99}
	c := dial(t, ipc.ClientConfig{
		Path: srv.path, Register: reg, Reconnect: true, Backoff: fastBackoff(),
		OnConnect: func(*ipc.Client, *ipc.Frame) { connects <- struct{}{} },
	})
	first := srv.nextPeer()
	for round := range 3 {
		select {
		case <-connects:
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: OnConnect not called", round)
		}
		p := first
		if round > 0 {
			p = srv.nextPeer()
			if string(ipc.Encode(p.reg)) != string(ipc.Encode(first.reg)) {
				t.Fatalf("re-REGISTER = %s, want %s", ipc.Encode(p.reg), ipc.Encode(first.reg))
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := c.WaitConnected(ctx); err != nil {
			t.Fatal(err)
		}
		go func() {
			if f, ok := <-p.in; ok {
				p.SendFrame(ipc.Reply(f.ID, json.RawMessage(fmt.Sprint(round))))
			}
		}()
		reply, err := c.Request(ctx, &ipc.Frame{Op: "x", Target: "1"})
		cancel()
		if err != nil || string(reply.Payload) != fmt.Sprint(round) {
			t.Fatalf("round %d: request: %v %+v", round, err, reply)
		}
		p.Abort(nil) // the manager restarts
	}
}

// TestClientRetriesTransientRefusal checks that a REGISTER refused as busy is
// retried, not treated as final.
func TestClientRetriesTransientRefusal(t *testing.T) {
	srv := newFakeServer(t, func(n int, reg *ipc.Frame) *ipc.Frame {
		if n < 2 {
			return ipc.ReplyError("", ipc.Errorf(ipc.CodeBusy, "starting"))
		}
		return acceptAll(n, reg)
	})
	dial(t, ipc.ClientConfig{Path: srv.path, Reconnect: true, Backoff: fastBackoff()})
	srv.nextPeer()
	if n := len(srv.registers); n != 3 {
		t.Fatalf("server saw %d REGISTERs, want 3", n)
	}
}

// TestClientRegisterRefused checks that a refused REGISTER ends Run with
// ErrRegisterRefused and is not retried, even with Reconnect.
func TestClientRegisterRefused(t *testing.T) {
	srv := newFakeServer(t, func(int, *ipc.Frame) *ipc.Frame {
		return ipc.ReplyError("", ipc.Errorf(ipc.CodeForbidden, "wrong token"))
	})
	c := ipc.NewClient(ipc.ClientConfig{Path: srv.path, Reconnect: true, Backoff: fastBackoff()})
	// A waiter that started before the refusal is released when Run returns.
	waited := make(chan error, 1)
	go func() { waited <- c.WaitConnected(context.Background()) }()
	var err error
	select {
	case err = <-runClient(t, c):
	case <-time.After(5 * time.Second):
		t.Fatal("Run kept going after a refused REGISTER")
	}
	if !errors.Is(err, ipc.ErrRegisterRefused) {
		t.Fatalf("Run = %v, want ErrRegisterRefused", err)
	}
	var pe *ipc.Error
	if !errors.As(err, &pe) || pe.Code != ipc.CodeForbidden || pe.Message != "wrong token" {
		t.Fatalf("Run = %v, want the forbidden error inside", err)
	}
	select {
	case err := <-waited:
		if !errors.Is(err, ipc.ErrClosed) {
			t.Fatalf("WaitConnected = %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("WaitConnected still blocked after Run returned")
	}
	time.Sleep(100 * time.Millisecond) // several backoff periods
	if n := len(srv.registers); n != 1 {
		t.Fatalf("server saw %d REGISTERs, want 1 (no retry)", n)
	}

	// Dial reports the same refusal.
	_, err = ipc.Dial(context.Background(), ipc.ClientConfig{Path: srv.path, Reconnect: true, Backoff: fastBackoff()})
	if !errors.Is(err, ipc.ErrRegisterRefused) {
		t.Fatalf("Dial = %v, want ErrRegisterRefused", err)
	}
}

func TestClientRegisterTimeout(t *testing.T) {
	srv := newFakeServer(t, func(int, *ipc.Frame) *ipc.Frame { return nil })
	c := ipc.NewClient(ipc.ClientConfig{Path: srv.path, RegisterTimeout: 100 * time.Millisecond})
	select {
	case err := <-runClient(t, c):
		if err == nil || errors.Is(err, ipc.ErrRegisterRefused) {
			t.Fatalf("Run = %v, want a timeout reading the REGISTER reply", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("REGISTER reply wait not bounded by RegisterTimeout")
	}
}

// TestClientHandler checks that business ops and notifications reach the
// handler, and that Client.Reply answers them.
func TestClientHandler(t *testing.T) {
	srv := newFakeServer(t, acceptAll)
	notes := make(chan *ipc.Frame, 4)
	dial(t, ipc.ClientConfig{
		Path: srv.path,
		Handler: func(c *ipc.Client, f *ipc.Frame) {
			switch f.Op {
			case "echo":
				c.Reply(f.ID, f.Payload, nil)
			case "fail":
				c.Reply(f.ID, nil, ipc.Errorf(ipc.CodeBusy, "not now"))
			default:
				notes <- f
			}
		},
	})
	p := srv.nextPeer()
	p.send(t, &ipc.Frame{Op: ipc.OpActivate})
	p.send(t, &ipc.Frame{Op: "echo", ID: "s1", Target: "3", Payload: json.RawMessage(`{"keep": [1, "x"]}`)})
	p.send(t, &ipc.Frame{Op: "fail", ID: "s2", Target: "3"})
	p.send(t, &ipc.Frame{Op: ipc.OpQuiesce})
	// A reply to an id the client never used is the handler's too.
	p.send(t, ipc.Reply("stray", nil))

	if got := p.recv(t); string(ipc.Encode(got)) != `{"op":"REPLY","id":"s1","payload":{"keep": [1, "x"]}}` {
		t.Fatalf("echo reply = %s", ipc.Encode(got))
	}
	if got := p.recv(t); string(ipc.Encode(got)) != `{"op":"REPLY","id":"s2","error":{"code":"busy","message":"not now"}}` {
		t.Fatalf("fail reply = %s", ipc.Encode(got))
	}
	for _, want := range []string{ipc.OpActivate, ipc.OpQuiesce, ipc.OpReply} {
		select {
		case f := <-notes:
			if f.Op != want {
				t.Fatalf("handler got %s, want %s", f.Op, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("handler never got %s", want)
		}
	}
}

// TestClientRunStops checks that cancelling Run's context is a clean stop that
// closes the connection.
func TestClientRunStops(t *testing.T) {
	srv := newFakeServer(t, acceptAll)
	c := ipc.NewClient(ipc.ClientConfig{Path: srv.path, Reconnect: true, Backoff: fastBackoff()})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	p := srv.nextPeer()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after cancel = %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not stop on cancel")
	}
	select {
	case _, ok := <-p.in:
		if ok {
			t.Fatal("unexpected frame")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("server connection still open after Run stopped")
	}
}

// TestDialGivesUp checks that Dial of a manager that never comes up returns
// when its context ends, leaving nothing running.
func TestDialGivesUp(t *testing.T) {
	path := filepath.Join(t.TempDir(), "absent.sock")
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	c, err := ipc.Dial(ctx, ipc.ClientConfig{Path: path, Reconnect: true, Backoff: fastBackoff()})
	if !errors.Is(err, context.DeadlineExceeded) || c != nil {
		t.Fatalf("Dial = %v, %v; want DeadlineExceeded", c, err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Dial took %v", d)
	}
	// Without Reconnect the first failure is final.
	if _, err := ipc.Dial(context.Background(), ipc.ClientConfig{Path: path}); err == nil {
		t.Fatal("Dial of a missing socket succeeded")
	}
}

// TestClientCloseTwice checks that Close may be called again, and concurrently.
func TestClientCloseTwice(t *testing.T) {
	srv := newFakeServer(t, acceptAll)
	c := dial(t, ipc.ClientConfig{Path: srv.path, Reconnect: true, Backoff: fastBackoff()})
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			if err := c.Close(); err != nil {
				t.Errorf("Close = %v", err)
			}
		})
	}
	wg.Wait()
	if err := c.Close(); err != nil {
		t.Fatalf("Close again = %v", err)
	}
	if c.Connected() {
		t.Fatal("Connected after Close")
	}
	if err := c.WaitConnected(context.Background()); !errors.Is(err, ipc.ErrClosed) {
		t.Fatalf("WaitConnected after Close = %v, want ErrClosed", err)
	}
}
