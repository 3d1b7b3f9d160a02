package mesh

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// ErrConfigMismatch is matched (errors.Is) by CheckSameConfig's error when
// a live host of the mesh runs another [topology] or [cluster]: the hosts
// would place, and run, different clusters under the same lease keys.
var ErrConfigMismatch = errors.New("this host's configuration differs from the mesh's")

// ClusterDigest is the [cluster] table as a host record carries it: each
// key's value hashed (SHA-256, 16 hex digits), so that two hosts can tell
// which key differs without the record holding a command line, a path or an
// environment value. Keys absent from the table are absent here.
func ClusterDigest(command []string, env map[string]string, dir string) map[string]string {
	d := map[string]string{"command": digest(command)}
	if len(env) > 0 {
		d["env"] = digest(env) // encoding/json sorts map keys: one digest per content
	}
	if dir != "" {
		d["dir"] = digest(dir)
	}
	return d
}

func digest(v any) string {
	b, _ := json.Marshal(v) // strings, slices and maps of strings always encode
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:8])
}

// CheckSameConfig compares this host's record with the live records of the
// others (a previous boot of this host id is skipped: it is this host's own,
// being replaced). The error names the first host that differs and what
// differs: the topology's values, or the [cluster] keys (never their values).
// Hosts whose records carry no digest (an older version) are compared on the
// topology alone.
func CheckSameConfig(me HostRecord, others []HostRecord) error {
	for _, o := range others {
		if o.Host == me.Host {
			continue
		}
		var diff []string
		if o.Topology.TotalShards != me.Topology.TotalShards {
			diff = append(diff, fmt.Sprintf("topology.total_shards %d here, %d there", me.Topology.TotalShards, o.Topology.TotalShards))
		}
		if o.Topology.ShardsPerCluster != me.Topology.ShardsPerCluster {
			diff = append(diff, fmt.Sprintf("topology.shards_per_cluster %d here, %d there", me.Topology.ShardsPerCluster, o.Topology.ShardsPerCluster))
		}
		if o.Cluster != nil {
			keys := slices.Sorted(maps.Keys(me.Cluster))
			for k := range o.Cluster {
				if _, ok := me.Cluster[k]; !ok {
					keys = append(keys, k)
				}
			}
			for _, k := range keys {
				if me.Cluster[k] != o.Cluster[k] {
					diff = append(diff, "cluster."+k+" differs")
				}
			}
		}
		if len(diff) > 0 {
			return fmt.Errorf("mesh: %w: host %s runs another configuration: %s; every host of a mesh must have the same [topology] and [cluster]",
				ErrConfigMismatch, o.Host, strings.Join(diff, ", "))
		}
	}
	return nil
}
