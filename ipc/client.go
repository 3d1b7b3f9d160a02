package ipc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/sm-supervisor/sm/backoff"
)

// ClientConfig describes a client of the manager's socket.
type ClientConfig struct {
	// Path of the manager's Unix socket.
	Path string
	// Register is the REGISTER frame sent on every (re)connection; its ID is set
	// by the client.
	Register Frame
	// Options bound the connection; zero fields take DefaultOptions.
	Options Options
	// Handler receives every incoming frame that is not a REPLY to one of this
	// client's requests: business ops to answer (with Client.Reply) and
	// notifications such as ACTIVATE and QUIESCE. It runs on the read goroutine
	// and must not block.
	Handler func(c *Client, f *Frame)
	// OnConnect is called with the REGISTER reply after each registration.
	OnConnect func(c *Client, reply *Frame)
	// Reconnect makes the client reconnect with backoff when the connection is
	// lost. Without it, Run returns after the first connection ends.
	Reconnect bool
	// Backoff paces reconnection attempts; zero means 50ms..5s, ±20%.
	Backoff backoff.Policy
	// RegisterTimeout bounds the wait for the REGISTER reply (default 10s).
	RegisterTimeout time.Duration
	// Logger receives connection events; nil discards them.
	Logger *slog.Logger
}

// ErrRegisterRefused wraps the manager's refusal of a REGISTER; a client does
// not retry it, since the same frame would be refused again.
var ErrRegisterRefused = errors.New("register refused")

// Client is a connection to the manager that registers, correlates requests with
// replies by id, dispatches incoming ops to a handler and, if asked, reconnects.
type Client struct {
	cfg ClientConfig
	log *slog.Logger

	mu      sync.Mutex
	conn    *Conn // nil while disconnected
	pending map[string]chan *Frame
	nextID  uint64
	ready   chan struct{} // closed while connected; replaced on disconnect
	stopped bool
	stopc   chan struct{} // closed when Run returns, to release WaitConnected

	cancel context.CancelFunc
	runErr chan error
}

// NewClient returns a client that connects when Run is called.
func NewClient(cfg ClientConfig) *Client {
	if cfg.Backoff.Min == 0 {
		cfg.Backoff = backoff.Policy{Min: 50 * time.Millisecond, Max: 5 * time.Second, Jitter: 0.2}
	}
	if cfg.RegisterTimeout == 0 {
		cfg.RegisterTimeout = 10 * time.Second
	}
	cfg.Options = cfg.Options.withDefaults()
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Client{
		cfg:     cfg,
		log:     log,
		pending: make(map[string]chan *Frame),
		ready:   make(chan struct{}),
		stopc:   make(chan struct{}),
	}
}

// Dial connects and registers, then keeps the connection (and, with
// cfg.Reconnect, reconnects) in the background until Close.
func Dial(ctx context.Context, cfg ClientConfig) (*Client, error) {
	c := NewClient(cfg)
	runCtx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	c.runErr = make(chan error, 1)
	first := make(chan error, 1)
	go func() { c.runErr <- c.run(runCtx, first) }()
	select {
	case err := <-first:
		if err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	case <-ctx.Done():
		c.Close()
		return nil, ctx.Err()
	}
}

// Close stops a client made by Dial and waits for its goroutines.
func (c *Client) Close() error {
	if c.cancel == nil {
		return nil
	}
	c.cancel()
	err := <-c.runErr
	c.runErr <- err
	return err
}

// Run connects, registers and serves the connection until ctx is done (a nil
// return) or, without Reconnect, until the connection ends. A refused REGISTER
// ends it with an error wrapping ErrRegisterRefused.
func (c *Client) Run(ctx context.Context) error { return c.run(ctx, nil) }

func (c *Client) run(ctx context.Context, first chan<- error) error {
	report := func(err error) {
		if first != nil {
			first <- err
			first = nil
		}
	}
	defer func() {
		c.mu.Lock()
		if !c.stopped {
			c.stopped = true
			close(c.stopc)
		}
		c.mu.Unlock()
	}()
	attempt := 0
	for {
		err := c.session(ctx, func() { attempt = 0; report(nil) })
		if ctx.Err() != nil {
			report(ctx.Err())
			return nil
		}
		if errors.Is(err, ErrRegisterRefused) || !c.cfg.Reconnect {
			report(err)
			return err
		}
		delay := c.cfg.Backoff.Delay(attempt, rand.Float64())
		attempt++
		c.log.Info("ipc: disconnected, reconnecting", "err", err, "delay", delay)
		select {
		case <-ctx.Done():
			report(ctx.Err())
			return nil
		case <-time.After(delay):
		}
	}
}

