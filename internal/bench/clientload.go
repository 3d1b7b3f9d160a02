package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sm-supervisor/sm/ipc"
)

// clientLoad is a steady request load through ipc.Client connections that
// reconnect: the load of the scenarios in which the manager itself goes away
// (manager-kill) or that run long (scale, soak). Unlike a pipe it survives a
// lost connection, and each worker waits until its client is connected again
// before it sends, so that only requests truly in flight when a connection
// dies can fail.
//
// Each of its workers keeps one request in flight (or, with a rate, one at a
// time at that pace), so the requests in flight never exceed the worker count.
//
// Its books are exact like a pipe's: every request sent ends in exactly one of
// OK, Errors (by code; ipc.Client answers those in flight on a lost connection
// with "unavailable") or Lost (no reply within the request timeout). A REPLY
// whose id is no longer awaited (a second reply, or one after the bench gave
// up) is counted a duplicate; a REPLY without id (the manager's unknown_id
// notices) is counted unknown.
type clientLoad struct {
	clients []*ipc.Client
	cfg     clientLoadConfig
	stop    context.CancelFunc
	done    sync.WaitGroup

	mu      sync.Mutex
	books   books
	lat     histogram
	notSent uint64 // attempts refused locally: the client had no connection
	// mark and resumed: the first OK reply that came after mark (see resumedAfter).
	mark, resumed time.Time
	// failures are the error replies, in order, for the scenarios that
	// check each against the windows in which errors are allowed.
	failures []loadFailure
	dropped  uint64 // failures past maxFailures, not kept

	dup, unknown atomic.Uint64
}

type clientLoadConfig struct {
	socket  string
	clients int // connections, the workers spread over them
	workers int // requests in flight at most
	// rate is requests per second over all workers; 0 is closed-loop: each
	// worker sends its next request as soon as the last is answered.
	rate float64
	// target names worker w's target for its n-th request.
	target  func(w int, n uint64) string
	payload []byte
	// timeout bounds the wait for each reply; past it the request is lost.
	// Keep it above the manager's requests.timeout, which always answers first.
	timeout time.Duration
}

// startClientLoad connects cfg.clients clients (with Reconnect) and starts the
// workers. It returns once every client has registered.
func startClientLoad(ctx context.Context, cfg clientLoadConfig) (*clientLoad, error) {
	l := &clientLoad{cfg: cfg}
	for i := range max(cfg.clients, 1) {
		c, err := dialRetry(ctx, cfg.socket, fmt.Sprintf("sm-bench-load-%d", i), true, l.handle)
		if err != nil {
			l.closeClients()
			return nil, err
		}
		l.clients = append(l.clients, c)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	l.stop = cancel
	for w := range cfg.workers {
		l.done.Add(1)
		go l.worker(runCtx, w, l.clients[w%len(l.clients)])
	}
	return l, nil
}

// handle receives the frames that are not replies to a pending request.
func (l *clientLoad) handle(_ *ipc.Client, f *ipc.Frame) {
	if f.Op != ipc.OpReply {
		return
	}
	if f.ID != "" {
		l.dup.Add(1)
	} else {
		l.unknown.Add(1)
	}
}

func (l *clientLoad) worker(ctx context.Context, w int, c *ipc.Client) {
	defer l.done.Done()
	var interval time.Duration
	if l.cfg.rate > 0 {
		interval = time.Duration(float64(l.cfg.workers) / l.cfg.rate * float64(time.Second))
	}
	// Spread the workers' first sends over one interval.
	next := time.Now().Add(interval * time.Duration(w) / time.Duration(max(l.cfg.workers, 1)))
	var n uint64
	for ctx.Err() == nil {
		if interval > 0 {
			next = nextSend(next, interval, time.Now())
			if sleep(ctx, time.Until(next)) != nil {
				return
			}
		}
		if c.WaitConnected(ctx) != nil {
			return
		}
		req := ipc.Frame{Op: "echo", Target: l.cfg.target(w, n), Payload: l.cfg.payload}
		n++
		// The request's own deadline is not ctx: a stop lets it finish.
		rctx, cancel := context.WithTimeout(context.Background(), l.cfg.timeout)
		sent := time.Now()
		reply, err := c.Request(rctx, &req)
		cancel()
		l.account(sent, req.Target, reply, err)
		if reply == nil && err != nil && !errors.Is(err, ipc.ErrTimeout) {
			// Not sent: the connection went away under us. Wait for the
			// client to notice rather than spin.
			sleep(ctx, time.Millisecond)
		}
	}
}

// nextSend paces a worker: the next send is one interval after the last one
// planned, or now if the worker fell behind by more than an interval (no
// burst to catch up).
func nextSend(planned time.Time, interval time.Duration, now time.Time) time.Time {
	t := planned.Add(interval)
	if now.Sub(t) > interval {
		return now
	}
	return t
}

// loadFailure is one error reply.
type loadFailure struct {
	sent, at time.Time
	target   string
	code     string
}

// maxFailures bounds the failures a load keeps.
const maxFailures = 100_000

func (l *clientLoad) fail(f loadFailure) {
	l.books.Sent++
	l.books.addError(f.code)
	if len(l.failures) < maxFailures {
		l.failures = append(l.failures, f)
	} else {
		l.dropped++
	}
}

func (l *clientLoad) account(sent time.Time, target string, reply *ipc.Frame, err error) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case reply != nil && reply.Error != nil:
		l.fail(loadFailure{sent: sent, at: now, target: target, code: reply.Error.Code})
	case reply != nil && !bytes.Equal(reply.Payload, l.cfg.payload):
		l.fail(loadFailure{sent: sent, at: now, target: target, code: codeBadPayload})
	case reply != nil:
		l.books.Sent++
		l.books.OK++
		l.lat.Record(now.Sub(sent))
		if !l.mark.IsZero() && l.resumed.IsZero() && sent.After(l.mark) {
			l.resumed = now
		}
	case errors.Is(err, ipc.ErrTimeout):
		l.books.Sent++
		l.books.Lost++
	default:
		// ipc.ErrUnavailable (no connection) or a send error: the request
		// never left this process.
		l.notSent++
	}
}

