package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/sm-supervisor/sm/backoff"
	"github.com/sm-supervisor/sm/discord"
	"github.com/sm-supervisor/sm/ipc"
)

// newClient returns the harness's connection to the manager: it REGISTERs as
// the cluster named by the environment and, when the manager goes away,
// reconnects and registers again with the same token.
func newClient(cfg Config, log *slog.Logger, handler func(*ipc.Client, *ipc.Frame), onConnect func(*ipc.Client, *ipc.Frame)) *ipc.Client {
	c := ipc.NewClient(ipc.ClientConfig{
		Path: cfg.Env.Socket,
		Register: ipc.Frame{
			Role:       ipc.RoleCluster,
			Cluster:    ipc.Int(cfg.Env.Cluster),
			Generation: ipc.Int64(cfg.Env.Generation),
			Token:      cfg.Env.Token,
			PID:        os.Getpid(),
		},
		Options:   ipc.Options{MaxFrameBytes: cfg.MaxFrameBytes},
		Handler:   handler,
		OnConnect: onConnect,
		Reconnect: true,
		Backoff:   reconnectBackoff(cfg.Backoff, cfg.Env.OrphanTimeout),
		Logger:    log,
	})
	if cfg.onClient != nil {
		cfg.onClient(c)
	}
	return c
}

// reconnectBackoff is p (ipc's default when zero), its longest wait cut to
// an eighth of the orphan timeout when there is one, so that a successor
// manager that is up in time is found in time.
func reconnectBackoff(p backoff.Policy, orphan time.Duration) backoff.Policy {
	if orphan <= 0 {
		return p
	}
	if p.Min == 0 {
		p = backoff.Policy{Min: 50 * time.Millisecond, Max: 5 * time.Second, Jitter: 0.2}
	}
	p.Max = min(p.Max, max(orphan/8, time.Millisecond))
	p.Min = min(p.Min, p.Max)
	return p
}

// Registration is the payload of the manager's REPLY to REGISTER. Fields it
// leaves out stay nil.
type Registration struct {
	Cluster             *int   `json:"cluster"`
	Generation          *int64 `json:"generation"`
	ShardFirst          *int   `json:"shard_first"`
	ShardLast           *int   `json:"shard_last"`
	TotalShards         *int   `json:"total_shards"`
	Active              *bool  `json:"active"`
	HeartbeatIntervalMS *int64 `json:"heartbeat_interval_ms"`

	// Identify describes the manager's identify gate; nil when the reply has
	// no "identify" (an older manager, which has none).
	Identify *IdentifyGate `json:"-"`
	// Resume is the resume state the manager hands over for the cluster's
	// shards (after a crash or a manager restart), as sent; see Resumable.
	Resume []discord.ResumeState `json:"-"`
	// Problems lists the parts of the payload that could not be read; the
	// rest of it still counts.
	Problems []string `json:"-"`
}

// IdentifyGate is the "identify" object of the REGISTER reply.
type IdentifyGate struct {
	// Gate: ask the manager (op IDENTIFY) before each IDENTIFY.
	Gate           bool  `json:"gate"`
	SpacingMS      int64 `json:"spacing_ms"`
	MaxConcurrency int   `json:"max_concurrency"`
}

// parseRegistration reads a REGISTER reply payload; an empty one is no error.
// A malformed "identify" or "resume" is no error either, but a Problem: the
// harness then asks the gate anyway (an older manager answers unknown_op and
// the shard identifies) and resumes nothing, the safe ways to be wrong.
func parseRegistration(payload json.RawMessage) (Registration, error) {
	var r Registration
	if len(payload) == 0 || string(payload) == "null" {
		return r, nil
	}
	var extra struct {
		Identify json.RawMessage `json:"identify"`
		Resume   json.RawMessage `json:"resume"`
	}
	if err := json.Unmarshal(payload, &r); err != nil {
		return Registration{}, fmt.Errorf("REGISTER reply payload: %w", err)
	}
	if err := json.Unmarshal(payload, &extra); err != nil {
		return Registration{}, fmt.Errorf("REGISTER reply payload: %w", err)
	}
	if len(extra.Identify) > 0 && string(extra.Identify) != "null" {
		r.Identify = new(IdentifyGate)
		if err := json.Unmarshal(extra.Identify, r.Identify); err != nil {
			r.Identify = &IdentifyGate{Gate: true}
			r.Problems = append(r.Problems, fmt.Sprintf("identify: %v (asking the gate anyway)", err))
		}
	}
	if len(extra.Resume) > 0 && string(extra.Resume) != "null" {
		if err := json.Unmarshal(extra.Resume, &r.Resume); err != nil {
			r.Resume = nil
			r.Problems = append(r.Problems, fmt.Sprintf("resume: %v (resuming nothing)", err))
		}
	}
	return r, nil
}

