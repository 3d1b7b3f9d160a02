package manager

import "time"

// Request deadlines. Arming a runtime timer for every forwarded request (and
// stopping it at the reply) was a tenth of the manager's CPU on the routed
// path (docs/performance.md). Nearly every request has the same timeout
// (requests.timeout), so their deadlines fall in the order they were sent:
// they go on one list, oldest first, under the pending table's lock, and one
// timer watches the oldest. The list is intrusive (its links live in pending)
// rather than a container/list, whose Element would be one more allocation
// per request on the path this exists to lighten. A reply unlinks its request in the
// same critical section that removes it from the table; the timer fires about
// once per timeout under steady load, finds the requests that are due at the
// head, and re-arms for the next. What does not fit — a shorter timeout_ms,
// a request waiting for its cluster — keeps a timer of its own (pending.timer).
//
// Requests are linked in send order, and their deadlines were computed a
// moment earlier (at arrival), so neighbours can be out of order by the time
// between arrival and send: a request can time out that much late.

// deadlines is the list of forwarded requests timed by the shared timer. All
// of it is guarded by Manager.pmu.
type deadlines struct {
	head, tail *pending
	timer      *time.Timer
	armed      bool
}

// pushDeadlineLocked links p, forwarded with the default timeout, at the
// tail and arms the timer if it is idle.
func (m *Manager) pushDeadlineLocked(p *pending) { m.dl.push(p, m.sweepDeadlines) }

// push links p at the tail of l and, if l's timer is idle, arms it to call
// sweep at the head's deadline. The caller holds the lock guarding l.
func (l *deadlines) push(p *pending, sweep func()) {
	p.listed = true
	p.prev, p.next = l.tail, nil
	if l.tail != nil {
		l.tail.next = p
	} else {
		l.head = p
	}
	l.tail = p
	if !l.armed {
		l.armed = true
		d := time.Until(l.head.deadline)
		if l.timer == nil {
			l.timer = time.AfterFunc(d, sweep)
		} else {
			l.timer.Reset(d)
		}
	}
}

// unlinkDeadlineLocked takes p off the list if it is on it.
func (m *Manager) unlinkDeadlineLocked(p *pending) { m.dl.unlink(p) }

// unlink takes p off l if it is on it. The caller holds the lock guarding l.
func (l *deadlines) unlink(p *pending) {
	if !p.listed {
		return
	}
	p.listed = false
	if p.prev != nil {
		p.prev.next = p.next
	} else {
		l.head = p.next
	}
	if p.next != nil {
		p.next.prev = p.prev
	} else {
		l.tail = p.prev
	}
	p.prev, p.next = nil, nil
}

// unpendLocked removes p (forwarded as mid) from the pending table and the
// deadline list.
func (m *Manager) unpendLocked(mid uint64, p *pending) {
	delete(m.pending, mid)
	m.unlinkDeadlineLocked(p)
}

// sweepDeadlines is the shared timer: it expires the requests at the head
// whose deadline has passed and re-arms for the next.
func (m *Manager) sweepDeadlines() {
	m.pmu.Lock()
	due := m.dl.due(time.Now(), func(p *pending) {
		if mid := p.mid.Load(); m.pending[mid] == p {
			delete(m.pending, mid)
		}
	})
	m.pmu.Unlock()
	for _, p := range due {
		m.expire(p)
	}
}

// due unlinks the requests at the head of l whose deadline has passed at
// now, handing each to drop (to take it off its table), re-arms the timer
// for the next, and returns them. The caller holds the lock guarding l.
func (l *deadlines) due(now time.Time, drop func(*pending)) []*pending {
	var out []*pending
	for p := l.head; p != nil && !p.deadline.After(now); p = l.head {
		drop(p)
		l.unlink(p)
		out = append(out, p)
	}
	if l.head != nil {
		l.timer.Reset(l.head.deadline.Sub(now))
	} else {
		l.armed = false
	}
	return out
}

// clearDeadlinesLocked drops the whole list (every pending request is being
// failed) and stops the timer.
func (m *Manager) clearDeadlinesLocked() { m.dl.clear() }

// clear drops the whole of l and stops its timer.
func (l *deadlines) clear() {
	for p := l.head; p != nil; {
		next := p.next
		p.listed, p.prev, p.next = false, nil, nil
		p = next
	}
	l.head, l.tail = nil, nil
	if l.timer != nil {
		l.timer.Stop()
	}
	l.armed = false
}