// session runs one connection: dial, REGISTER, read until it ends.
func (c *Client) session(ctx context.Context, registered func()) error {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", c.cfg.Path)
	if err != nil {
		return fmt.Errorf("dial %s: %w", c.cfg.Path, err)
	}
	conn := NewConn(nc, c.cfg.Options)
	defer func() { conn.Abort(nil); <-conn.Done() }()
	stop := context.AfterFunc(ctx, func() { conn.Abort(context.Canceled) })
	defer stop()

	reg := c.cfg.Register
	reg.Op = OpRegister
	reg.ID = "register"
	if err := conn.SendFrame(&reg); err != nil {
		return fmt.Errorf("send REGISTER: %w", err)
	}
	nc.SetReadDeadline(time.Now().Add(c.cfg.RegisterTimeout))
	line, err := conn.ReadFrame()
	if err != nil {
		return fmt.Errorf("read REGISTER reply: %w", err)
	}
	nc.SetReadDeadline(time.Time{})
	reply, err := Decode(line)
	if err != nil {
		return fmt.Errorf("REGISTER reply: %w", err)
	}
	if reply.Op != OpReply {
		return fmt.Errorf("REGISTER answered with %s, not %s", reply.Op, OpReply)
	}
	if reply.Error != nil {
		if reply.Error.Code == CodeUnavailable || reply.Error.Code == CodeShuttingDown || reply.Error.Code == CodeBusy {
			return fmt.Errorf("register: %w", reply.Error)
		}
		return fmt.Errorf("%w: %w", ErrRegisterRefused, reply.Error)
	}

	c.mu.Lock()
	c.conn = conn
	close(c.ready)
	c.mu.Unlock()
	defer c.disconnected()
	if c.cfg.OnConnect != nil {
		c.cfg.OnConnect(c, reply)
	}
	registered()

	var dec Decoder
	for {
		line, err := conn.ReadFrame()
		if err != nil {
			if errors.Is(err, ErrFrameTooLarge) {
				c.log.Warn("ipc: dropped oversized frame from manager")
				continue
			}
			if cause := conn.Cause(); cause != nil && !errors.Is(cause, context.Canceled) {
				return cause
			}
			return err
		}
		f, err := dec.Decode(line)
		if err != nil {
			c.log.Warn("ipc: undecodable frame from manager", "err", err)
			continue
		}
		if f.Op == OpReply && f.ID != "" && c.complete(f) {
			continue
		}
		if c.cfg.Handler != nil {
			c.cfg.Handler(c, f)
		}
	}
}

func (c *Client) complete(f *Frame) bool {
	c.mu.Lock()
	ch, ok := c.pending[f.ID]
	if ok {
		delete(c.pending, f.ID)
	}
	c.mu.Unlock()
	if ok {
		ch <- f
	}
	return ok
}

// disconnected fails every pending request: its reply can no longer arrive.
func (c *Client) disconnected() {
	c.mu.Lock()
	c.conn = nil
	c.ready = make(chan struct{})
	pending := c.pending
	c.pending = make(map[string]chan *Frame)
	c.mu.Unlock()
	for id, ch := range pending {
		ch <- ReplyError(id, Errorf(CodeUnavailable, "connection to the manager lost"))
	}
}

// Connected reports whether the client is registered right now.
func (c *Client) Connected() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conn != nil
}

// WaitConnected blocks until the client is registered, ctx is done, or Run has
// returned (ErrClosed).
func (c *Client) WaitConnected(ctx context.Context) error {
	c.mu.Lock()
	ready, stopped := c.ready, c.stopped
	c.mu.Unlock()
	if stopped {
		return ErrClosed
	}
	select {
	case <-ready:
		return nil
	case <-c.stopc:
		return ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

// current is the connection, or ErrUnavailable while there is none.
func (c *Client) current() (*Conn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		return nil, ErrUnavailable
	}
	return c.conn, nil
}

// Send queues a frame with no reply expected.
func (c *Client) Send(f *Frame) error {
	conn, err := c.current()
	if err != nil {
		return err
	}
	return conn.SendFrame(f)
}

// Flush waits until every frame sent so far has been written to the socket,
// so that it reaches the manager even if the process exits right after.
func (c *Client) Flush(ctx context.Context) error {
	conn, err := c.current()
	if err != nil {
		return err
	}
	return conn.Flush(ctx)
}

// Reply answers request id with a payload or, if e is not nil, an error.
func (c *Client) Reply(id string, payload json.RawMessage, e *Error) error {
	if id == "" {
		return nil
	}
	if e != nil {
		return c.Send(ReplyError(id, e))
	}
	return c.Send(Reply(id, payload))
}

// Request sends f with a fresh id and waits for its REPLY until ctx is done
// (ErrTimeout). A REPLY carrying an error is returned as that *Error, with the
// reply frame. Without a connection it fails at once with ErrUnavailable.
func (c *Client) Request(ctx context.Context, f *Frame) (*Frame, error) {
	ch := make(chan *Frame, 1)
	c.mu.Lock()
	conn := c.conn
	if conn == nil {
		c.mu.Unlock()
		return nil, ErrUnavailable
	}
	c.nextID++
	id := strconv.FormatUint(c.nextID, 36)
	c.pending[id] = ch
	c.mu.Unlock()

	req := *f
	req.ID = id
	if err := conn.SendFrame(&req); err != nil {
		c.forget(id)
		return nil, fmt.Errorf("send %s: %w", f.Op, err)
	}
	select {
	case reply := <-ch:
		if reply.Error != nil {
			return reply, reply.Error
		}
		return reply, nil
	case <-ctx.Done():
		c.forget(id)
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, ErrTimeout
		}
		return nil, ctx.Err()
	}
}

func (c *Client) forget(id string) {
	c.mu.Lock()
	delete(c.pending, id)
	c.mu.Unlock()
}
