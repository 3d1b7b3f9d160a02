package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/sm-supervisor/sm/ipc"
)

// pipe is the bench's side of one framed connection: requests go out
// pipelined, replies are matched by id, and every id is accounted for. The
// direct and the routed measurements both drive their load through a pipe, so
// the client costs the same on both sides of the ratio.
//
// A pipe is used by one goroutine at a time; ids are unique over its life, so
// a late reply to an earlier load is still recognised as a duplicate or a loss.
type pipe struct {
	conn *ipc.Conn
	// other receives frames that are not REPLYs (a cluster's HEARTBEATs, or
	// its requests); nil drops them.
	other func(f *ipc.Frame)

	next        uint64
	outstanding map[uint64]time.Time // id → when it was sent
	answered    bitset
	abandoned   map[uint64]bool // probes call gave up on: a late reply is no fault
	buf         []byte
}

func newPipe(conn *ipc.Conn, other func(f *ipc.Frame)) *pipe {
	return &pipe{conn: conn, other: other, outstanding: make(map[uint64]time.Time), abandoned: make(map[uint64]bool)}
}

// close closes the pipe's connection and waits until it is done.
func (p *pipe) close() {
	p.conn.Close()
	<-p.conn.Done()
}

// load is one closed-loop measurement: window requests in flight, each reply
// sending the next, for warmup and then duration; then no new requests and a
// wait of at most drain for the last replies.
type load struct {
	request  ipc.Frame // op, target, payload; the pipe sets the id
	window   int
	warmup   time.Duration
	duration time.Duration
	drain    time.Duration
	// expect, if set, is the payload every OK reply must carry.
	expect []byte
	// onWindow is called on the reading goroutine as the measured window
	// opens (true) and closes (false), to sample process counters.
	onWindow func(open bool)
}

// loadResult is what a load measured.
type loadResult struct {
	books
	// Latency holds the round trips of the OK replies inside the window.
	Latency histogram
	// Completed counts the replies inside the window.
	Completed uint64
	// Window is the measured window's real length, first reply to last.
	Window time.Duration
}

// Throughput is replies per second inside the window.
func (r *loadResult) Throughput() float64 {
	if r.Window <= 0 {
		return 0
	}
	return float64(r.Completed) / r.Window.Seconds()
}

type loadPhase int

const (
	phaseWarmup loadPhase = iota
	phaseMeasure
	phaseDrain
)

