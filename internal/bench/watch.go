package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sm-supervisor/sm/generation"
	"github.com/sm-supervisor/sm/ipc"
)

// feedWatcher follows the manager's state feed (WATCH) and keeps, per
// cluster, when it was routed and when it was not, as the bench saw the
// events arrive: the record the deploy scenario's "never unrouted" check and
// the chaos scenario's down windows are computed from.
//
// The feed publishes a cluster's state after each event of the manager's
// loop, so a change undone within a single loop event is not seen; the
// routing table changes in single atomic stores, which a deploy relies on.
type feedWatcher struct {
	conn *ipc.Conn
	done chan struct{}

	mu       sync.Mutex
	err      error // why the reader stopped, if not closed by us
	closing  bool
	clusters map[int]rollCluster // what the feed last said of each
	changes  []routeChange       // every change of a cluster's routed flag or pid, in arrival order
	deploys  map[string]generation.Status
	// readyBeat is the first ready:true heartbeat of each cluster's each
	// generation, by {cluster, generation}.
	readyBeat map[[2]int64]readyBeat
	drops     int
	notify    chan struct{} // signalled (non-blocking) on every deploy event
	watches   int
}

// readyBeat is a process's first ready:true heartbeat: when the manager
// received it (the event's "at"), and the harness's uptime in it (its stats'
// uptime_ms; 0 for a bot that does not say).
type readyBeat struct {
	At     time.Time
	Uptime time.Duration
}

// routeChange is one change of a cluster's routed process seen on the feed:
// routed flipped, or the routed process changed.
type routeChange struct {
	Cluster int
	At      time.Time // when the bench received the event
	Routed  bool
	PID     int
	State   string
}

// watchFeed opens a connection, WATCHes and returns once the first snapshot
// has arrived.
func watchFeed(ctx context.Context, m *managerProc) (*feedWatcher, error) {
	p, err := m.dial(ctx, "sm-bench-watch")
	if err != nil {
		return nil, err
	}
	w := &feedWatcher{
		conn: p.conn, done: make(chan struct{}),
		clusters: map[int]rollCluster{}, deploys: map[string]generation.Status{},
		readyBeat: map[[2]int64]readyBeat{}, notify: make(chan struct{}, 1),
	}
	if err := w.watch(); err != nil {
		p.conn.Abort(nil)
		<-p.conn.Done()
		return nil, err
	}
	go w.read()
	deadline := time.Now().Add(startTimeout)
	for {
		w.mu.Lock()
		n, rerr := len(w.clusters), w.err
		w.mu.Unlock()
		if n > 0 {
			return w, nil
		}
		if rerr != nil || time.Now().After(deadline) || ctx.Err() != nil {
			w.close()
			return nil, fmt.Errorf("WATCH: no snapshot (%v)", errors.Join(rerr, ctx.Err()))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (w *feedWatcher) watch() error {
	w.watches++
	return w.conn.SendFrame(&ipc.Frame{Op: ipc.OpWatch, ID: fmt.Sprintf("watch-%d", w.watches)})
}

// close ends the WATCH connection and waits for the reader.
func (w *feedWatcher) close() {
	w.mu.Lock()
	w.closing = true
	w.mu.Unlock()
	w.conn.Close()
	<-w.conn.Done()
	<-w.done
}

// failed returns why the feed stopped early, if it did.
func (w *feedWatcher) failed() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// feedEvent is the part of every event the watcher reads.
type feedEvent struct {
	Type   string             `json:"type"`
	Status *rollStatus        `json:"status"`     // snapshot, topology
	Deploy *generation.Status `json:"deploy"`     // deploy
	PID    int                `json:"pid"`        // heartbeat
	Gen    int64              `json:"generation"` // heartbeat
	Ready  bool               `json:"ready"`      // heartbeat
	At     time.Time          `json:"at"`         // heartbeat
	Raw    json.RawMessage    `json:"cluster"`    // cluster: an object; heartbeat: a number
	Beat   json.RawMessage    `json:"payload"`    // heartbeat: the bot's own bytes (the harness's stats)
}

func (w *feedWatcher) read() {
	defer close(w.done)
	for {
		line, err := w.conn.ReadFrame()
		now := time.Now()
		if err != nil {
			w.mu.Lock()
			if !w.closing {
				w.err = fmt.Errorf("WATCH connection: %w", err)
			}
			w.mu.Unlock()
			return
		}
		f, err := ipc.Decode(line)
		if err == nil && f.Op == ipc.OpReply && f.Error != nil {
			err = fmt.Errorf("WATCH refused: %w", f.Error)
		}
		var ev feedEvent
		if err == nil && f.Op == ipc.OpEvent {
			err = json.Unmarshal(f.Payload, &ev)
		}
		if err != nil {
			w.mu.Lock()
			w.err = err
			w.mu.Unlock()
			w.conn.Abort(err)
			return
		}
		if f.Op != ipc.OpEvent {
			continue
		}
		w.apply(&ev, now)
	}
}

func (w *feedWatcher) apply(ev *feedEvent, now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch ev.Type {
	case "snapshot", "topology":
		if ev.Status != nil {
			for _, c := range ev.Status.Clusters {
				w.setCluster(c, now)
			}
			if ev.Status.Deploy != nil {
				w.deploys[ev.Status.Deploy.ID] = *ev.Status.Deploy
			}
		}
	case "cluster":
		var c rollCluster
		if err := json.Unmarshal(ev.Raw, &c); err == nil {
			w.setCluster(c, now)
		}
	case "deploy":
		if ev.Deploy != nil {
			w.deploys[ev.Deploy.ID] = *ev.Deploy
			select {
			case w.notify <- struct{}{}:
			default:
			}
		}
	case "heartbeat":
		var cluster int64
		if ev.Ready && json.Unmarshal(ev.Raw, &cluster) == nil {
			if _, ok := w.readyBeat[[2]int64{cluster, ev.Gen}]; !ok {
				var stats struct {
					UptimeMS int64 `json:"uptime_ms"`
				}
				json.Unmarshal(ev.Beat, &stats) // any bot's payload: the uptime is optional
				w.readyBeat[[2]int64{cluster, ev.Gen}] = readyBeat{At: ev.At, Uptime: time.Duration(stats.UptimeMS) * time.Millisecond}
			}
		}
	case "dropped":
		// Fell behind: what happened meanwhile is unknown. Counted (the
		// scenarios treat it as a broken check) and watched again.
		w.drops++
		if err := w.watch(); err != nil && w.err == nil {
			w.err = err
		}
	}
}

// setCluster records c's state, and a routeChange when its routed flag or its
// process changed. Call with mu held.
func (w *feedWatcher) setCluster(c rollCluster, now time.Time) {
	prev, ok := w.clusters[c.ID]
	if !ok || prev.Routed != c.Routed || (c.Routed && prev.PID != c.PID) {
		w.changes = append(w.changes, routeChange{Cluster: c.ID, At: now, Routed: c.Routed, PID: c.PID, State: c.State})
	}
	w.clusters[c.ID] = c
}

// cluster returns what the feed last said of cluster id.
func (w *feedWatcher) cluster(id int) (rollCluster, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	c, ok := w.clusters[id]
	return c, ok
}

// routeChanges returns a copy of every routing change seen so far.
func (w *feedWatcher) routeChanges() []routeChange {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]routeChange(nil), w.changes...)
}

// dropCount is how many times the feed dropped the watcher.
func (w *feedWatcher) dropCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.drops
}