// snapshot returns the books so far, duplicates and unknown replies included.
func (l *clientLoad) snapshot() books {
	l.mu.Lock()
	b := l.books
	b.Errors = nil
	b.Add(books{Errors: l.books.Errors})
	l.mu.Unlock()
	b.Duplicates = l.dup.Load()
	b.Unknown = l.unknown.Load()
	return b
}

// setMark forgets the last resumedAfter and watches for the first request
// sent after t that is answered OK.
func (l *clientLoad) setMark(t time.Time) {
	l.mu.Lock()
	l.mark, l.resumed = t, time.Time{}
	l.mu.Unlock()
}

// resumedAt is when the first request sent after the mark was answered OK
// (zero if none has been yet).
func (l *clientLoad) resumedAt() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.resumed
}

// failuresSoFar returns a copy of the failures kept so far.
func (l *clientLoad) failuresSoFar() []loadFailure {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.failures)
}

// latency returns a copy of the OK replies' round trips so far.
func (l *clientLoad) latency() histogram {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lat
}

// end stops the workers, lets the requests in flight finish (each within the
// request timeout), closes the clients and returns the final books.
func (l *clientLoad) end() books {
	l.stop()
	l.done.Wait()
	l.closeClients()
	return l.snapshot()
}

func (l *clientLoad) closeClients() {
	for _, c := range l.clients {
		c.Close()
	}
}

// sub returns the books of what happened between snapshots a and b (b later).
func (b books) sub(a books) books {
	d := books{
		Sent: b.Sent - a.Sent, OK: b.OK - a.OK, Lost: b.Lost - a.Lost,
		Duplicates: b.Duplicates - a.Duplicates, Unknown: b.Unknown - a.Unknown,
	}
	for code, n := range b.Errors {
		if n > a.Errors[code] {
			d.addError(code)
			d.Errors[code] = n - a.Errors[code]
		}
	}
	return d
}

// dialRetry connects to the manager's socket as a client, retrying while the
// socket does not answer (a manager starting), for at most startTimeout.
func dialRetry(ctx context.Context, socket, name string, reconnect bool, handler func(*ipc.Client, *ipc.Frame)) (*ipc.Client, error) {
	deadline := time.Now().Add(startTimeout)
	for {
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		c, err := ipc.Dial(dctx, ipc.ClientConfig{
			Path:      socket,
			Register:  ipc.Frame{Role: ipc.RoleClient, Name: name},
			Reconnect: reconnect,
			Handler:   handler,
		})
		cancel()
		if err == nil {
			return c, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("connect to %s: %w", socket, err)
		}
		if sleep(ctx, 10*time.Millisecond) != nil {
			return nil, ctx.Err()
		}
	}
}

// clusterTarget spreads worker w's requests over every cluster: its n-th
// request goes to cluster (w + n·workers) mod clusters, so that with as many
// workers as clusters each worker keeps to its own cluster.
func clusterTarget(clusters, workers int) func(w int, n uint64) string {
	return func(w int, n uint64) string {
		return strconv.Itoa(int((uint64(w) + n*uint64(workers)) % uint64(clusters)))
	}
}
