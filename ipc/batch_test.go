package ipc_test

import (
	"bufio"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sm-supervisor/sm/ipc"
)

// readFrames reads n frames from r, failing t after d.
func readFrames(t *testing.T, nc net.Conn, r *ipc.Reader, n int, d time.Duration) []string {
	t.Helper()
	nc.SetReadDeadline(time.Now().Add(d))
	defer nc.SetReadDeadline(time.Time{})
	var out []string
	for range n {
		line, err := r.ReadFrame()
		if err != nil {
			t.Fatalf("after %d of %d frames: %v", len(out), n, err)
		}
		out = append(out, string(line))
	}
	return out
}

// TestBatchHoldsBackUntilFlush: frames sent through a Batch leave only at
// Flush, in order, over a real socket (inline write) and over net.Pipe (no
// inline write: the writer goroutine sends them).
func TestBatchHoldsBackUntilFlush(t *testing.T) {
	for _, kind := range []string{"unix", "pipe"} {
		t.Run(kind, func(t *testing.T) {
			var a, b net.Conn
			if kind == "unix" {
				a, b = socketPair(t)
			} else {
				a, b = net.Pipe()
				defer a.Close()
				defer b.Close()
			}
			c := ipc.NewConn(a, ipc.Options{})
			defer func() { c.Abort(nil); waitDone(t, c, 5*time.Second) }()
			r := ipc.NewReader(b, 1<<20)

			var batch ipc.Batch
			for i := range 3 {
				if err := batch.SendFrame(c, &ipc.Frame{Op: "x", ID: strconv.Itoa(i)}); err != nil {
					t.Fatal(err)
				}
			}
			if err := batch.TrySendFrame(c, &ipc.Frame{Op: "x", ID: "3"}); err != nil {
				t.Fatal(err)
			}
			b.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			if line, err := r.ReadFrame(); err == nil {
				t.Fatalf("frame %s left before Flush", line)
			}
			batch.Flush()
			got := readFrames(t, b, r, 4, 5*time.Second)
			for i, line := range got {
				if want := fmt.Sprintf(`{"op":"x","id":"%d"}`, i); line != want {
					t.Fatalf("frame %d = %s, want %s", i, line, want)
				}
			}
			batch.Flush() // nothing held: a no-op
			var nilBatch *ipc.Batch
			nilBatch.Flush()
			if err := nilBatch.SendFrame(c, &ipc.Frame{Op: "now"}); err != nil {
				t.Fatal(err)
			}
			if got := readFrames(t, b, r, 1, 5*time.Second); got[0] != `{"op":"now"}` {
				t.Fatalf("nil batch sent %s", got[0])
			}
		})
	}
}

// TestBatchFlushLargerThanSocket flushes more than the socket buffer holds
// while the peer is not reading, with other goroutines sending at the same
// time: the inline write takes what fits, the writer goroutine the rest, and
// every frame arrives once, in each sender's order.
func TestBatchFlushLargerThanSocket(t *testing.T) {
	a, b := socketPair(t)
	c := ipc.NewConn(a, ipc.Options{})
	defer func() { c.Abort(nil); waitDone(t, c, 5*time.Second) }()
	const perSender, senders = 400, 3
	var wg sync.WaitGroup
	for g := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var batch ipc.Batch
			for i := range perSender {
				f := &ipc.Frame{Op: "x", ID: fmt.Sprintf("%d-%d", g, i), Payload: testPayload(g, i)}
				var err error
				if g == 0 {
					err = c.SendFrame(f) // one plain sender among the batches
				} else {
					err = batch.SendFrame(c, f)
				}
				if err != nil {
					t.Error(err)
					return
				}
				if i%50 == 49 {
					batch.Flush()
				}
			}
			batch.Flush()
		}()
	}
	wg.Wait()
	time.Sleep(20 * time.Millisecond) // let the socket fill while nobody reads
	br := bufio.NewReader(b)
	r := ipc.NewReader(br, 1<<20)
	next := make([]int, senders)
	for _, line := range readFrames(t, b, r, senders*perSender, 10*time.Second) {
		f, err := ipc.Decode([]byte(line))
		if err != nil {
			t.Fatalf("frame %.80s: %v", line, err)
		}
		var g, i int
		fmt.Sscanf(f.ID, "%d-%d", &g, &i)
		if i != next[g] {
			t.Fatalf("sender %d: frame %d arrived when %d was due", g, i, next[g])
		}
		next[g]++
		if string(f.Payload) != string(testPayload(g, i)) {
			t.Fatalf("frame %s: payload changed", f.ID)
		}
	}
}

// TestConnFlushAfterBatch: Conn.Flush counts frames an inline write
// has taken but not finished as still to be written.
func TestConnFlushAfterBatch(t *testing.T) {
	a, b := socketPair(t)
	c := ipc.NewConn(a, ipc.Options{})
	defer func() { c.Abort(nil); waitDone(t, c, 5*time.Second) }()
	var batch ipc.Batch
	for i := range 200 {
		batch.SendFrame(c, &ipc.Frame{Op: "x", ID: strconv.Itoa(i), Payload: testPayload(1, i)})
	}
	batch.Flush()
	done := make(chan error, 1)
	go func() { done <- c.Flush(t.Context()) }()
	r := ipc.NewReader(b, 1<<20)
	readFrames(t, b, r, 200, 10*time.Second)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Flush did not return once everything was read")
	}
}

func TestFrameBuffered(t *testing.T) {
	a, b := socketPair(t)
	c := ipc.NewConn(a, ipc.Options{})
	defer func() { c.Abort(nil); waitDone(t, c, 5*time.Second) }()
	if c.FrameBuffered() {
		t.Fatal("frame buffered before anything was sent")
	}
	b.Write([]byte("{\"op\":\"a\"}\n{\"op\":\"b\"}\n{\"op\""))
	if _, err := c.ReadFrame(); err != nil {
		t.Fatal(err)
	}
	if !c.FrameBuffered() {
		t.Fatal("second frame not reported as buffered")
	}
	if _, err := c.ReadFrame(); err != nil {
		t.Fatal(err)
	}
	if c.FrameBuffered() {
		t.Fatal("a partial frame reported as whole")
	}
}

// TestBatchAfterWriteDeadline: the writer goroutine's write deadline outlives
// its write; an inline write after it has passed must not fail the connection.
func TestBatchAfterWriteDeadline(t *testing.T) {
	a, b := socketPair(t)
	c := ipc.NewConn(a, ipc.Options{WriteTimeout: 20 * time.Millisecond})
	defer func() { c.Abort(nil); waitDone(t, c, 5*time.Second) }()
	r := ipc.NewReader(b, 1<<20)
	if err := c.SendFrame(&ipc.Frame{Op: "first"}); err != nil { // through the writer goroutine
		t.Fatal(err)
	}
	readFrames(t, b, r, 1, 5*time.Second)
	time.Sleep(60 * time.Millisecond) // its deadline is now in the past
	var batch ipc.Batch
	for i := range 3 {
		batch.SendFrame(c, &ipc.Frame{Op: "x", ID: strconv.Itoa(i)})
		batch.Flush()
	}
	readFrames(t, b, r, 3, 5*time.Second)
	if err := c.Cause(); err != nil {
		t.Fatalf("connection cut off: %v", err)
	}
}
