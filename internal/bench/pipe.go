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
// The load client is meant to cost as little as the ends it measures allow
// (issue 16): one goroutine reads the replies and writes the next requests,
// every request read together leaves in one write, a request is a template
// with its id filled in, a reply in the form every Go peer sends is matched
// without decoding it (anything else is decoded in full), and the books live
// in a ring indexed by id, so the steady state allocates nothing.
//
// A pipe is used by one goroutine at a time; ids are unique over its life, so
// a late reply to an earlier load is still recognised as a duplicate or a loss.
type pipe struct {
	conn *ipc.Conn
	// other receives frames that are not REPLYs (a cluster's HEARTBEATs, or
	// its requests) and returns what to answer (nil: nothing); nil drops
	// them. The answer goes out with the pipe's own writes, since during a
	// load nothing else may write to the connection (run holds its write
	// deadline).
	other func(f *ipc.Frame) *ipc.Frame

	next      uint64
	out       outstanding
	answered  bitset
	abandoned map[uint64]bool // probes call gave up on: a late reply is no fault
	buf       []byte          // the requests of the batch being read, written together
	// base is the origin of the times the ring holds, for monotonic
	// nanoseconds without a time.Time per request.
	base time.Time
}

func newPipe(conn *ipc.Conn, other func(f *ipc.Frame) *ipc.Frame) *pipe {
	return &pipe{conn: conn, other: other, abandoned: make(map[uint64]bool), base: time.Now(), out: newOutstanding(64)}
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
//
// Times are taken per batch, not per frame: a reply's arrival is when the
// first frame of the read that brought it was handled, a request's departure
// just before the write that carried it.
func (p *pipe) run(ctx context.Context, l load) (*loadResult, error) {
	res := &loadResult{}
	nc := p.conn.NetConn()
	start := time.Now()
	open, end := start.Add(l.warmup), start.Add(l.warmup+l.duration)
	// Only this goroutine writes during the load (see other), so one
	// deadline bounds every write: none waits past the drain.
	nc.SetDeadline(end.Add(l.drain))
	defer nc.SetDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	tmpl := newRequestTemplate(&l.request)
	p.out.reserve(l.window)
	var (
		phase    = phaseWarmup
		winStart time.Time
		inFlight = 0
		now      time.Time
		fresh    = true // the next frame is the first of a read
		unsent   = p.next
	)
	closeWindow := func(at time.Time) {
		res.Window = at.Sub(winStart)
		phase = phaseDrain
		if l.onWindow != nil {
			l.onWindow(false)
		}
	}
	queue := func() {
		p.next++
		p.buf = tmpl.append(p.buf, p.next)
		res.Sent++
		inFlight++
	}
	flush := func() error {
		if len(p.buf) == 0 {
			return nil
		}
		at := p.nanos(time.Now())
		for id := unsent + 1; id <= p.next; id++ {
			p.out.add(id, at)
		}
		unsent = p.next
		_, err := nc.Write(p.buf)
		p.buf = p.buf[:0]
		if err != nil {
			return fmt.Errorf("send %s: %w", l.request.Op, err)
		}
		return nil
	}
	for range l.window {
		queue()
	}
	if err := flush(); err != nil {
		return res, err
	}
	for inFlight > 0 {
		line, err := p.conn.ReadFrame()
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
			res.Lost += uint64(p.out.clear())
			return res, err
		}
		if fresh {
			now, fresh = time.Now(), false
		}
		sentAt, ok, err := p.take(line, l.expect, &res.books)
		if err != nil {
			return res, err
		}
		if ok {
			inFlight--
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
				if sentAt >= 0 {
					res.Latency.Record(time.Duration(p.nanos(now) - sentAt))
				}
			}
			if phase != phaseDrain {
				queue()
			}
		}
		if !p.conn.FrameBuffered() {
			if err := flush(); err != nil {
				return res, err
			}
			fresh = true
		}
	}
	return res, nil
}

// nanos is t in the ring's time: nanoseconds since the pipe was made.
func (p *pipe) nanos(t time.Time) int64 { return int64(t.Sub(p.base)) }

// replyHead and replyPayload are how every Go peer (ipc.AppendFrame) writes
// a REPLY with a payload: the shape take matches without decoding.
const (
	replyHead    = `{"op":"REPLY","id":"`
	replyPayload = `","payload":`
)

// take books one frame of a load. For a REPLY to one of the pipe's
// requests it returns when that was sent (-1 for an error reply, whose round
// trip is not recorded) and true. Frames that are not replies go to
// p.other. A reply in the common shape, id in base 36 and the payload
// exactly expect, is matched on its bytes; any other frame is decoded, so
// what take books never depends on which path ran.
func (p *pipe) take(line, expect []byte, b *books) (int64, bool, error) {
	if expect != nil && bytes.HasPrefix(line, []byte(replyHead)) {
		rest := line[len(replyHead):]
		if q := bytes.IndexByte(rest, '"'); q > 0 {
			if id, ok := base36(rest[:q]); ok {
				body := rest[q:]
				if len(body) == len(replyPayload)+len(expect)+1 && bytes.HasPrefix(body, []byte(replyPayload)) &&
					body[len(body)-1] == '}' && bytes.Equal(body[len(replyPayload):len(body)-1], expect) {
					return p.book(id, true, nil, b)
				}
			}
		}
	}
	f, err := ipc.Decode(line)
	if err != nil {
		// Neither the manager nor the harness ever sends one.
		return 0, false, fmt.Errorf("undecodable frame %.200q: %w", line, err)
	}
	if f.Op != ipc.OpReply {
		if p.other != nil {
			if a := p.other(f); a != nil {
				p.buf = append(ipc.AppendFrame(p.buf, a), '\n')
			}
		}
		return 0, false, nil
	}
	id, ok := base36([]byte(f.ID))
	if !ok {
		b.Unknown++
		return 0, false, nil
	}
	good := f.Error == nil && (expect == nil || bytes.Equal(f.Payload, expect))
	return p.book(id, good, f.Error, b)
}