// GateOn reports whether the manager wants an IDENTIFY asked for first.
func (r Registration) GateOn() bool { return r.Identify != nil && r.Identify.Gate }

// Resumable returns the usable resume state by shard: valid entries for
// shards of env. The others are listed as problems, and the shards they name
// identify instead.
func (r Registration) Resumable(env Env) (map[int]discord.ResumeState, []string) {
	var (
		out      map[int]discord.ResumeState
		problems []string
	)
	for _, st := range r.Resume {
		switch err := st.Validate(); {
		case err != nil:
			problems = append(problems, err.Error())
		case !env.Owns(st.Shard):
			problems = append(problems, fmt.Sprintf("resume state of shard %d: not a shard of this cluster (%d..%d)", st.Shard, env.ShardFirst, env.ShardLast))
		case st.ShardCount != 0 && st.ShardCount != env.TotalShards:
			// The manager hands out only sessions of the topology in force;
			// a count of 0 comes from a manager older than shard_count.
			problems = append(problems, fmt.Sprintf("resume state of shard %d: a session of %d shards, this process has %d", st.Shard, st.ShardCount, env.TotalShards))
		default:
			if out == nil {
				out = make(map[int]discord.ResumeState)
			}
			out[st.Shard] = st
		}
	}
	return out, problems
}

// HeartbeatInterval is the interval the manager asks for, or fallback when it
// names none (or nonsense).
func (r Registration) HeartbeatInterval(fallback time.Duration) time.Duration {
	if r.HeartbeatIntervalMS == nil || *r.HeartbeatIntervalMS <= 0 {
		return fallback
	}
	return time.Duration(*r.HeartbeatIntervalMS) * time.Millisecond
}

// Mismatches lists where the manager's view of the cluster differs from the
// environment the process was started with. The environment wins (the shards
// are already connecting); a mismatch is worth a warning.
func (r Registration) Mismatches(env Env) []string {
	var out []string
	check := func(name string, got *int, want int) {
		if got != nil && *got != want {
			out = append(out, fmt.Sprintf("%s: manager says %d, environment %d", name, *got, want))
		}
	}
	check("cluster", r.Cluster, env.Cluster)
	if r.Generation != nil && *r.Generation != env.Generation {
		out = append(out, fmt.Sprintf("generation: manager says %d, environment %d", *r.Generation, env.Generation))
	}
	check("shard_first", r.ShardFirst, env.ShardFirst)
	check("shard_last", r.ShardLast, env.ShardLast)
	check("total_shards", r.TotalShards, env.TotalShards)
	return out
}

// logRegistration reads a REGISTER reply and logs it and any mismatch.
func logRegistration(log *slog.Logger, env Env, reply *ipc.Frame) Registration {
	reg, err := parseRegistration(reply.Payload)
	if err != nil {
		log.Warn("registered, but the reply payload is unreadable", "err", err)
		return reg
	}
	log.Info("registered with the manager", "payload", reply.Payload)
	for _, m := range reg.Mismatches(env) {
		log.Warn("manager disagrees with the environment", "mismatch", m)
	}
	for _, p := range reg.Problems {
		log.Warn("part of the REGISTER reply is unreadable", "problem", p)
	}
	return reg
}

// flushTimeout bounds each wait of sendAndFlush and flush.
const flushTimeout = time.Second

// sendAndFlush sends f (waiting a little for a connection if there is none)
// and then flushes, so that f reaches the manager before the process exits.
func sendAndFlush(c *ipc.Client, f *ipc.Frame) error {
	err := c.Send(f)
	if errors.Is(err, ipc.ErrUnavailable) {
		ctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
		err = c.WaitConnected(ctx)
		cancel()
		if err == nil {
			err = c.Send(f)
		}
	}
	if err != nil {
		return fmt.Errorf("send %s: %w", f.Op, err)
	}
	return flush(c)
}

// flush returns once every frame c sent so far has been written to the
// socket, or after flushTimeout. It is needed because ending an ipc.Client
// drops frames still queued.
func flush(c *ipc.Client) error {
	ctx, cancel := context.WithTimeout(context.Background(), flushTimeout)
	defer cancel()
	if err := c.Flush(ctx); err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	return nil
}

// offer puts v in ch (capacity 1), replacing a value not yet taken: the reader
// wants only the latest. ch must have one sender.
func offer[T any](ch chan T, v T) {
	for {
		select {
		case ch <- v:
			return
		default:
		}
		select {
		case <-ch:
		default:
		}
	}
}
