package ipc

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"slices"
	"sync"
	"syscall"
	"time"
)

// Sentinel errors of framed connections.
var (
	// ErrFrameTooLarge is returned by ReadFrame for a line longer than the frame
	// limit. The line has been skipped; the next ReadFrame starts at the next frame.
	ErrFrameTooLarge = errors.New("frame too large")
	// ErrQueueFull means the peer stopped reading: the outbound queue reached its
	// bound, and the connection has been cut off.
	ErrQueueFull = errors.New("outbound queue full: peer is not reading")
	// ErrBusy is returned by Batch.TrySendFrame when the outbound queue is half full.
	// Unlike ErrQueueFull it leaves the connection open.
	ErrBusy = errors.New("outbound queue busy")
	// ErrClosed is returned by Send on a connection that is closing or closed.
	ErrClosed = errors.New("connection closed")
	// ErrTimeout is returned by a request whose deadline passed with no reply.
	ErrTimeout = errors.New("request timed out")
	// ErrUnavailable is returned by a request made while the client is not connected.
	ErrUnavailable = errors.New("not connected to the manager")
)

// Reader splits a byte stream into frames: one JSON object per line, at most max
// bytes (the newline not counted). An oversized line is skipped to its end so the
// stream stays in sync, and reported as ErrFrameTooLarge.
//
// A read error other than EOF (a read deadline, say) does not lose the line being
// read: the next ReadFrame carries on from where the error struck.
type Reader struct {
	br       *bufio.Reader
	max      int
	acc      []byte
	partial  bool // acc holds the start of a line that a read error interrupted
	skipping bool // inside an oversized line that a read error interrupted
}

// NewReader returns a Reader of r with the frame limit max.
func NewReader(r io.Reader, max int) *Reader {
	size := 64 << 10
	if max < size-1 {
		size = max + 1
	}
	if size < 16 {
		size = 16
	}
	return &Reader{br: bufio.NewReaderSize(r, size), max: max}
}

// ReadFrame returns the next non-blank line without its newline. The slice is
// valid only until the next call. At the end of the stream it returns io.EOF, or
// io.ErrUnexpectedEOF if the stream stopped inside a frame.
func (r *Reader) ReadFrame() ([]byte, error) {
	for {
		line, err := r.readLine()
		if err != nil {
			return nil, err
		}
		if isBlank(line) {
			continue
		}
		return line, nil
	}
}

// isBlank reports whether b holds only JSON whitespace. Other Unicode spaces are
// left for Decode to refuse, as any peer's JSON parser would.
func isBlank(b []byte) bool {
	for _, c := range b {
		if c != ' ' && c != '\t' && c != '\r' && c != '\n' {
			return false
		}
	}
	return true
}

func (r *Reader) readLine() ([]byte, error) {
	if !r.partial {
		r.acc = r.acc[:0]
	}
	r.partial = false
	for {
		if r.skipping {
			if err := r.skipLine(); err != nil {
				return nil, err
			}
			return nil, ErrFrameTooLarge
		}
		chunk, err := r.br.ReadSlice('\n')
		switch {
		case err == nil:
			if len(r.acc) == 0 {
				line := chunk[:len(chunk)-1]
				if len(line) > r.max {
					return nil, ErrFrameTooLarge
				}
				return line, nil
			}
			r.acc = append(r.acc, chunk[:len(chunk)-1]...)
			if len(r.acc) > r.max {
				r.acc = r.acc[:0]
				return nil, ErrFrameTooLarge
			}
			return r.acc, nil
		case errors.Is(err, bufio.ErrBufferFull):
			if len(r.acc)+len(chunk) > r.max {
				r.acc = r.acc[:0]
				r.skipping = true
				continue
			}
			r.acc = append(r.acc, chunk...)
		case err == io.EOF:
			// Trailing blanks end the stream cleanly; anything else, or a tail
			// over the limit (which would have been too large), was cut short.
			if len(r.acc)+len(chunk) > r.max || !isBlank(r.acc) || !isBlank(chunk) {
				err = io.ErrUnexpectedEOF
			}
			r.acc = r.acc[:0]
			return nil, err
		default:
			// Keep what was read so a retry continues this line instead of
			// reading its tail as a frame of its own.
			if len(r.acc)+len(chunk) > r.max {
				r.acc = r.acc[:0]
				r.skipping = true
			} else {
				r.acc = append(r.acc, chunk...)
				r.partial = true
			}
			return nil, err
		}
	}
}

