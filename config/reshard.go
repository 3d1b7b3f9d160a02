package config

import "time"

// Reshard is the [reshard] table: following Discord's recommended shard
// count by itself (docs/deploys.md, "Resharding when Discord asks"). Off by
// default; when on, the manager asks GET /gateway/bot every CheckInterval and,
// when the recommendation has grown to GrowthRatio times the shards running,
// starts a re-clustering DEPLOY exactly as an operator's DEPLOY would.
type Reshard struct {
	// Enabled turns the schedule on. It needs topology.total_shards = "auto"
	// (so a later DEPLOY keeps Discord's count rather than the file's) and a
	// Discord token (which "auto" needs anyway).
	Enabled bool `toml:"enabled"`
	// CheckInterval is the time between two asks of /gateway/bot.
	CheckInterval Duration `toml:"check_interval"`
	// GrowthRatio: reshard once Discord recommends at least this many times
	// the shards running (and more than are running). 1 follows every growth.
	GrowthRatio float64 `toml:"growth_ratio"`
	// MaxParallel is the DEPLOY's max_parallel (a re-clustering switches every
	// cluster at once; this bounds how many new processes start together).
	MaxParallel int `toml:"max_parallel"`
}

// minReshardInterval keeps the schedule from hammering /gateway/bot, which
// Discord rate-limits; tests run it at its floor.
const minReshardInterval = time.Second

// defaultReshard is the [reshard] a file leaves out.
func defaultReshard() Reshard {
	return Reshard{CheckInterval: Duration{time.Hour}, GrowthRatio: 1.5, MaxParallel: 1}
}

// validate checks the [reshard] table against the rest of c.
func (r Reshard) validate(c *Config, bad func(key, format string, args ...any)) {
	if r.CheckInterval.Duration < minReshardInterval {
		bad("reshard.check_interval", "must be at least %v, got %v", minReshardInterval, r.CheckInterval.Duration)
	}
	if r.GrowthRatio < 1 {
		bad("reshard.growth_ratio", "must be at least 1, got %v", r.GrowthRatio)
	}
	if r.MaxParallel < 1 {
		bad("reshard.max_parallel", "must be at least 1, got %d", r.MaxParallel)
	}
	if !r.Enabled {
		return
	}
	switch {
	case !c.Topology.Auto:
		bad("reshard.enabled", `needs topology.total_shards = "auto": a later DEPLOY must keep Discord's count, not the file's`)
	case c.Mesh.NATSURL != "":
		bad("reshard.enabled", "not in a mesh yet: DEPLOY is refused there (docs/multihost.md)")
	}
}