// run drives l to its end. It returns an error only when the connection
// failed or ctx was cancelled; lost, duplicate and error replies are in the
// books. A nil error means nothing is left outstanding: those still unanswered
// after the drain are counted lost and forgotten.
func (p *pipe) run(ctx context.Context, l load) (*loadResult, error) {
	res := &loadResult{}
	nc := p.conn.NetConn()
	start := time.Now()
	open, end := start.Add(l.warmup), start.Add(l.warmup+l.duration)
	nc.SetReadDeadline(end.Add(l.drain))
	defer nc.SetReadDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { nc.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()

	var (
		phase    = phaseWarmup
		winStart time.Time
		inFlight = 0
	)
	closeWindow := func(at time.Time) {
		res.Window = at.Sub(winStart)
		phase = phaseDrain
		if l.onWindow != nil {
			l.onWindow(false)
		}
	}
	send := func() error {
		if err := p.send(&l.request, &res.books); err != nil {
			return err
		}
		inFlight++
		return nil
	}
	for range l.window {
		if err := send(); err != nil {
			return res, err
		}
	}
	for inFlight > 0 {
		f, err := p.read()
		if err != nil {
			var ne net.Error
			if ctx.Err() != nil {
				err = ctx.Err()
			} else if errors.As(err, &ne) && ne.Timeout() {
				err = nil // the drain is over: what is outstanding is lost
			}
			if phase == phaseMeasure {
				closeWindow(end) // no reply came after the window's end
			}
			res.Lost += uint64(len(p.outstanding))
			clear(p.outstanding)
			return res, err
		}
		if f.Op != ipc.OpReply {
			if p.other != nil {
				p.other(f)
			}
			continue
		}
		now := time.Now()
		sentAt, ok := p.complete(f, &res.books)
		if !ok {
			continue
		}
		inFlight--
		if f.Error == nil && l.expect != nil && !bytes.Equal(f.Payload, l.expect) {
			res.OK--
			res.addError(codeBadPayload)
		}
		if phase == phaseWarmup && !now.Before(open) {
			phase, winStart = phaseMeasure, now
			if l.onWindow != nil {
				l.onWindow(true)
			}
		}
		if phase == phaseMeasure && !now.Before(end) {
			closeWindow(now)
		}
		if phase == phaseMeasure {
			res.Completed++
			if f.Error == nil {
				res.Latency.Record(now.Sub(sentAt))
			}
		}
		if phase != phaseDrain {
			if err := send(); err != nil {
				return res, err
			}
		}
	}
	return res, nil
}

// send sends f with the pipe's next id.
func (p *pipe) send(f *ipc.Frame, b *books) error {
	p.next++
	id := p.next
	req := *f
	req.ID = strconv.FormatUint(id, 36)
	p.buf = ipc.AppendFrame(p.buf[:0], &req)
	p.outstanding[id] = time.Now()
	if err := p.conn.Send(p.buf); err != nil {
		delete(p.outstanding, id)
		return fmt.Errorf("send %s: %w", f.Op, err)
	}
	b.Sent++
	return nil
}

// read returns the next frame; an undecodable one is an error, since neither
// the manager nor the harness ever sends one.
func (p *pipe) read() (*ipc.Frame, error) {
	line, err := p.conn.ReadFrame()
	if err != nil {
		return nil, err
	}
	f, err := ipc.Decode(line)
	if err != nil {
		return nil, fmt.Errorf("undecodable frame %.200q: %w", line, err)
	}
	return f, nil
}

// complete books a REPLY: it returns when its request was sent and true, or
// false for a duplicate or a reply to no request of ours.
func (p *pipe) complete(f *ipc.Frame, b *books) (time.Time, bool) {
	id, err := strconv.ParseUint(f.ID, 36, 64)
	sentAt, ok := p.outstanding[id]
	switch {
	case err == nil && ok:
		delete(p.outstanding, id)
		p.answered.set(id)
		if f.Error != nil {
			b.addError(f.Error.Code)
		} else {
			b.OK++
		}
		return sentAt, true
	case err == nil && p.answered.has(id):
		b.Duplicates++
	case err == nil && p.abandoned[id]:
		delete(p.abandoned, id)
	default:
		b.Unknown++
	}
	return time.Time{}, false
}

// call sends one request and waits up to timeout for its reply, passing other
// frames on. It is for probes, not for measured load: a request it gives up on
// is abandoned, and its reply, should it come later, is dropped.
func (p *pipe) call(ctx context.Context, f *ipc.Frame, timeout time.Duration, b *books) (*ipc.Frame, error) {
	nc := p.conn.NetConn()
	nc.SetReadDeadline(time.Now().Add(timeout))
	defer nc.SetReadDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { nc.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	if err := p.send(f, b); err != nil {
		return nil, err
	}
	want := p.next
	for {
		r, err := p.read()
		if err != nil {
			if ctx.Err() != nil {
				err = ctx.Err()
			}
			delete(p.outstanding, want)
			p.abandoned[want] = true
			b.Lost++
			return nil, fmt.Errorf("%s: %w", f.Op, err)
		}
		if r.Op != ipc.OpReply {
			if p.other != nil {
				p.other(r)
			}
			continue
		}
		if _, ok := p.complete(r, b); ok && r.ID == strconv.FormatUint(want, 36) {
			return r, nil
		}
	}
}

// bitset is a growable set of small integers.
type bitset []uint64

func (s *bitset) set(i uint64) {
	w := int(i / 64)
	if w >= len(*s) {
		*s = append(*s, make([]uint64, w-len(*s)+1+len(*s)/2)...)
	}
	(*s)[w] |= 1 << (i % 64)
}

func (s bitset) has(i uint64) bool {
	w := int(i / 64)
	return w < len(s) && s[w]&(1<<(i%64)) != 0
}
