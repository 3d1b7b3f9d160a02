package harness

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/sm-supervisor/sm/ipc"
)

// Run runs the harness in cfg.Mode until it is done: the simulated bot until it
// has quiesced (nil) or crashed on purpose (*ExitError), the exec bridge until
// its child exits (nil for status 0, else *ExitError). Cancelling ctx is a
// clean stop and returns nil. A REGISTER the manager refuses is an error
// wrapping ipc.ErrRegisterRefused.
func Run(ctx context.Context, cfg Config) error {
	cfg = cfg.withDefaults()
	if cfg.ExitOnStart != nil {
		cfg.Logger.Warn("exiting at start (--exit-on-start)", "exit_code", *cfg.ExitOnStart)
		return &ExitError{Code: *cfg.ExitOnStart, Reason: "--exit-on-start"}
	}
	cfg.Logger.Info("cluster-harness starting", "mode", cfg.Mode.String(),
		"shard_first", cfg.Env.ShardFirst, "shard_last", cfg.Env.ShardLast, "total_shards", cfg.Env.TotalShards)
	// An orphan (Env.OrphanTimeout without reaching the manager) ends ctx
	// with errOrphaned: the bot stops at once, and the result is
	// OrphanExitCode whatever the stop returned.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var watching sync.WaitGroup
	cfg.onClient = func(c *ipc.Client) {
		if cfg.Env.OrphanTimeout > 0 {
			watching.Go(func() { watchOrphan(ctx, cancel, c.Connected, cfg.Env.OrphanTimeout, cfg.Now) })
		}
	}
	var err error
	switch cfg.Mode {
	case ModeExec:
		err = runBridge(ctx, cfg)
	default:
		err = runSim(ctx, cfg)
	}
	isOrphan := orphaned(ctx)
	cancel(nil)
	watching.Wait()
	if isOrphan {
		cfg.Logger.Error("exiting: the manager's socket could not be reached in time; another host may take this cluster over",
			"orphan_timeout", cfg.Env.OrphanTimeout, "exit_code", OrphanExitCode)
		return orphanError(cfg.Env.OrphanTimeout)
	}
	var exit *ExitError
	if err != nil && !errors.As(err, &exit) {
		err = fmt.Errorf("cluster %d generation %d: %w", cfg.Env.Cluster, cfg.Env.Generation, err)
	}
	return err
}

// withDefaults fills the fields a caller may leave zero.
func (c Config) withDefaults() Config {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Stderr == nil {
		c.Stderr = os.Stderr
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.MaxFrameBytes <= 0 {
		c.MaxFrameBytes = ipc.DefaultOptions.MaxFrameBytes
	}
	if c.ShutdownTimeout <= 0 {
		c.ShutdownTimeout = 5 * time.Second
	}
	if c.Sim.HeartbeatInterval <= 0 {
		c.Sim.HeartbeatInterval = time.Second
	}
	if c.Sim.IdentifyTimeout <= 0 {
		c.Sim.IdentifyTimeout = 10 * time.Minute
	}
	if c.Sim.IdentifyRetry <= 0 {
		c.Sim.IdentifyRetry = 5 * time.Second
	}
	return c
}
