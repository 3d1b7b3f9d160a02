package harness

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sm-supervisor/sm/generation"
)

// Variables sm-manager sets in the environment of every cluster process.
const (
	EnvSocket      = "SM_SOCKET"
	EnvCluster     = "SM_CLUSTER"
	EnvGeneration  = "SM_GENERATION"
	EnvShardFirst  = "SM_SHARD_FIRST"
	EnvShardLast   = "SM_SHARD_LAST"
	EnvTotalShards = "SM_TOTAL_SHARDS"
	EnvToken       = "SM_TOKEN"
	// EnvOrphanTimeout, set by a manager in a mesh (docs/multihost.md), is
	// how long in milliseconds the process may go without reaching the
	// manager's socket before it exits with OrphanExitCode. Optional.
	EnvOrphanTimeout = "SM_ORPHAN_TIMEOUT_MS"
	// EnvHostID names the host the manager runs on: its mesh.host_id, else
	// the machine's hostname. Optional: an older manager sets none.
	EnvHostID = "SM_HOST_ID"
)

// EnvFlags holds extra command-line flags, space-separated, parsed after the
// real ones so they win. EnvFlags + "_<cluster>" (say SM_HARNESS_FLAGS_2) is
// parsed after that and applies to one cluster only. They let a test set failure
// switches through the environment instead of the command line.
const EnvFlags = "SM_HARNESS_FLAGS"

// Env is what the manager tells a cluster process through its environment.
type Env struct {
	Socket      string
	Cluster     int
	Generation  int64
	ShardFirst  int
	ShardLast   int
	TotalShards int
	Token       string
	// OrphanTimeout is EnvOrphanTimeout; 0 (unset) is never.
	OrphanTimeout time.Duration
	// Host is SM_HOST_ID, "" when the manager set none.
	Host string
}

// ParseEnv reads and checks the SM_* variables through getenv (os.Getenv in
// main), reporting every missing or malformed one at once.
func ParseEnv(getenv func(string) string) (Env, error) {
	var (
		e    Env
		errs []string
	)
	str := func(key string) string {
		v := getenv(key)
		if v == "" {
			errs = append(errs, key+" is not set")
		}
		return v
	}
	num := func(key string) int64 {
		v := str(key)
		if v == "" {
			return 0
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			errs = append(errs, fmt.Sprintf("%s=%q is not a non-negative integer", key, v))
			return 0
		}
		return n
	}
	e.Socket = str(EnvSocket)
	e.Cluster = int(num(EnvCluster))
	e.Generation = num(EnvGeneration)
	e.ShardFirst = int(num(EnvShardFirst))
	e.ShardLast = int(num(EnvShardLast))
	e.TotalShards = int(num(EnvTotalShards))
	e.Token = str(EnvToken)
	if v := getenv(EnvOrphanTimeout); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			errs = append(errs, fmt.Sprintf("%s=%q is not a positive integer", EnvOrphanTimeout, v))
		}
		e.OrphanTimeout = time.Duration(n) * time.Millisecond
	}
	e.Host = getenv(EnvHostID)
	if len(errs) == 0 {
		switch {
		case e.TotalShards < 1:
			errs = append(errs, EnvTotalShards+" must be at least 1")
		case e.ShardFirst > e.ShardLast:
			errs = append(errs, fmt.Sprintf("%s=%d is after %s=%d", EnvShardFirst, e.ShardFirst, EnvShardLast, e.ShardLast))
		case e.ShardLast >= e.TotalShards:
			errs = append(errs, fmt.Sprintf("%s=%d is not below %s=%d", EnvShardLast, e.ShardLast, EnvTotalShards, e.TotalShards))
		}
	}
	if len(errs) > 0 {
		return Env{}, fmt.Errorf("environment: %s", strings.Join(errs, "; "))
	}
	return e, nil
}

// Shards returns how many shards the cluster holds.
func (e Env) Shards() int { return e.ShardLast - e.ShardFirst + 1 }

// Owns reports whether shard s is one of the cluster's.
func (e Env) Owns(s int) bool { return s >= e.ShardFirst && s <= e.ShardLast }

// Topology returns a topology that agrees with the manager's on every shard
// question the cluster can ask (PerCluster only matters for the last cluster's
// range, which Env already gives).
func (e Env) Topology() generation.Topology {
	return generation.Topology{Total: e.TotalShards, PerCluster: e.Shards()}
}

// extraArgs returns the flags from EnvFlags and then from its per-cluster form.
func extraArgs(getenv func(string) string, cluster int) []string {
	args := strings.Fields(getenv(EnvFlags))
	return append(args, strings.Fields(getenv(EnvFlags+"_"+strconv.Itoa(cluster)))...)
}

// childEnv is the environment of an --exec child: the harness's own, without the
// registration token (the harness registers, so the child never needs it) and
// without the harness's own flags.
func childEnv(environ []string) []string {
	out := make([]string, 0, len(environ))
	for _, kv := range environ {
		key, _, _ := strings.Cut(kv, "=")
		if key == EnvToken || key == EnvFlags || strings.HasPrefix(key, EnvFlags+"_") {
			continue
		}
		out = append(out, kv)
	}
	return out
}
