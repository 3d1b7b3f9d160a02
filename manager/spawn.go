package manager

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/sm-supervisor/sm/discord"
	"github.com/sm-supervisor/sm/supervise"
)

// respawn starts the supervised process of s at its generation, as its
// supervision asked (supervise.ActSpawn), and reports the outcome to it.
// restart says the cluster has been restarted before; a cluster this manager
// never spawned may have been another's, which died (restarted).
func (m *Manager) respawn(s *slot, restart bool) {
	reason := discord.ReasonRestart
	if !restart && !m.restarted {
		reason = discord.ReasonStart
	}
	var p *proc
	var err error
	if s.fenced.Load() {
		err = errFenced // its lease's Stop is on its way to the loop
	} else {
		p, err = m.spawn(s, s.gen, reason)
	}
	now := time.Now()
	if err != nil {
		m.logSpawnFailure(s, s.gen, err)
		m.do(s, s.sup.SpawnFailed(now, err.Error(), publicSpawnFailure(err)))
		return
	}
	m.do(s, s.sup.Spawned(now, p))
}

// logSpawnFailure logs a failed spawn at ERROR without the command's path
// or arguments (logs at info are public too), and the full error at DEBUG;
// the socket's STATUS keeps it as the cluster's last_exit.
func (m *Manager) logSpawnFailure(s *slot, gen int64, err error) {
	m.log.Error("spawn failed", "cluster", s.id, "generation", gen, "reason", publicSpawnFailure(err))
	m.log.Debug("spawn failed: detail", "cluster", s.id, "generation", gen, "err", err)
}

// spawn starts a process for cluster s running generation gen's spec, with
// the environment of the protocol and a fresh token. The caller tells s's
// supervision (Spawned or DeploySpawned).
func (m *Manager) spawn(s *slot, gen int64, reason discord.Reason) (*proc, error) {
	sp, ok := m.specs[gen]
	if !ok {
		return nil, fmt.Errorf("no command known for generation %d", gen)
	}
	token := newToken()
	p := &proc{seq: m.procSeq.Add(1), cluster: s.id, slot: s, gen: gen, tokenHash: hashToken(token), reason: reason}
	env := append([]string{
		"SM_SOCKET=" + m.cfg.Socket,
		"SM_CLUSTER=" + strconv.Itoa(s.id),
		"SM_GENERATION=" + strconv.FormatInt(gen, 10),
		"SM_SHARD_FIRST=" + strconv.Itoa(s.first),
		"SM_SHARD_LAST=" + strconv.Itoa(s.last),
		"SM_TOTAL_SHARDS=" + strconv.Itoa(s.topo.Total),
		"SM_TOKEN=" + token,
		"SM_HOST_ID=" + m.hostID(),
	}, sp.env...)
	if m.cfg.Mesh.Enabled() {
		env = append(env, "SM_ORPHAN_TIMEOUT_MS="+strconv.FormatInt(orphanTimeout(m.cfg.Mesh.Lease.Duration).Milliseconds(), 10))
	}
	process, err := m.spawner.Spawn(supervise.Spec{Argv: sp.argv, Env: env, Dir: sp.dir})
	if err != nil {
		return nil, err
	}
	p.process = process
	p.startTime, _ = supervise.StartTime(process.PID())
	m.procs[p.seq] = p
	m.liveProcs.Add(1)
	m.log.Info("cluster spawned", "cluster", s.id, "generation", gen, "pid", process.PID(), "shards", fmt.Sprintf("%d-%d", s.first, s.last))
	m.watchExit(p)
	return p, nil
}

// hostID names this host to its clusters (SM_HOST_ID): mesh.host_id in a
// mesh, else the machine's hostname, so that records several hosts write
// (cluster-harness --record) say where each process ran.
func (m *Manager) hostID() string {
	if id := m.cfg.Mesh.HostID; id != "" {
		return id
	}
	h, _ := os.Hostname()
	return h
}

func newToken() string {
	b := make([]byte, 24)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// watchExit posts p's confirmed exit to the loop.
func (m *Manager) watchExit(p *proc) {
	if m.mesh != nil {
		m.mesh.groups.add(p.cluster, p.seq, p.process)
	}
	go func() {
		<-p.process.Exited()
		if m.mesh != nil {
			m.mesh.groups.remove(p.cluster, p.seq)
		}
		m.post(evExit{p: p})
	}()
}
