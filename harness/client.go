package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/sm-supervisor/sm/ipc"
)

// newClient returns the harness's connection to the manager: it REGISTERs as
// the cluster named by the environment and, when the manager goes away,
// reconnects and registers again with the same token.
func newClient(cfg Config, log *slog.Logger, handler func(*ipc.Client, *ipc.Frame), onConnect func(*ipc.Client, *ipc.Frame)) *ipc.Client {
	return ipc.NewClient(ipc.ClientConfig{
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
		Backoff:   cfg.Backoff,
		Logger:    log,
	})
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
}

// parseRegistration reads a REGISTER reply payload; an empty one is no error.
func parseRegistration(payload json.RawMessage) (Registration, error) {
	var r Registration
	if len(payload) == 0 || string(payload) == "null" {
		return r, nil
	}
	if err := json.Unmarshal(payload, &r); err != nil {
		return Registration{}, fmt.Errorf("REGISTER reply payload: %w", err)
	}
	return r, nil
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
