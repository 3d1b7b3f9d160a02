package ipc_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/ipc"
)

// socketPair returns the two ends of a real Unix stream connection made through
// a socket in t.TempDir(). Both are closed when the test ends.
func socketPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "s")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type result struct {
		c   net.Conn
		err error
	}
	accepted := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		accepted <- result{c, err}
	}()
	a, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	r := <-accepted
	if r.err != nil {
		a.Close()
		t.Fatal(r.err)
	}
	t.Cleanup(func() { a.Close(); r.c.Close() })
	return a, r.c
}

// waitDone fails the test if c's writer has not stopped within d.
func waitDone(t *testing.T, c *ipc.Conn, d time.Duration) {
	t.Helper()
	select {
	case <-c.Done():
	case <-time.After(d):
		t.Fatalf("Done not closed within %v", d)
	}
}

func testPayload(g, i int) json.RawMessage {
	pad := strings.Repeat("x", (g*7919+i*104729)%4000)
	return json.RawMessage(fmt.Sprintf(`{"g":%d,"i":%d,"pad":"%s"}`, g, i, pad))
}

// TestConnConcurrentSends sends frames from many goroutines, through both Send
// and SendFrame, and checks that every frame arrives intact, exactly once, and in
// order per sender.
func TestConnConcurrentSends(t *testing.T) {
	a, b := socketPair(t)
	c := ipc.NewConn(a, ipc.Options{})
	const senders, perSender = 16, 200

	var wg sync.WaitGroup
	errs := make(chan error, senders)
	for g := range senders {
		wg.Go(func() {
			for i := range perSender {
				f := &ipc.Frame{Op: "work", ID: fmt.Sprintf("%d-%d", g, i), Target: "3", Payload: testPayload(g, i)}
				var err error
				if i%2 == 0 {
					err = c.SendFrame(f)
				} else {
					err = c.Send(ipc.Encode(f))
				}
				if err != nil {
					errs <- fmt.Errorf("sender %d frame %d: %w", g, i, err)
					return
				}
			}
		})
	}

	r := ipc.NewReader(b, ipc.DefaultOptions.MaxFrameBytes)
	next := make([]int, senders) // next frame index expected from each sender
	for n := 0; n < senders*perSender; n++ {
		line, err := r.ReadFrame()
		if err != nil {
			t.Fatalf("after %d frames: %v", n, err)
		}
		f, err := ipc.Decode(line)
		if err != nil {
			t.Fatalf("frame %d corrupt: %v: %q", n, err, line)
		}
		var g, i int
		if _, err := fmt.Sscanf(f.ID, "%d-%d", &g, &i); err != nil || g < 0 || g >= senders {
			t.Fatalf("frame %d: bad id %q", n, f.ID)
		}
		if i != next[g] {
			t.Fatalf("sender %d: got frame %d, want %d (lost, duplicated or reordered)", g, i, next[g])
		}
		next[g]++
		if f.Op != "work" || f.Target != "3" || !bytes.Equal(f.Payload, testPayload(g, i)) {
			t.Fatalf("frame %s changed in transit: %+v", f.ID, f)
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	c.Close()
	waitDone(t, c, 5*time.Second)
	if _, err := r.ReadFrame(); err != io.EOF {
		t.Fatalf("after all frames: %v, want EOF", err)
	}
	if err := c.Cause(); err != nil {
		t.Fatalf("Cause after a clean close = %v", err)
	}
}

// TestConnQueueFull checks that a peer that never reads is cut off once a queue
// bound is reached, and that Send never blocks on the way there.
func TestConnQueueFull(t *testing.T) {
	tests := []struct {
		name  string
		opts  ipc.Options
		frame int
	}{
		{"MaxQueue", ipc.Options{MaxQueue: 8}, 100},
		{"MaxQueueBytes", ipc.Options{MaxQueue: 1 << 30, MaxQueueBytes: 32 << 10, MaxFrameBytes: 4096}, 1000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := socketPair(t) // nobody reads b until the end
			c := ipc.NewConn(a, tt.opts)
			frame := []byte(`{"op":"x","payload":"` + strings.Repeat("p", tt.frame-23) + `"}`)

			type result struct {
				err     error
				sends   int
				slowest time.Duration
			}
			res := make(chan result, 1)
			go func() {
				var r result
				for r.sends = 0; r.sends < 1e6; r.sends++ {
					start := time.Now()
					err := c.Send(frame)
					r.slowest = max(r.slowest, time.Since(start))
					if err != nil {
						r.err = err
						break
					}
				}
				res <- r
			}()
			var r result
			select {
			case r = <-res:
			case <-time.After(10 * time.Second):
				t.Fatal("Send blocked: no ErrQueueFull within 10s")
			}
			if !errors.Is(r.err, ipc.ErrQueueFull) {
				t.Fatalf("after %d sends: err = %v, want ErrQueueFull", r.sends, r.err)
			}
			if r.slowest > time.Second {
				t.Errorf("slowest Send took %v; Send must not block", r.slowest)
			}
			if r.sends == 0 {
				t.Errorf("cut off at the first send")
			}
			waitDone(t, c, 5*time.Second)
			if !errors.Is(c.Cause(), ipc.ErrQueueFull) {
				t.Errorf("Cause = %v, want ErrQueueFull", c.Cause())
			}
			if err := c.Send(frame); !errors.Is(err, ipc.ErrClosed) {
				t.Errorf("Send after the cut-off = %v, want ErrClosed", err)
			}
			if err := c.SendFrame(&ipc.Frame{Op: "x"}); !errors.Is(err, ipc.ErrClosed) {
				t.Errorf("SendFrame after the cut-off = %v, want ErrClosed", err)
			}
			// The peer sees what got through and then the end of the stream.
			b.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.Copy(io.Discard, b); err != nil {
				t.Errorf("peer: %v, want a clean EOF", err)
			}
		})
	}
}

// TestConnWriteTimeout checks that a peer that stops reading is also cut off
// when a single write blocks past WriteTimeout, even with room in the queue.
func TestConnWriteTimeout(t *testing.T) {
	a, _ := socketPair(t)
	c := ipc.NewConn(a, ipc.Options{WriteTimeout: 50 * time.Millisecond})
	frame := []byte(`{"op":"x","payload":"` + strings.Repeat("p", 60000) + `"}`)
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := c.Send(frame)
		if errors.Is(err, ipc.ErrClosed) {
			break
		}
		if err != nil {
			t.Fatalf("Send: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatal("not cut off by the write timeout")
		}
		time.Sleep(time.Millisecond)
	}
	waitDone(t, c, 5*time.Second)
	if !errors.Is(c.Cause(), os.ErrDeadlineExceeded) {
		t.Fatalf("Cause = %v, want a deadline error", c.Cause())
	}
}

// TestConnCloseFlushes queues more than the socket buffers hold, closes, and
// checks that a late reader still gets every frame, then EOF.
func TestConnCloseFlushes(t *testing.T) {
	a, b := socketPair(t)
	c := ipc.NewConn(a, ipc.Options{})
	const n = 2000 // ~4 MB, well past the kernel's socket buffers
	for i := range n {
		if err := c.SendFrame(&ipc.Frame{Op: "x", ID: fmt.Sprint(i), Payload: testPayload(1, i)}); err != nil {
			t.Fatalf("SendFrame %d: %v", i, err)
		}
	}
	c.Close()
	if err := c.Send([]byte(`{"op":"late"}`)); !errors.Is(err, ipc.ErrClosed) {
		t.Fatalf("Send after Close = %v, want ErrClosed", err)
	}
	select {
	case <-c.Done():
		t.Fatal("Done closed before the peer read the queued frames")
	case <-time.After(50 * time.Millisecond):
	}
	r := ipc.NewReader(b, ipc.DefaultOptions.MaxFrameBytes)
	for i := range n {
		line, err := r.ReadFrame()
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		f, err := ipc.Decode(line)
		if err != nil || f.ID != fmt.Sprint(i) || !bytes.Equal(f.Payload, testPayload(1, i)) {
			t.Fatalf("frame %d wrong: %v %q", i, err, line)
		}
	}
	if _, err := r.ReadFrame(); err != io.EOF {
		t.Fatalf("after the last frame: %v, want EOF", err)
	}
	waitDone(t, c, 5*time.Second)
	if c.Cause() != nil {
		t.Fatalf("Cause = %v after a clean close", c.Cause())
	}
}

// TestConnAbortDrops wedges the writer on a peer that does not read, queues
// marker frames behind it, and checks that Abort drops them at once.
func TestConnAbortDrops(t *testing.T) {
	a, b := socketPair(t)
	c := ipc.NewConn(a, ipc.Options{})
	filler := func(i int) *ipc.Frame {
		return &ipc.Frame{Op: "filler", ID: fmt.Sprint(i), Payload: testPayload(2, i)}
	}
	wedged := func() bool {
		// An idle writer takes the queue within microseconds; one still holding
		// frames after this long is blocked in Write.
		for range 25 {
			if c.Queued() == 0 {
				return false
			}
			time.Sleep(10 * time.Millisecond)
		}
		return true
	}
	for i := 0; ; i++ {
		if i > 100000 {
			t.Fatal("writer never blocked")
		}
		if err := c.SendFrame(filler(i)); err != nil {
			t.Fatal(err)
		}
		if c.Queued() > 0 && wedged() {
			break
		}
	}
	for i := range 100 {
		if err := c.SendFrame(&ipc.Frame{Op: "marker", ID: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
	}
	cause := errors.New("test abort")
	c.Abort(cause)
	waitDone(t, c, 2*time.Second) // at once, though the peer still reads nothing
	if c.Cause() != cause {
		t.Fatalf("Cause = %v, want %v", c.Cause(), cause)
	}
	if err := c.Send([]byte(`{"op":"x"}`)); !errors.Is(err, ipc.ErrClosed) {
		t.Fatalf("Send after Abort = %v, want ErrClosed", err)
	}
	r := ipc.NewReader(b, ipc.DefaultOptions.MaxFrameBytes)
	fillers := 0
	for {
		line, err := r.ReadFrame()
		if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
			break // the write in flight may have been cut mid-frame
		}
		if err != nil {
			t.Fatal(err)
		}
		f, err := ipc.Decode(line)
		if err != nil {
			t.Fatalf("corrupt frame: %v", err)
		}
		if f.Op != "filler" {
			t.Fatalf("frame %+v queued before Abort was written after it", f)
		}
		fillers++
	}
	if fillers == 0 {
		t.Fatal("peer got no frames at all")
	}
}

func TestConnFrameTooLarge(t *testing.T) {
	a, b := socketPair(t)
	c := ipc.NewConn(a, ipc.Options{MaxFrameBytes: 1024})
	if got := c.Options().MaxFrameBytes; got != 1024 {
		t.Fatalf("Options().MaxFrameBytes = %d", got)
	}
	if got := c.Options().MaxQueue; got != ipc.DefaultOptions.MaxQueue {
		t.Fatalf("zero MaxQueue not defaulted: %d", got)
	}
	if c.NetConn() != a {
		t.Fatal("NetConn is not the wrapped connection")
	}
	exact := []byte(`{"op":"x","payload":"` + strings.Repeat("e", 1024-23) + `"}`)
	if len(exact) != 1024 {
		t.Fatalf("test frame is %d bytes", len(exact))
	}
	if err := c.Send(append(exact[:len(exact):len(exact)], ' ')); !errors.Is(err, ipc.ErrFrameTooLarge) {
		t.Fatalf("Send(1025 bytes) = %v, want ErrFrameTooLarge", err)
	}
	big := &ipc.Frame{Op: "x", Payload: json.RawMessage(`"` + strings.Repeat("b", 1024) + `"`)}
	if err := c.SendFrame(big); !errors.Is(err, ipc.ErrFrameTooLarge) {
		t.Fatalf("SendFrame(too large) = %v, want ErrFrameTooLarge", err)
	}
	// The refusals left the queue clean and the connection open.
	if err := c.Send(exact); err != nil {
		t.Fatal(err)
	}
	if err := c.SendFrame(&ipc.Frame{Op: "after"}); err != nil {
		t.Fatal(err)
	}
	c.Close()
	r := ipc.NewReader(b, 1024)
	for _, want := range []string{string(exact), `{"op":"after"}`} {
		line, err := r.ReadFrame()
		if err != nil || string(line) != want {
			t.Fatalf("got %q, %v; want %q", line, err, want)
		}
	}
	if _, err := r.ReadFrame(); err != io.EOF {
		t.Fatalf("got %v, want EOF", err)
	}
	waitDone(t, c, 5*time.Second)
}

// TestConnReadsFrames runs frames both ways between two Conns.
func TestConnReadsFrames(t *testing.T) {
	a, b := socketPair(t)
	ca, cb := ipc.NewConn(a, ipc.Options{}), ipc.NewConn(b, ipc.Options{})
	defer func() { ca.Abort(nil); cb.Abort(nil); <-ca.Done(); <-cb.Done() }()
	for i := range 10 {
		if err := ca.SendFrame(&ipc.Frame{Op: "ping", ID: fmt.Sprint(i)}); err != nil {
			t.Fatal(err)
		}
		line, err := cb.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		f, err := ipc.Decode(line)
		if err != nil || f.ID != fmt.Sprint(i) {
			t.Fatalf("got %q, %v", line, err)
		}
		if err := cb.SendFrame(ipc.Reply(f.ID, json.RawMessage(`"pong"`))); err != nil {
			t.Fatal(err)
		}
		line, err = ca.ReadFrame()
		if err != nil || string(line) != fmt.Sprintf(`{"op":"REPLY","id":"%d","payload":"pong"}`, i) {
			t.Fatalf("got %q, %v", line, err)
		}
	}
	if cb.Buffered() != 0 {
		t.Fatalf("Buffered = %d with nothing sent", cb.Buffered())
	}
}

// TestConnQueueHoldsOneMaxFrame checks that the smallest queue the config
// allows (max_queue_bytes = max_frame_bytes) still takes a frame of the largest
// size, newline and all.
func TestConnQueueHoldsOneMaxFrame(t *testing.T) {
	a, b := socketPair(t)
	c := ipc.NewConn(a, ipc.Options{MaxFrameBytes: 1024, MaxQueueBytes: 1024})
	exact := []byte(`{"op":"x","payload":"` + strings.Repeat("e", 1024-23) + `"}`)
	big := &ipc.Frame{Op: "x", Payload: json.RawMessage(`"` + strings.Repeat("e", 1024-23) + `"`)}
	r := ipc.NewReader(b, 1024)
	for i := range 3 {
		var err error
		if i%2 == 0 {
			err = c.Send(exact)
		} else {
			err = c.SendFrame(big)
		}
		if err != nil {
			t.Fatalf("send %d of a max-size frame: %v", i, err)
		}
		if line, err := r.ReadFrame(); err != nil || !bytes.Equal(line, exact) {
			t.Fatalf("read %d: %v", i, err)
		}
	}
	c.Close()
	waitDone(t, c, 5*time.Second)
}
