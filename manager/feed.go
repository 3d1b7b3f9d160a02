package manager

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sm-supervisor/sm/ipc"
)

// The state feed: a snapshot, then one JSON event per line. Events are
//
//	{"type":"snapshot","status":{...Status...}}
//	{"type":"heartbeat","cluster":3,"generation":5,"pid":1234,"ready":true,"at":"...","payload":<raw>}
//	{"type":"cluster","cluster":{...ClusterStatus without heartbeat...}}
//	{"type":"deploy","deploy":{...generation.Status...}}
//	{"type":"topology","status":{...Status...}}   (after a re-clustering switch)
//	{"type":"discord","discord":{...DiscordStatus...}} (identify gate and budget)
//	{"type":"recycle","cluster":3,"generation":5,...RecycleStatus...} (a recycle's start and end)
//	{"type":"hosts","hosts":[...HostStatus...]}  (with [mesh]: the hosts changed)
//
// The heartbeat payload is the cluster's own bytes, never parsed. Nothing in
// the feed holds a token, an environment variable or a command line.
const (
	EventSnapshot  = "snapshot"
	EventHeartbeat = "heartbeat"
	EventCluster   = "cluster"
	EventDeploy    = "deploy"
	EventTopology  = "topology"
	EventDiscord   = "discord"
	EventRecycle   = "recycle"
	EventHosts     = "hosts"
)

// Subscription receives feed events. C is closed when the subscription ends:
// Cancel was called, the manager stopped, or the subscriber fell more than
// its buffer behind (then Dropped reports true). Never waited for.
type Subscription struct {
	C <-chan []byte

	c       chan []byte
	hub     *hub
	mu      sync.Mutex
	dropped bool
	closed  bool
}

// Dropped reports whether the subscription was ended for falling behind.
func (s *Subscription) Dropped() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dropped
}

// Cancel ends the subscription.
func (s *Subscription) Cancel() { s.hub.remove(s, false) }

// hub fans feed events out to subscribers without ever blocking the loop.
type hub struct {
	mu   sync.Mutex
	subs map[*Subscription]struct{}
	max  int
	n    atomic.Int32 // len(subs), for readers that must not take mu
}

func (h *hub) add(buf int) (*Subscription, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.max > 0 && len(h.subs) >= h.max {
		return nil, false
	}
	c := make(chan []byte, buf)
	s := &Subscription{C: c, c: c, hub: h}
	h.subs[s] = struct{}{}
	h.n.Store(int32(len(h.subs)))
	return s, true
}

func (h *hub) remove(s *Subscription, dropped bool) {
	h.mu.Lock()
	delete(h.subs, s)
	h.n.Store(int32(len(h.subs)))
	h.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.closed = true
	s.dropped = dropped
	close(s.c)
}

// publish sends msg to every subscriber; one whose buffer is full is dropped.
func (h *hub) publish(msg []byte) {
	h.mu.Lock()
	var slow []*Subscription
	for s := range h.subs {
		select {
		case s.c <- msg:
		default:
			slow = append(slow, s)
		}
	}
	h.mu.Unlock()
	for _, s := range slow {
		h.remove(s, true)
	}
}

func (h *hub) count() int { return int(h.n.Load()) }

func (h *hub) closeAll() {
	h.mu.Lock()
	subs := make([]*Subscription, 0, len(h.subs))
	for s := range h.subs {
		subs = append(subs, s)
	}
	h.mu.Unlock()
	for _, s := range subs {
		h.remove(s, false)
	}
}

// ErrTooManySubscribers is returned by Subscribe at limits.max_subscribers.
var ErrTooManySubscribers = errorString("too many feed subscribers (limits.max_subscribers)")

type errorString string

func (e errorString) Error() string { return string(e) }

type subscribeResult struct {
	sub *Subscription
	err error
}

// subscribe registers a subscriber and queues the snapshot as its first
// event, on the loop, so no event falls between the two. The heartbeats not
// yet taken are taken first: their events go to the existing subscribers,
// and the snapshot includes them.
func (m *Manager) subscribe(buf int) subscribeResult {
	m.drainBeats()
	sub, ok := m.feed.add(buf)
	if !ok {
		return subscribeResult{err: ErrTooManySubscribers}
	}
	sub.c <- m.snapshotEvent(EventSnapshot)
	return subscribeResult{sub: sub}
}

// Subscribe starts a feed subscription with room for buf events (at least 2):
// the first event is a snapshot. The caller must Cancel it or drain C until it closes.
func (m *Manager) Subscribe(buf int) (*Subscription, error) {
	buf = max(buf, 2)
	r, err := ask(m, context.Background(), func(res chan<- subscribeResult) event { return evSubscribe{buf: buf, res: res} })
	if err != nil {
		return nil, errorString("manager stopped")
	}
	return r.sub, r.err
}

// Subscribers returns the number of feed subscribers.
func (m *Manager) Subscribers() int { return m.feed.count() }

func (m *Manager) snapshotEvent(typ string) []byte {
	return m.encodeStatus(m.snapshot(time.Now()).public(), func(st Status) []byte {
		b, _ := json.Marshal(struct {
			Type   string `json:"type"`
			Status Status `json:"status"`
		}{typ, st})
		return b
	})
}

