// Package generation holds the pure core of sm: the shard topology arithmetic,
// the routing table that says which process serves each cluster, and the deploy
// state machine that moves clusters from one generation to the next.
package generation

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Topology is how a bot's shards are split into clusters: Total shards,
// PerCluster contiguous shards per cluster (the last cluster may hold fewer).
type Topology struct {
	Total      int `json:"total_shards"`
	PerCluster int `json:"shards_per_cluster"`
}

// Validate reports whether t describes at least one shard and cluster.
func (t Topology) Validate() error {
	if t.Total < 1 {
		return fmt.Errorf("total_shards must be at least 1, got %d", t.Total)
	}
	if t.PerCluster < 1 {
		return fmt.Errorf("shards_per_cluster must be at least 1, got %d", t.PerCluster)
	}
	return nil
}

// Clusters returns ceil(Total/PerCluster).
func (t Topology) Clusters() int { return (t.Total + t.PerCluster - 1) / t.PerCluster }

// Range returns the first and last shard (inclusive) of cluster c.
func (t Topology) Range(c int) (first, last int) {
	first = c * t.PerCluster
	last = min(first+t.PerCluster, t.Total) - 1
	return first, last
}

// ClusterOfShard returns the cluster that holds shard s.
func (t Topology) ClusterOfShard(s int) int { return s / t.PerCluster }

// ShardOfGuild returns Discord's shard for a guild: (guild >> 22) % total.
func (t Topology) ShardOfGuild(guild uint64) int { return int((guild >> 22) % uint64(t.Total)) }

// String renders t as "16 shards / 4 per cluster".
func (t Topology) String() string {
	return fmt.Sprintf("%d shards / %d per cluster", t.Total, t.PerCluster)
}

// ErrUnknownTarget is wrapped by Resolve for targets outside the topology.
var ErrUnknownTarget = errors.New("unknown target")

// All is what Resolve returns for the broadcast target "*".
const All = -1

// Resolve maps a business op's target to a cluster id, or All for "*". Targets
// are a cluster id ("3"), "guild:<snowflake>", "shard:<n>" or "*".
func (t Topology) Resolve(target string) (int, error) {
	switch {
	case target == "*":
		return All, nil
	case target == "":
		return 0, fmt.Errorf("%w: op has no target", ErrUnknownTarget)
	case strings.HasPrefix(target, "guild:"):
		g, err := strconv.ParseUint(target[len("guild:"):], 10, 64)
		if err != nil || !isDigits(target[len("guild:"):]) {
			return 0, fmt.Errorf("%w: %q is not a guild snowflake", ErrUnknownTarget, target)
		}
		return t.ClusterOfShard(t.ShardOfGuild(g)), nil
	case strings.HasPrefix(target, "shard:"):
		s, err := strconv.Atoi(target[len("shard:"):])
		if err != nil || !isDigits(target[len("shard:"):]) || s >= t.Total {
			return 0, fmt.Errorf("%w: %q is not a shard of %d", ErrUnknownTarget, target, t.Total)
		}
		return t.ClusterOfShard(s), nil
	default:
		c, err := strconv.Atoi(target)
		if err != nil || !isDigits(target) || c >= t.Clusters() {
			return 0, fmt.Errorf("%w: %q is not a cluster of %d", ErrUnknownTarget, target, t.Clusters())
		}
		return c, nil
	}
}

// isDigits reports whether s is a plain decimal number without leading zeros.
// Atoi alone would also take "+3", "-0" and "03", and a target has one spelling
// so that every implementation of the protocol agrees on what it names.
func isDigits(s string) bool {
	if len(s) > 1 && s[0] == '0' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}
