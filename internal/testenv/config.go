package testenv

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/sm-supervisor/sm/config"
)

// Config is a small, fast topology: 8 shards, 2 per cluster (4 clusters) of
// the cluster-harness Main built, simulating a bot, with the socket in dir,
// short heartbeats, backoffs and timeouts, and no TCP listeners (the tests make
// their own, and run side by side).
func Config(dir string) *config.Config {
	dur := func(v time.Duration) config.Duration { return config.Duration{Duration: v} }
	cfg := config.Default()
	cfg.Socket = filepath.Join(dir, "sm.sock")
	cfg.Topology = config.Topology{TotalShards: 8, ShardsPerCluster: 2}
	cfg.Cluster.Command = []string{Bin("cluster-harness"), "--simulate", "--connect-delay=5ms", "--event-interval=0"}
	cfg.Heartbeat.Interval = dur(50 * time.Millisecond)
	cfg.Heartbeat.Timeout = dur(600 * time.Millisecond)
	cfg.Restart.BackoffMin = dur(20 * time.Millisecond)
	cfg.Restart.BackoffMax = dur(300 * time.Millisecond)
	cfg.Restart.StopGrace = dur(500 * time.Millisecond)
	cfg.Requests.Timeout = dur(3 * time.Second)
	cfg.Shutdown.Timeout = dur(3 * time.Second)
	cfg.Discord.IdentifySpacing = dur(time.Millisecond) // the simulated bot needs no 5s identify gate
	cfg.Status.Listen, cfg.Admin.Listen = "", ""
	return &cfg
}

// WriteConfig saves cfg as TOML to cfg.Path (sm.toml in a new temp dir if it
// has none), where a DEPLOY re-reads it.
func WriteConfig(t testing.TB, cfg *config.Config) {
	t.Helper()
	if cfg.Path == "" {
		cfg.Path = filepath.Join(t.TempDir(), "sm.toml")
	}
	var buf bytes.Buffer
	if err := toml.NewEncoder(&buf).Encode(cfg); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg.Path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}
