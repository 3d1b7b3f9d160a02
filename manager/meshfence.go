package manager

import (
	"slices"
	"sync"
	"syscall"

	"github.com/sm-supervisor/sm/ipc"
	"github.com/sm-supervisor/sm/supervise"
)

// The mesh agent's watchdog (mesh/watchdog.go) fences for a loop that cannot:
// when a Stop has not been confirmed in time, it calls meshKill, which kills
// the cluster's processes from a registry the loop does not own, so that a
// wedged loop never leaves a cluster running past the lease. The loop, once
// it runs again, still hears of the Stop and of the exits as usual.

// procGroups is every live process of this host by cluster, kept apart
// from the loop: added on the loop when a process is spawned or adopted,
// removed by its exit watcher when the kernel reports it gone.
type procGroups struct {
	mu sync.Mutex // guards by; taken after the agent's lock (meshKill runs under it)
	by map[int]map[uint64]*groupEntry
}

type groupEntry struct {
	p      supervise.Process
	killed bool // meshKill sent it SIGKILL already
}

func (g *procGroups) add(cluster int, seq uint64, p supervise.Process) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.by == nil {
		g.by = map[int]map[uint64]*groupEntry{}
	}
	if g.by[cluster] == nil {
		g.by[cluster] = map[uint64]*groupEntry{}
	}
	g.by[cluster][seq] = &groupEntry{p: p}
}

func (g *procGroups) remove(cluster int, seq uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.by[cluster], seq)
}

// kill sends SIGKILL to the process group of every live process of cluster,
// and returns the pids it had not signalled before.
func (g *procGroups) kill(cluster int) []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	var pids []int
	for _, e := range g.by[cluster] {
		if e.killed {
			continue
		}
		e.killed = true
		_ = e.p.Signal(syscall.SIGKILL) // the group it leads; an exited one is no error to us
		pids = append(pids, e.p.PID())
	}
	slices.Sort(pids)
	return pids
}

// meshKill is the agent's Kill: cluster c's Stop was not confirmed in time.
// It kills c's processes and marks the slot fenced, so that a loop that
// runs again and hears of their exit before the Stop does not respawn them.
// It runs under the agent's lock: it must not block.
func (m *Manager) meshKill(c int) {
	if t := m.table(); c >= 0 && c < len(t.slots) {
		t.slots[c].fenced.Store(true)
	}
	if pids := m.mesh.groups.kill(c); len(pids) > 0 {
		m.log.Error("mesh: the loop did not confirm a fence in time: killed the cluster's processes itself",
			"cluster", c, "pids", pids)
	}
}

// errFenced is the spawn refusal of a cluster the watchdog fenced.
var errFenced = ipc.Errorf(ipc.CodeUnavailable, "fenced: the lease is no longer this host's")
