package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sm-supervisor/sm/ipc"
)

// laneLoad is the deploy and chaos scenarios' load: a closed loop of lanes,
// each one request in flight at a time to a fixed cluster (by id or through a
// guild: target that resolves to it), so that every cluster gets load and a
// cluster that is down holds up only its own lanes. The lanes are spread over
// a few client connections. Books are exact, as in the route scenario, and
// every error reply is kept with its cluster and times, for the chaos
// scenario to check against the windows in which that cluster was down.
type laneLoad struct {
	conns    []*laneConn
	stopping atomic.Bool
	started  time.Time
	stopped  time.Time
}

// loadLane is one lane's target.
type loadLane struct {
	Target  string
	Cluster int
}

// errorReply is one error REPLY the load got.
type errorReply struct {
	Cluster int
	Target  string
	Code    string
	Message string
	Sent    time.Time
	Replied time.Time
}

type laneReq struct {
	lane int
	sent time.Time
}

// laneConn is one client connection and its lanes.
type laneConn struct {
	load      *laneLoad
	conn      *ipc.Conn
	lanes     []loadLane
	payload   []byte
	timeoutMS int64
	errPause  time.Duration

	mu          sync.Mutex
	next        uint64
	outstanding map[uint64]laneReq
	answered    bitset
	books       books
	lat         histogram
	errs        []errorReply
	lost        []errorReply // Code "lost": no reply by the end of the drain
	buf         []byte
	fatal       error // the connection failed under the load
	closing     bool
	done        chan struct{}
}

// laneLoadOptions shape a laneLoad.
type laneLoadOptions struct {
	lanes     []loadLane
	conns     int
	payload   []byte
	timeoutMS int64         // the requests' timeout_ms (0: the manager's requests.timeout)
	errPause  time.Duration // wait after an error reply before the lane sends again
}

// loadLanes builds n lanes over clusters clusters of perCluster shards: lane i
// aims at cluster i mod clusters, by its id or by a guild whose shard is one
// of that cluster's, as mode says: "cluster", "guild", or "mix" (alternating
// rounds of lanes).
func loadLanes(clusters, perCluster, n int, mode string) ([]loadLane, error) {
	if n < clusters {
		return nil, fmt.Errorf("%d in flight cannot reach %d clusters: give at least one per cluster", n, clusters)
	}
	total := clusters * perCluster
	lanes := make([]loadLane, n)
	for i := range lanes {
		c, round := i%clusters, i/clusters
		byGuild := false
		switch mode {
		case "cluster":
		case "guild":
			byGuild = true
		case "mix":
			byGuild = round%2 == 1
		default:
			return nil, fmt.Errorf("targets %q: want cluster, guild or mix", mode)
		}
		lanes[i] = loadLane{Target: strconv.Itoa(c), Cluster: c}
		if byGuild {
			shard := c*perCluster + round%perCluster
			// Discord's rule, as the manager resolves guild: targets: shard = (id >> 22) % total.
			guild := uint64(shard+total*(round+1))<<22 | uint64(i&0x3fffff)
			lanes[i].Target = ipc.TargetGuildPrefix + strconv.FormatUint(guild, 10)
		}
	}
	return lanes, nil
}

// startLaneLoad opens the connections and sends every lane's first request.
func startLaneLoad(ctx context.Context, m *managerProc, o laneLoadOptions) (*laneLoad, error) {
	l := &laneLoad{started: time.Now()}
	nconn := max(1, min(o.conns, len(o.lanes)))
	for i := range nconn {
		p, err := m.dial(ctx, fmt.Sprintf("sm-bench-load-%d", i))
		if err != nil {
			l.close()
			return nil, err
		}
		lc := &laneConn{
			load: l, conn: p.conn, payload: o.payload, timeoutMS: o.timeoutMS, errPause: o.errPause,
			outstanding: map[uint64]laneReq{}, done: make(chan struct{}),
		}
		for j := i; j < len(o.lanes); j += nconn {
			lc.lanes = append(lc.lanes, o.lanes[j])
		}
		l.conns = append(l.conns, lc)
		go lc.read()
	}
	for _, lc := range l.conns {
		lc.mu.Lock()
		for lane := range lc.lanes {
			lc.sendLocked(lane)
		}
		lc.mu.Unlock()
	}
	return l, nil
}

// sendLocked sends lane's next request. Call with mu held.
func (c *laneConn) sendLocked(lane int) {
	if c.fatal != nil || c.closing || c.load.stopping.Load() {
		return
	}
	c.next++
	id := c.next
	c.buf = ipc.AppendFrame(c.buf[:0], &ipc.Frame{
		Op: "echo", ID: strconv.FormatUint(id, 36), Target: c.lanes[lane].Target,
		Payload: c.payload, TimeoutMS: c.timeoutMS,
	})
	c.outstanding[id] = laneReq{lane: lane, sent: time.Now()}
	if err := c.conn.Send(c.buf); err != nil {
		delete(c.outstanding, id)
		c.fatal = fmt.Errorf("send: %w", err)
		return
	}
	c.books.Sent++
}

func (c *laneConn) read() {
	defer close(c.done)
	for {
		line, err := c.conn.ReadFrame()
		now := time.Now()
		if err != nil {
			c.mu.Lock()
			if !c.closing && c.fatal == nil {
				c.fatal = fmt.Errorf("load connection: %w", err)
			}
			c.mu.Unlock()
			return
		}
		f, err := ipc.Decode(line)
		if err != nil {
			c.mu.Lock()
			c.fatal = fmt.Errorf("undecodable frame %.200q: %w", line, err)
			c.mu.Unlock()
			c.conn.Abort(err)
			return
		}
		if f.Op != ipc.OpReply {
			continue
		}
		c.complete(f, now)
	}
}