// touch marks a cluster's state as changed; flushFeed publishes it.
func (m *Manager) touch(s *slot) {
	m.stateDirty = true
	if !s.dirty {
		s.dirty = true
		m.dirty = append(m.dirty, s)
	}
}

// flushFeed publishes what changed during one loop event: cluster states and
// the deploy's progress.
func (m *Manager) flushFeed() {
	if len(m.dirty) > 0 {
		table := m.table()
		now := time.Now()
		for _, s := range m.dirty {
			s.dirty = false
			if s.id >= len(table.slots) || table.slots[s.id] != s {
				continue // a slot of a topology not (or no longer) in force
			}
			cs := m.clusterStatus(table, s, now).public()
			cs.Heartbeat = nil
			b, _ := json.Marshal(struct {
				Type    string        `json:"type"`
				Cluster ClusterStatus `json:"cluster"`
			}{EventCluster, cs})
			m.feed.publish(b)
		}
		m.dirty = m.dirty[:0]
	}
	if m.feedDiscordDirty {
		m.feedDiscordDirty = false
		b, _ := json.Marshal(struct {
			Type    string         `json:"type"`
			Discord *DiscordStatus `json:"discord"`
		}{EventDiscord, m.discordStatus(time.Now())})
		if !bytes.Equal(b, m.discLast) {
			m.discLast = b
			m.feed.publish(b)
		}
	}
	m.flushHosts()
	// Only after the deploy was fed an event: its status is hundreds of KiB
	// of JSON with many clusters, too much to build after every heartbeat.
	if m.dep != nil && m.depFed && (m.depPublished != m.dep || !m.depPublishedDone) {
		m.depFed = false
		st := m.dep.Status()
		b, _ := json.Marshal(struct {
			Type   string `json:"type"`
			Deploy any    `json:"deploy"`
		}{EventDeploy, st})
		if !bytes.Equal(b, m.depLast) {
			m.depLast = b
			m.feed.publish(b)
		}
		m.depPublished, m.depPublishedDone = m.dep, m.dep.Done()
	}
}

// publishHeartbeat passes a heartbeat's payload to the feed unread.
func (m *Manager) publishHeartbeat(p *proc, ready bool, payload json.RawMessage, at time.Time) {
	if m.feed.count() == 0 {
		return
	}
	b := make([]byte, 0, 128+len(payload))
	b = append(b, `{"type":"heartbeat","cluster":`...)
	b = strconv.AppendInt(b, int64(p.cluster), 10)
	b = append(b, `,"generation":`...)
	b = strconv.AppendInt(b, p.gen, 10)
	b = append(b, `,"pid":`...)
	b = strconv.AppendInt(b, int64(p.pid()), 10)
	b = append(b, `,"ready":`...)
	b = strconv.AppendBool(b, ready)
	b = append(b, `,"at":"`...)
	b = at.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, '"')
	if len(payload) > 0 {
		b = append(b, `,"payload":`...)
		b = append(b, payload...)
	}
	b = append(b, '}')
	m.feed.publish(b)
}

// statusOp is the read-only STATUS op: the reply payload is a Status.
func (m *Manager) statusOp(c *conn, f *ipc.Frame) {
	if f.ID == "" {
		return
	}
	st, err := m.Status(context.Background())
	if err != nil {
		c.replyErr(f.ID, ipc.CodeShuttingDown, "manager is shutting down")
		return
	}
	c.reply(f.ID, m.encodeStatus(st, func(st Status) []byte {
		b, _ := json.Marshal(st)
		return b
	}))
}

// watch is the read-only WATCH op: the connection receives the state feed as
// EVENT frames, a snapshot first. A watcher that falls limits.feed_buffer
// events behind is dropped from the feed (its connection stays open and it
// learns through a final EVENT of type "dropped"); it may then WATCH again
// for a new snapshot. A connection watches at most once at a time.
func (m *Manager) watch(c *conn, f *ipc.Frame) {
	if !c.watching.CompareAndSwap(false, true) {
		c.replyErr(f.ID, ipc.CodeForbidden, "this connection already watches the feed")
		return
	}
	sub, err := m.Subscribe(m.cfg.Limits.FeedBuffer)
	if err != nil {
		c.watching.Store(false)
		c.replyErr(f.ID, ipc.CodeBusy, "%v", err)
		return
	}
	c.reply(f.ID, json.RawMessage(`{"watching":true}`))
	go func() {
		defer sub.Cancel()
		for {
			select {
			case ev, ok := <-sub.C:
				if !ok {
					if sub.Dropped() {
						// Free the slot before saying so: the watcher may WATCH again at once.
						c.watching.Store(false)
						c.send(&ipc.Frame{Op: ipc.OpEvent, Payload: json.RawMessage(`{"type":"dropped"}`)})
					}
					return
				}
				if err := c.send(&ipc.Frame{Op: ipc.OpEvent, Payload: ev}); err != nil {
					if errors.Is(err, ipc.ErrFrameTooLarge) {
						// Even without heartbeat payloads (a huge fleet's
						// snapshot with a deploy's status): end the watch
						// as a drop, so the watcher knows and may WATCH again.
						c.watching.Store(false)
						c.send(&ipc.Frame{Op: ipc.OpEvent, Payload: json.RawMessage(`{"type":"dropped","reason":"frame_too_large"}`)})
					}
					return
				}
			case <-c.watchStop:
				return
			}
		}
	}()
}