// skipLine discards input up to and including the next newline. On an error it
// leaves r.skipping set, so a retry goes on skipping.
func (r *Reader) skipLine() error {
	for {
		_, err := r.br.ReadSlice('\n')
		switch {
		case err == nil:
			r.skipping = false
			return nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err == io.EOF:
			r.skipping = false
			return io.ErrUnexpectedEOF
		default:
			return err
		}
	}
}

// frameBuffered reports whether a whole line already waits in the buffer.
func (r *Reader) frameBuffered() bool {
	b, _ := r.br.Peek(r.br.Buffered())
	return bytes.IndexByte(b, '\n') >= 0
}

// Options bound a Conn. Zero fields take the defaults of DefaultOptions.
type Options struct {
	MaxFrameBytes int           // largest frame accepted or sent
	MaxQueue      int           // frames waiting to be written before the peer is cut off
	MaxQueueBytes int           // bytes waiting to be written before the peer is cut off
	WriteTimeout  time.Duration // longest a single write to the peer may block
}

// DefaultOptions are the protocol defaults (config keys max_frame_bytes,
// max_queue, max_queue_bytes and write_timeout).
var DefaultOptions = Options{
	MaxFrameBytes: 1 << 20,
	MaxQueue:      4096,
	MaxQueueBytes: 64 << 20,
	WriteTimeout:  10 * time.Second,
}

func (o Options) withDefaults() Options {
	if o.MaxFrameBytes <= 0 {
		o.MaxFrameBytes = DefaultOptions.MaxFrameBytes
	}
	if o.MaxQueue <= 0 {
		o.MaxQueue = DefaultOptions.MaxQueue
	}
	if o.MaxQueueBytes <= 0 {
		o.MaxQueueBytes = DefaultOptions.MaxQueueBytes
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = DefaultOptions.WriteTimeout
	}
	return o
}

// Conn is a framed connection. One goroutine reads (ReadFrame); any goroutine may
// Send. Sends never block: they append to a bounded queue that a writer goroutine
// drains in as few syscalls as it can, so frames that arrive together go out
// together. Sends through a Batch are written by the Batch's Flush instead, when
// the socket takes them at once. A peer that stops reading fills the queue and is
// cut off.
type Conn struct {
	nc   net.Conn
	r    *Reader
	opts Options

	mu      sync.Mutex
	out     []byte // frames waiting for the writer, newline-terminated
	queued  int    // frames in out
	closing bool   // no more sends; the writer flushes, then closes nc
	cause   error  // why the connection ended, if not a clean close

	written uint64 // bytes the writer has handed to the socket, under mu

	// One goroutine at a time writes: the writer goroutine, or a Batch's Flush
	// writing inline. It holds the token writing, the inflight bytes it took
	// from out, and spare, the buffer out is swapped with.
	writing  bool
	inflight int
	spare    []byte
	raw      syscall.RawConn // for inline writes that must not block; nil: none

	wake chan struct{}
	done chan struct{}
}

// NewConn wraps nc and starts its writer goroutine. The caller must eventually
// Close or Abort it (a read error does neither).
func NewConn(nc net.Conn, opts Options) *Conn {
	opts = opts.withDefaults()
	c := &Conn{
		nc:   nc,
		r:    NewReader(nc, opts.MaxFrameBytes),
		opts: opts,
		wake: make(chan struct{}, 1),
		done: make(chan struct{}),
	}
	if sc, ok := nc.(syscall.Conn); ok {
		c.raw, _ = sc.SyscallConn()
	}
	go c.writeLoop()
	return c
}

// NetConn returns the underlying connection, for peer credentials and addresses.
func (c *Conn) NetConn() net.Conn { return c.nc }

// ReadFrame returns the next frame's bytes; see Reader.ReadFrame.
func (c *Conn) ReadFrame() ([]byte, error) { return c.r.ReadFrame() }

// FrameBuffered reports whether a whole frame already waits in the input
// buffer, so that the next ReadFrame returns without reading the socket.
func (c *Conn) FrameBuffered() bool { return c.r.frameBuffered() }