// complete books a reply and sends the lane's next request.
func (c *laneConn) complete(f *ipc.Frame, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	id, err := strconv.ParseUint(f.ID, 36, 64)
	req, ok := c.outstanding[id]
	switch {
	case err == nil && ok:
	case err == nil && c.answered.has(id):
		c.books.Duplicates++
		return
	default:
		c.books.Unknown++
		return
	}
	delete(c.outstanding, id)
	c.answered.set(id)
	lane := c.lanes[req.lane]
	switch {
	case f.Error != nil:
		c.books.addError(f.Error.Code)
		c.errs = append(c.errs, errorReply{Cluster: lane.Cluster, Target: lane.Target, Code: f.Error.Code,
			Message: f.Error.Message, Sent: req.sent, Replied: now})
		if c.errPause > 0 {
			time.AfterFunc(c.errPause, func() {
				c.mu.Lock()
				defer c.mu.Unlock()
				c.sendLocked(req.lane)
			})
			return
		}
	case !bytes.Equal(f.Payload, c.payload):
		c.books.addError(codeBadPayload)
		c.errs = append(c.errs, errorReply{Cluster: lane.Cluster, Target: lane.Target, Code: codeBadPayload, Sent: req.sent, Replied: now})
	default:
		c.books.OK++
		c.lat.Record(now.Sub(req.sent))
	}
	c.sendLocked(req.lane)
}

// failure returns the first connection failure under the load, if any.
func (l *laneLoad) failure() error {
	var errs []error
	for _, c := range l.conns {
		c.mu.Lock()
		if c.fatal != nil {
			errs = append(errs, c.fatal)
		}
		c.mu.Unlock()
	}
	return errors.Join(errs...)
}

// snapshot returns the books so far, added up over the connections.
func (l *laneLoad) snapshot() books {
	var b books
	for _, c := range l.conns {
		c.mu.Lock()
		b.Add(c.books)
		c.mu.Unlock()
	}
	return b
}

// stop sends no more requests and waits up to drain for the outstanding
// ones; what is still unanswered then is lost. It waits a further moment for
// late duplicates, then closes the connections. Only the first call counts.
func (l *laneLoad) stop(drain time.Duration) {
	if l.stopping.Swap(true) {
		return
	}
	l.stopped = time.Now()
	deadline := time.Now().Add(drain)
	for time.Now().Before(deadline) {
		left := 0
		for _, c := range l.conns {
			c.mu.Lock()
			if c.fatal == nil {
				left += len(c.outstanding)
			}
			c.mu.Unlock()
		}
		if left == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(dupGrace)
	now := time.Now()
	for _, c := range l.conns {
		c.mu.Lock()
		for _, r := range c.outstanding {
			lane := c.lanes[r.lane]
			c.lost = append(c.lost, errorReply{Cluster: lane.Cluster, Target: lane.Target, Code: "lost", Sent: r.sent, Replied: now})
		}
		c.books.Lost += uint64(len(c.outstanding))
		clear(c.outstanding)
		c.mu.Unlock()
	}
	l.close()
}

// dupGrace is how long the load keeps reading after its last reply, so that a
// duplicate sent right behind it is still counted.
const dupGrace = 250 * time.Millisecond

func (l *laneLoad) close() {
	for _, c := range l.conns {
		c.mu.Lock()
		c.closing = true
		c.mu.Unlock()
		c.conn.Close()
		<-c.conn.Done()
		<-c.done
	}
}

// finish stops the load, waiting up to drain for the last replies (see
// stop), and returns its figures over the whole run, its error replies and
// the requests it lost.
func (l *laneLoad) finish(drain time.Duration) (figures, []errorReply, []errorReply) {
	l.stop(drain)
	books, lat, errs, lost := l.result()
	return loadFigures(books, &lat, l.stopped.Sub(l.started)), errs, lost
}

// figures are a closed-loop load's figures over its whole run: its books,
// how long it ran, and the rate and round trips of its OK replies.
type figures struct {
	books
	LoadS   float64 `json:"load_s"`
	ReqPerS float64 `json:"req_per_s"`
	P50US   float64 `json:"p50_us"`
	P99US   float64 `json:"p99_us"`
	MaxUS   float64 `json:"max_us"`
}

// loadFigures computes figures from a load's books and round trips over
// the time it ran.
func loadFigures(b books, lat *histogram, ran time.Duration) figures {
	f := figures{books: b, LoadS: ran.Seconds()}
	if f.LoadS > 0 {
		f.ReqPerS = float64(b.OK) / f.LoadS
	}
	f.P50US, f.P99US, f.MaxUS = latencyUS(lat)
	return f
}

// result adds up the books, latencies and error replies of every connection.
func (l *laneLoad) result() (books, histogram, []errorReply, []errorReply) {
	var b books
	var h histogram
	var errs, lost []errorReply
	for _, c := range l.conns {
		c.mu.Lock()
		b.Add(c.books)
		h.Merge(&c.lat)
		errs = append(errs, c.errs...)
		lost = append(lost, c.lost...)
		c.mu.Unlock()
	}
	return b, h, errs, lost
}
