package manager

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/sm-supervisor/sm/ipc"
	"github.com/sm-supervisor/sm/supervise"
	"github.com/sm-supervisor/sm/unixsock"
)

// registerResult is the loop's answer to a REGISTER or a DEPLOY.
type registerResult struct {
	payload json.RawMessage
	err     *ipc.Error
}

// admitCluster checks a cluster's REGISTER against the process the manager
// spawned for that slot: token, generation, liveness, and the peer.
func (m *Manager) admitCluster(c *conn, f *ipc.Frame) registerResult {
	forbidden := func(format string, args ...any) registerResult {
		m.log.Warn("cluster REGISTER refused", "conn", c.id, "peer_pid", c.cred.PID, "reason", fmt.Sprintf(format, args...))
		return registerResult{err: ipc.Errorf(ipc.CodeForbidden, format, args...)}
	}
	if f.Cluster == nil || f.Generation == nil {
		return registerResult{err: ipc.Errorf(ipc.CodeBadFrame, "cluster REGISTER needs cluster and generation")}
	}
	id, gen := *f.Cluster, *f.Generation
	var p *proc
	hash := []byte(hashToken(f.Token))
	for _, cand := range m.procs {
		if cand.cluster == id && cand.gen == gen && subtle.ConstantTimeCompare([]byte(cand.tokenHash), hash) == 1 {
			p = cand
			break
		}
	}
	if p == nil {
		return forbidden("no process of cluster %d generation %d holds that token", id, gen)
	}
	s := p.slot
	switch err := s.sup.Admissible(p); {
	case errors.Is(err, supervise.ErrConnected):
		return forbidden("cluster %d generation %d is already registered on a live connection", id, gen)
	case err != nil:
		return forbidden("cluster %d generation %d is being stopped", id, gen)
	}
	// The token could leak; the kernel's word on who connected cannot. The peer
	// must be the spawned process or one in its process group (a wrapper's child).
	if c.cred.PID != p.pid() {
		if pg, err := unixsock.ProcessGroup(c.cred.PID); err != nil || pg != p.pid() {
			return forbidden("peer pid %d is not cluster %d's process %d or its group", c.cred.PID, id, p.pid())
		}
	}
	c.proc = p
	c.role = ipc.RoleCluster
	c.name = "cluster-" + strconv.Itoa(id)
	p.conn.Store(c)
	m.do(s, s.sup.Registered(time.Now(), p))
	m.log.Info("cluster registered", "cluster", id, "generation", gen, "pid", p.pid(), "conn", c.id)
	reply := map[string]any{
		"cluster":               id,
		"generation":            gen,
		"shard_first":           s.first,
		"shard_last":            s.last,
		"total_shards":          s.topo.Total,
		"active":                p.view().Activated,
		"heartbeat_interval_ms": m.cfg.Heartbeat.Interval.Milliseconds(),
		"heartbeat_timeout_ms":  m.cfg.Heartbeat.Timeout.Milliseconds(),
		"max_frame_bytes":       m.cfg.Limits.MaxFrameBytes,
		"identify": map[string]any{
			"gate":            true,
			"spacing_ms":      m.disc.gate.Spacing().Milliseconds(),
			"max_concurrency": m.disc.gate.MaxConcurrency(),
		},
	}
	m.registerFields(reply, p) // start, resume, gateway (identify.go)
	payload, _ := json.Marshal(reply)
	return registerResult{payload: payload}
}

// greeted follows p's REGISTER reply: what an adopted process needs once it
// is back on a connection (quiesced if stale, routed again if it was).
func (m *Manager) greeted(p *proc) {
	s := p.slot
	acts := s.sup.Greeted(time.Now(), p)
	for _, a := range acts {
		if a.Kind == supervise.ActQuiesce {
			m.log.Warn("quiescing a surviving process that is no longer a cluster's", "cluster", p.cluster, "generation", p.gen, "pid", p.pid())
		}
	}
	m.do(s, acts)
}