// book counts the reply to id: ok (or bad_payload when good is false and
// there is no error), an error by its code, a duplicate, or unknown.
func (p *pipe) book(id uint64, good bool, e *ipc.Error, b *books) (int64, bool, error) {
	sentAt, ok := p.out.take(id)
	switch {
	case ok:
		p.answered.set(id)
		switch {
		case e != nil:
			b.addError(e.Code)
			sentAt = -1
		case !good:
			b.addError(codeBadPayload)
		default:
			b.OK++
		}
		return sentAt, true, nil
	case p.answered.has(id):
		b.Duplicates++
	case p.abandoned[id]:
		delete(p.abandoned, id)
	default:
		b.Unknown++
	}
	return 0, false, nil
}

// base36 parses a request id as the pipe writes it, without allocating.
func base36(b []byte) (uint64, bool) {
	if len(b) == 0 || len(b) > 12 {
		return 0, false
	}
	var v uint64
	for _, c := range b {
		switch {
		case c >= '0' && c <= '9':
			v = v*36 + uint64(c-'0')
		case c >= 'a' && c <= 'z':
			v = v*36 + uint64(c-'a'+10)
		default:
			return 0, false
		}
	}
	return v, true
}

// requestTemplate is a request's encoding split around its id, as
// ipc.AppendFrame writes it, so that each request costs two copies and the
// id's digits.
type requestTemplate struct{ head, tail []byte }

func newRequestTemplate(f *ipc.Frame) requestTemplate {
	op := ipc.AppendFrame(nil, &ipc.Frame{Op: f.Op}) // {"op":"…"}
	rest := *f
	rest.ID = ""
	full := ipc.AppendFrame(nil, &rest)
	return requestTemplate{
		head: append(op[:len(op)-1:len(op)-1], `,"id":"`...),
		tail: append([]byte(`"`), full[len(op)-1:]...),
	}
}

// append appends the request with id id and its newline to dst.
func (t requestTemplate) append(dst []byte, id uint64) []byte {
	dst = append(dst, t.head...)
	dst = strconv.AppendUint(dst, id, 36)
	dst = append(dst, t.tail...)
	return append(dst, '\n')
}

// send sends f with the pipe's next id, through the connection's queue: for
// probes (call), not for measured load.
func (p *pipe) send(f *ipc.Frame, b *books) error {
	p.next++
	id := p.next
	req := *f
	req.ID = strconv.FormatUint(id, 36)
	p.buf = ipc.AppendFrame(p.buf[:0], &req)
	p.out.add(id, p.nanos(time.Now()))
	err := p.conn.Send(p.buf)
	p.buf = p.buf[:0]
	if err != nil {
		p.out.take(id)
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
			p.out.take(want)
			p.abandoned[want] = true
			b.Lost++
			return nil, fmt.Errorf("%s: %w", f.Op, err)
		}
		if r.Op != ipc.OpReply {
			if p.other != nil {
				if a := p.other(r); a != nil {
					p.conn.SendFrame(a)
				}
			}
			continue
		}
		id, ok := base36([]byte(r.ID))
		if !ok {
			b.Unknown++
			continue
		}
		if _, ok, _ := p.book(id, r.Error == nil, r.Error, b); ok && id == want {
			return r, nil
		}
	}
}

// outstanding is the set of a pipe's unanswered requests and when each was
// sent: a ring indexed by id, since ids are handed out in order and nearly
// all are answered within a window of them, with a map for the few that
// stay unanswered while the ring comes round to their slot again.
type outstanding struct {
	ring     []slotEntry
	overflow map[uint64]int64
}

type slotEntry struct {
	id     uint64 // 0: free
	sentAt int64
}

func newOutstanding(n int) outstanding {
	o := outstanding{overflow: make(map[uint64]int64)}
	o.reserve(n)
	return o
}

// reserve makes the ring hold at least 4n requests without the map.
func (o *outstanding) reserve(n int) {
	size := 64
	for size < 4*n {
		size *= 2
	}
	if size <= len(o.ring) {
		return
	}
	old := o.ring
	o.ring = make([]slotEntry, size)
	for _, e := range old {
		if e.id != 0 {
			o.add(e.id, e.sentAt)
		}
	}
}

func (o *outstanding) add(id uint64, sentAt int64) {
	s := &o.ring[id&uint64(len(o.ring)-1)]
	if s.id != 0 {
		o.overflow[s.id] = s.sentAt
	}
	*s = slotEntry{id: id, sentAt: sentAt}
}

// take removes id, returning when it was sent, if it was outstanding.
func (o *outstanding) take(id uint64) (int64, bool) {
	if s := &o.ring[id&uint64(len(o.ring)-1)]; s.id == id && id != 0 {
		s.id = 0
		return s.sentAt, true
	}
	if at, ok := o.overflow[id]; ok {
		delete(o.overflow, id)
		return at, true
	}
	return 0, false
}

// clear forgets every outstanding request and returns how many there were.
func (o *outstanding) clear() int {
	n := len(o.overflow)
	clear(o.overflow)
	for i := range o.ring {
		if o.ring[i].id != 0 {
			o.ring[i].id = 0
			n++
		}
	}
	return n
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