// Send queues an encoded frame (without newline). It fails with ErrClosed once the
// connection is closing, with ErrFrameTooLarge for a frame over the limit, and
// with ErrQueueFull, cutting the connection off, when the peer is not reading.
func (c *Conn) Send(frame []byte) error {
	if len(frame) > c.opts.MaxFrameBytes {
		return ErrFrameTooLarge
	}
	c.mu.Lock()
	if err := c.admitLocked(len(frame) + 1); err != nil {
		c.mu.Unlock()
		return err
	}
	c.out = append(c.out, frame...)
	c.out = append(c.out, '\n')
	c.queued++
	c.mu.Unlock()
	c.kick()
	return nil
}

// SendFrame encodes f straight into the queue; see Send.
func (c *Conn) SendFrame(f *Frame) error { return c.sendFrame(f, false, nil) }

// sendFrame queues f and has it written: by the writer goroutine, or, with a
// batch, when the batch is flushed.
func (c *Conn) sendFrame(f *Frame, try bool, b *Batch) error {
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return ErrClosed
	}
	// Encode in place, then admit (or take back) the frame at its real size: the
	// queue bound counts every byte, not just the payload.
	start := len(c.out)
	c.out = AppendFrame(c.out, f)
	n := len(c.out) - start
	c.out = c.out[:start]
	if n > c.opts.MaxFrameBytes {
		c.mu.Unlock()
		return ErrFrameTooLarge
	}
	if try && c.queued > 0 && (c.queued >= c.opts.MaxQueue/2 || start+n+1 > c.opts.MaxQueueBytes/2) {
		c.mu.Unlock()
		return ErrBusy
	}
	if err := c.admitLocked(n + 1); err != nil {
		c.mu.Unlock()
		return err
	}
	c.out = append(c.out[:start+n], '\n')
	c.queued++
	c.mu.Unlock()
	if b != nil {
		b.add(c)
		return nil
	}
	c.kick()
	return nil
}

func (c *Conn) admitLocked(n int) error {
	if c.closing {
		return ErrClosed
	}
	// A frame always fits an empty queue: MaxQueueBytes may equal MaxFrameBytes.
	if c.queued >= c.opts.MaxQueue || (len(c.out) > 0 && len(c.out)+n > c.opts.MaxQueueBytes) {
		c.closing = true
		c.cause = ErrQueueFull
		c.out = c.out[:0]
		// Closing nc unblocks a writer stuck in Write on a peer that stopped reading.
		c.nc.Close()
		c.kick()
		return ErrQueueFull
	}
	return nil
}

func (c *Conn) kick() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *Conn) writeLoop() {
	defer close(c.done)
	defer c.nc.Close()
	for range c.wake {
		for {
			c.mu.Lock()
			if c.writing {
				// A Batch is writing inline; it kicks again if it leaves anything.
				c.mu.Unlock()
				break
			}
			if len(c.out) == 0 {
				closing := c.closing
				c.mu.Unlock()
				if closing {
					return
				}
				break
			}
			buf := c.takeLocked()
			c.mu.Unlock()
			c.nc.SetWriteDeadline(time.Now().Add(c.opts.WriteTimeout))
			n, err := c.nc.Write(buf)
			c.mu.Lock()
			c.wroteLocked(buf, n)
			c.mu.Unlock()
			if err != nil {
				c.fail(err)
				return
			}
		}
	}
}

// takeLocked takes the write token and the queue to write.
func (c *Conn) takeLocked() []byte {
	buf := c.out
	c.out = c.spare[:0]
	c.spare = nil
	c.queued = 0
	c.writing, c.inflight = true, len(buf)
	return buf
}

// wroteLocked gives the token back once n bytes of buf are written. What the
// socket did not take goes back to the front of the queue.
func (c *Conn) wroteLocked(buf []byte, n int) {
	c.writing, c.inflight = false, 0
	c.written += uint64(n)
	if n < len(buf) {
		rest := append(buf[:0], buf[n:]...)
		c.queued += bytes.Count(rest, newline)
		c.out, c.spare = append(rest, c.out...), c.out[:0]
	} else {
		// Keep the buffer for the next batch unless a burst made it huge:
		// an idle connection should not pin megabytes.
		c.spare = buf[:0]
	}
	if cap(c.spare) > maxSpare {
		c.spare = nil
	}
}

