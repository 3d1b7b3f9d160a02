package manager

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/sm-supervisor/sm/generation"
	"github.com/sm-supervisor/sm/supervise"
)

// stateFileName is the file in state.dir that lets a restarted manager
// re-adopt the clusters that outlived its predecessor.
const stateFileName = "manager-state.json"

// stateVersion is bumped on incompatible changes; a file of another version
// is ignored (its processes are then unknown and refused).
const stateVersion = 1

// savedState is what the state file holds: per live process its identity
// (pid and kernel start time), cluster, generation, a hash of its token and
// its place in routing; and per generation the command it runs.
type savedState struct {
	Version    int                 `json:"version"`
	ManagerPID int                 `json:"manager_pid"`
	Written    time.Time           `json:"written"`
	Generation int64               `json:"generation"`
	Topology   generation.Topology `json:"topology"`
	SlotGens   []int64             `json:"slot_generations"`
	Specs      map[int64]savedSpec `json:"specs"`
	Procs      []savedProc         `json:"procs"`
	// Handoffs are the QUIESCED handoffs waiting for their cluster's next
	// ACTIVATE, by cluster of Topology.
	Handoffs map[int]string `json:"handoffs,omitempty"`
	// MeshHost and MeshBoot name the manager's boot in its mesh, with
	// [mesh]: a successor on the same host takes that boot's leases over
	// (docs/multihost.md).
	MeshHost string `json:"mesh_host,omitempty"`
	MeshBoot string `json:"mesh_boot,omitempty"`
}

type savedSpec struct {
	Argv []string `json:"argv"`
	Env  []string `json:"env,omitempty"`
	Dir  string   `json:"dir,omitempty"`
}

type savedProc struct {
	Cluster    int                 `json:"cluster"`
	Generation int64               `json:"generation"`
	PID        int                 `json:"pid"`
	StartTime  uint64              `json:"start_time"`
	TokenHash  string              `json:"token_sha256"`
	Topology   generation.Topology `json:"topology"`
	ShardFirst int                 `json:"shard_first"`
	ShardLast  int                 `json:"shard_last"`
	Routed     bool                `json:"routed"`
	Activated  bool                `json:"activated"`
	// Start is how it was started (start.go); "" in files from before.
	Start string `json:"start,omitempty"`
}

func hashToken(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}

func (m *Manager) statePath() string {
	if m.cfg.State.Dir == "" {
		return ""
	}
	return filepath.Join(m.cfg.State.Dir, stateFileName)
}

// usedGenerations are the generations whose command may still be needed: the
// newest, each slot's (a restart respawns it), and every live process's.
func (m *Manager) usedGenerations() map[int64]bool {
	used := map[int64]bool{m.gen: true}
	for _, t := range []*routeTable{m.table(), m.next} {
		if t == nil {
			continue
		}
		for _, s := range t.slots {
			used[s.gen] = true
		}
	}
	for _, p := range m.procs {
		used[p.gen] = true
	}
	return used
}

// collectState describes the manager as it is now.
func (m *Manager) collectState() savedState {
	t := m.table()
	st := savedState{
		Version: stateVersion, ManagerPID: os.Getpid(), Written: time.Now(),
		Generation: m.gen, Topology: t.topo, Specs: map[int64]savedSpec{},
		Handoffs: m.savedHandoffs(t),
	}
	if m.mesh != nil {
		st.MeshHost, st.MeshBoot = m.mesh.agent.Me.Host, m.mesh.agent.Me.Boot
	}
	for _, s := range t.slots {
		st.SlotGens = append(st.SlotGens, s.gen)
	}
	used := m.usedGenerations()
	for _, p := range m.procs {
		if p.startTime == 0 {
			continue
		}
		st.Procs = append(st.Procs, savedProc{
			Cluster: p.cluster, Generation: p.gen, PID: p.pid(), StartTime: p.startTime,
			TokenHash: p.tokenHash, Topology: p.slot.topo, ShardFirst: p.slot.first, ShardLast: p.slot.last,
			Routed: m.routedNow(p), Activated: p.view().Activated, Start: startOf(p.reason),
		})
	}
	sort.Slice(st.Procs, func(i, j int) bool { return st.Procs[i].PID < st.Procs[j].PID })
	for g := range used {
		if sp, ok := m.specs[g]; ok {
			st.Specs[g] = savedSpec{Argv: sp.argv, Env: sp.env, Dir: sp.dir}
		}
	}
	return st
}

// saveState writes the state file atomically (temp file, rename): a reader
// sees the old file or the new one, never a mix. No fsync: the file only has
// to survive the manager, not the machine, whose crash takes the clusters too.
func (m *Manager) saveState() error {
	path := m.statePath()
	if path == "" {
		return nil
	}
	b, err := json.MarshalIndent(m.collectState(), "", " ")
	if err != nil {
		return err
	}
	return writeAtomic(path, b)
}

// writeAtomic replaces path with b through a temporary file and a rename.
func writeAtomic(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".state-*")
	if err != nil {
		return fmt.Errorf("state file: %w", err)
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("state file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("state file: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("state file: %w", err)
	}
	return nil
}

// maybeSaveState writes the state file if something changed, at most every
// stateSaveEvery, so a burst of events costs one write.
func (m *Manager) maybeSaveState(now time.Time) {
	// Resume state changes with every heartbeat: written once a second.
	if now.Sub(m.resumeSavedAt) >= resumeSaveEvery {
		m.resumeSavedAt = now
		m.saveResume()
	}
	if !m.stateDirty || now.Sub(m.stateSaved) < stateSaveEvery {
		return
	}
	m.stateDirty = false
	m.stateSaved = now
	if err := m.saveState(); err != nil {
		m.log.Error("cannot write state file; clusters would not be re-adopted after a manager crash", "err", err)
	}
}

const stateSaveEvery = 50 * time.Millisecond

const resumeSaveEvery = time.Second

// persist writes the state file now. Routing and activation changes are
// written before the manager acts on them further (say, QUIESCEs the old
// process after a switch): a manager that dies right after must come back
// knowing which process serves.
func (m *Manager) persist() {
	m.stateDirty = true
	m.stateSaved = time.Time{}
	m.maybeSaveState(time.Now())
}

// removeState deletes the state file after a clean shutdown: nothing is left
// to adopt.
func (m *Manager) removeState() {
	if path := m.statePath(); path != "" {
		// The sessions closed with their clusters: nothing to resume either.
		for _, p := range []string{path, filepath.Join(m.cfg.State.Dir, resumeFileName)} {
			if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
				m.log.Warn("cannot remove state file", "err", err)
			}
		}
	}
}

// loadState reads the state file a previous manager left, if any.
func (m *Manager) loadState() (*savedState, error) {
	path := m.statePath()
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("state file: %w", err)
	}
	var st savedState
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("state file %s: %w", path, err)
	}
	if st.Version != stateVersion {
		return nil, fmt.Errorf("state file %s: version %d, want %d", path, st.Version, stateVersion)
	}
	if err := st.Topology.Validate(); err != nil || len(st.SlotGens) != st.Topology.Clusters() {
		return nil, fmt.Errorf("state file %s: inconsistent topology", path)
	}
	return &st, nil
}

// adoptable checks a recorded process is still the one recorded and watches it.
func adoptable(sp savedProc) (supervise.Process, error) {
	return supervise.Adopt(sp.PID, sp.StartTime)
}