// readyHeartbeat returns the first ready:true heartbeat of cluster's
// generation gen, if the feed showed it.
func (w *feedWatcher) readyHeartbeat(cluster int, gen int64) (readyBeat, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	t, ok := w.readyBeat[[2]int64{int64(cluster), gen}]
	return t, ok
}

// waitDeploy waits until the feed shows deploy id finished, for at most
// timeout, and returns its last status. poll, if set, is asked now and then
// as well (the feed is the fast path; STATUS the safety net).
func (w *feedWatcher) waitDeploy(ctx context.Context, id string, timeout time.Duration, poll func() (*generation.Status, error)) (generation.Status, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		w.mu.Lock()
		st, ok := w.deploys[id]
		w.mu.Unlock()
		if ok && !st.Finished.IsZero() {
			return st, nil
		}
		select {
		case <-w.notify:
		case <-tick.C:
			if poll != nil {
				if ps, err := poll(); err == nil && ps != nil && ps.ID == id && !ps.Finished.IsZero() {
					return *ps, nil
				}
			}
		case <-deadline.C:
			return st, fmt.Errorf("deploy %s not finished after %v (state %q)", id, timeout, st.State)
		case <-ctx.Done():
			return st, ctx.Err()
		}
	}
}

// unroutedInterval is a time a cluster had no routed process.
type unroutedInterval struct {
	Cluster  int
	From, To time.Time // To is the end of the record for one still open
	Open     bool
}

// unroutedIntervals turns routing changes into the intervals each cluster
// spent unrouted, those still open ending at end.
func unroutedIntervals(changes []routeChange, end time.Time) []unroutedInterval {
	var out []unroutedInterval
	open := map[int]time.Time{}
	routed := map[int]bool{}
	for _, c := range changes {
		was, seen := routed[c.Cluster]
		routed[c.Cluster] = c.Routed
		switch {
		case !c.Routed && (was || !seen):
			open[c.Cluster] = c.At
		case c.Routed && seen && !was:
			out = append(out, unroutedInterval{Cluster: c.Cluster, From: open[c.Cluster], To: c.At})
			delete(open, c.Cluster)
		}
	}
	for cl, from := range open {
		out = append(out, unroutedInterval{Cluster: cl, From: from, To: end, Open: true})
	}
	return out
}

// overlapping returns the intervals that overlap [from, to].
func overlapping(ivs []unroutedInterval, from, to time.Time) []unroutedInterval {
	var out []unroutedInterval
	for _, iv := range ivs {
		if !iv.To.Before(from) && !iv.From.After(to) {
			out = append(out, iv)
		}
	}
	return out
}