var newline = []byte{'\n'}

// writeInline writes the queue from the calling goroutine, if nobody else is
// writing and the socket takes it without blocking; whatever is left goes to
// the writer goroutine.
func (c *Conn) writeInline() {
	c.mu.Lock()
	if c.writing || c.closing || len(c.out) == 0 || c.raw == nil {
		c.mu.Unlock()
		c.kick()
		return
	}
	buf := c.takeLocked()
	c.mu.Unlock()
	n, err := writeNonBlocking(c.raw, buf)
	c.mu.Lock()
	c.wroteLocked(buf, n)
	more := len(c.out) > 0 || c.closing
	c.mu.Unlock()
	if err != nil {
		c.fail(err) // the writer goroutine, kicked, sees closing and ends
		more = true
	}
	if more {
		c.kick()
	}
}

// Batch holds back the writes of the frames sent through it until Flush,
// which writes each connection's queue straight from the flushing goroutine
// when nobody else is writing to it. A goroutine that forwards what it reads
// sends through a Batch and flushes when its input holds no whole frame: frames
// read together leave together, in one write per connection, and a lone frame
// leaves without waking the writer goroutine, which is most of a round trip's
// cost at low load (docs/performance.md). A Batch belongs to one goroutine; the
// zero Batch is ready to use, and a nil *Batch sends at once.
type Batch struct{ conns []*Conn }

// SendFrame is c.SendFrame, with the write held back until Flush.
func (b *Batch) SendFrame(c *Conn, f *Frame) error { return c.sendFrame(f, false, b) }

// TrySendFrame is SendFrame for frames that may be refused instead, such as
// requests forwarded on other peers' behalf, with the write held back until
// Flush: once c's queue is half full (in frames or bytes) it returns ErrBusy
// and leaves the connection alone. The other half is kept for what the peer
// is owed, replies and notifications, so a burst of someone else's requests
// cannot get a briefly slow peer cut off.
func (b *Batch) TrySendFrame(c *Conn, f *Frame) error { return c.sendFrame(f, true, b) }

// Flush writes everything b holds back.
func (b *Batch) Flush() {
	if b == nil {
		return
	}
	for i, c := range b.conns {
		c.writeInline()
		b.conns[i] = nil
	}
	b.conns = b.conns[:0]
}

func (b *Batch) add(c *Conn) {
	if !slices.Contains(b.conns, c) {
		b.conns = append(b.conns, c)
	}
}

// Flush waits until every frame queued before the call has been written to
// the socket (the kernel then delivers it even if this end closes), or until
// ctx is done or the connection fails.
func (c *Conn) Flush(ctx context.Context) error {
	c.mu.Lock()
	target := c.written + uint64(c.inflight+len(c.out))
	c.mu.Unlock()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		c.mu.Lock()
		done, cause := c.written >= target, c.cause
		c.mu.Unlock()
		switch {
		case done:
			return nil
		case cause != nil:
			return cause
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-c.done:
			return ErrClosed
		case <-tick.C:
		}
	}
}

// maxSpare bounds the write buffer a Conn keeps between bursts.
const maxSpare = 1 << 20

// fail records err as the cause (unless there is one) and drops the queue:
// the connection is closing.
func (c *Conn) fail(err error) {
	c.mu.Lock()
	if c.cause == nil {
		c.cause = err
	}
	c.closing = true
	c.out = nil
	c.mu.Unlock()
}

// Close stops accepting sends, lets the writer flush what is queued (bounded by
// the write timeout), then closes the socket. It does not wait; see Done.
func (c *Conn) Close() {
	c.mu.Lock()
	c.closing = true
	c.mu.Unlock()
	c.kick()
}

// Abort closes the socket at once, dropping anything queued, and records cause.
func (c *Conn) Abort(cause error) {
	c.fail(cause)
	c.nc.Close()
	c.kick()
}

// Done is closed once the writer has stopped and the socket is closed.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Cause returns why the connection was cut off (ErrQueueFull, a write error, or
// what Abort was given), or nil.
func (c *Conn) Cause() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cause
}
