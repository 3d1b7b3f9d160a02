package manager

import (
	"time"

	"github.com/sm-supervisor/sm/generation"

	"github.com/sm-supervisor/sm/ipc"
)

// shutdown quiesces every process, waits for their exits up to
// shutdown.timeout, stops the rest, and waits for the kernel to confirm.
func (m *Manager) shutdown() {
	m.log.Info("shutting down: quiescing clusters", "processes", len(m.procs))
	now := time.Now()
	slots := m.supervised()
	for _, s := range slots {
		m.do(s, s.sup.Close(now)) // before the abort: what it releases is not respawned
	}
	m.deploys(func(d *generation.Deploy) {
		if !d.Done() {
			d.Abort("manager shutting down")
		}
	})
	for _, s := range slots {
		m.do(s, s.sup.QuiesceAll(now))
	}
	deadline := time.NewTimer(m.cfg.Shutdown.Timeout.Duration)
	defer deadline.Stop()
	forced := false
	for len(m.procs) > 0 {
		select {
		case ev := <-m.events:
			if ev, ok := ev.(evRegister); ok {
				ev.res <- registerResult{err: ipc.Errorf(ipc.CodeShuttingDown, "manager is shutting down")}
				continue
			}
			m.apply(ev)
		case <-deadline.C:
			if forced {
				m.log.Error("processes did not exit after SIGKILL", "left", len(m.procs))
				return
			}
			forced = true
			m.log.Warn("shutdown timeout: stopping clusters that did not quiesce", "left", len(m.procs))
			for _, s := range m.supervised() {
				m.do(s, s.sup.StopAll(time.Now(), "shutdown timeout"))
			}
			deadline.Reset(m.cfg.Restart.StopGrace.Duration + 5*time.Second)
		}
	}
	m.log.Info("all clusters stopped")
}

// supervised returns every slot with a supervision to tell: the table's,
// and those of processes outside it (a re-clustering's, a survivor's of
// another topology).
func (m *Manager) supervised() []*slot {
	t := m.table()
	slots := append([]*slot(nil), t.slots...)
	seen := make(map[*slot]bool, len(slots))
	for _, s := range slots {
		seen[s] = true
	}
	for _, p := range m.procs {
		if !seen[p.slot] {
			seen[p.slot] = true
			slots = append(slots, p.slot)
		}
	}
	return slots
}
