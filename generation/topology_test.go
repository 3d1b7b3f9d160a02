package generation_test

import (
	"errors"
	"fmt"
	"strconv"
	"testing"

	"go.uber.org/goleak"

	"github.com/sm-supervisor/sm/generation"
)

// TestMain is the generation package's: every test in it runs under goleak.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestTopologyValidate(t *testing.T) {
	tests := []struct {
		topo generation.Topology
		ok   bool
	}{
		{generation.Topology{Total: 1, PerCluster: 1}, true},
		{generation.Topology{Total: 16, PerCluster: 4}, true},
		{generation.Topology{Total: 3, PerCluster: 10}, true},
		{generation.Topology{Total: 0, PerCluster: 1}, false},
		{generation.Topology{Total: -1, PerCluster: 1}, false},
		{generation.Topology{Total: 16, PerCluster: 0}, false},
		{generation.Topology{Total: 16, PerCluster: -4}, false},
	}
	for _, tt := range tests {
		if err := tt.topo.Validate(); (err == nil) != tt.ok {
			t.Errorf("%+v.Validate() = %v, want ok=%v", tt.topo, err, tt.ok)
		}
	}
}

// TestClustersAndRanges checks the cluster count and every cluster's range
// against the design: cluster i owns [i*k, min((i+1)*k, total)-1].
func TestClustersAndRanges(t *testing.T) {
	type rng struct{ first, last int }
	tests := []struct {
		total, per int
		want       []rng
	}{
		{16, 4, []rng{{0, 3}, {4, 7}, {8, 11}, {12, 15}}},
		{10, 4, []rng{{0, 3}, {4, 7}, {8, 9}}},                // last cluster smaller
		{9, 4, []rng{{0, 3}, {4, 7}, {8, 8}}},                 // last cluster of one shard
		{3, 10, []rng{{0, 2}}},                                // total < per cluster
		{1, 1, []rng{{0, 0}}},                                 // the smallest bot
		{5, 1, []rng{{0, 0}, {1, 1}, {2, 2}, {3, 3}, {4, 4}}}, // one shard each
		{4, 4, []rng{{0, 3}}},                                 // exactly one full cluster
	}
	for _, tt := range tests {
		topo := generation.Topology{Total: tt.total, PerCluster: tt.per}
		t.Run(topo.String(), func(t *testing.T) {
			if got := topo.Clusters(); got != len(tt.want) {
				t.Fatalf("Clusters() = %d, want %d", got, len(tt.want))
			}
			for c, w := range tt.want {
				first, last := topo.Range(c)
				if first != w.first || last != w.last {
					t.Errorf("Range(%d) = [%d, %d], want [%d, %d]", c, first, last, w.first, w.last)
				}
				for s := first; s <= last; s++ {
					if got := topo.ClusterOfShard(s); got != c {
						t.Errorf("ClusterOfShard(%d) = %d, want %d", s, got, c)
					}
				}
			}
		})
	}
}

// TestRangesPartitionShards checks, for many topologies, that the ranges cover
// every shard exactly once, in order, and that no cluster is empty.
func TestRangesPartitionShards(t *testing.T) {
	for total := 1; total <= 64; total++ {
		for per := 1; per <= total+2; per++ {
			topo := generation.Topology{Total: total, PerCluster: per}
			next := 0
			for c := range topo.Clusters() {
				first, last := topo.Range(c)
				if first != next || last < first || last-first+1 > per {
					t.Fatalf("%v: Range(%d) = [%d, %d], next shard %d", topo, c, first, last, next)
				}
				next = last + 1
			}
			if next != total {
				t.Fatalf("%v: ranges end at shard %d", topo, next-1)
			}
		}
	}
}

func TestShardOfGuild(t *testing.T) {
	tests := []struct {
		guild uint64
		total int
		want  int
	}{
		// Discord's own example: any guild is on shard 0 of 1.
		{81384788765712384, 1, 0},
		// 81384788765712384 >> 22 = 19403645698.
		{81384788765712384, 2, 0},      // 19403645698 is even
		{81384788765712384, 16, 2},     // 19403645698 = 0x4848c2302: low nibble 2
		{81384788765712384, 1000, 698}, // last three digits
		{81384788765712384, 19403645699, 19403645698},
		// The shard comes from the timestamp bits only: the low 22 bits do not count.
		{1<<22 - 1, 16, 0},
		{1 << 22, 16, 1},
		{1<<22 | (1<<22 - 1), 16, 1},
		{17 << 22, 16, 1},
		{18446744073709551615, 16, 15}, // the largest snowflake: 2^42-1 mod 16
		{0, 7, 0},
	}
	for _, tt := range tests {
		topo := generation.Topology{Total: tt.total, PerCluster: 1}
		if got := topo.ShardOfGuild(tt.guild); got != tt.want {
			t.Errorf("ShardOfGuild(%d) with %d shards = %d, want %d", tt.guild, tt.total, got, tt.want)
		}
	}
}

func TestResolve(t *testing.T) {
	topo := generation.Topology{Total: 10, PerCluster: 4} // clusters 0:[0,3] 1:[4,7] 2:[8,9]
	tests := []struct {
		target string
		want   int
	}{
		{"*", generation.All},
		{"0", 0},
		{"2", 2},
		{"shard:0", 0},
		{"shard:3", 0},
		{"shard:4", 1},
		{"shard:9", 2},
		// 81384788765712384 >> 22 = 19403645698; % 10 = 8; shard 8 is cluster 2.
		{"guild:81384788765712384", 2},
		{"guild:0", 0},
		{"guild:" + strconv.FormatUint(5<<22, 10), 1}, // shard 5
		{"guild:18446744073709551615", 0},             // 4398046511103 % 10 = 3
	}
	for _, tt := range tests {
		got, err := topo.Resolve(tt.target)
		if err != nil || got != tt.want {
			t.Errorf("Resolve(%q) = %d, %v; want %d", tt.target, got, err, tt.want)
		}
	}
}

func TestResolveErrors(t *testing.T) {
	topo := generation.Topology{Total: 10, PerCluster: 4}
	for _, target := range []string{
		"",                                                     // no target
		"3", "99", "-1", "+1", "1.0", " 1", "1 ", "one", "0x1", // cluster ids
		"99999999999999999999999",          // beyond int
		"02", "00", "shard:03", "guild:01", // one spelling: no leading zeros
		"-0", "shard:10", "shard:-1", "shard:+1", "shard:-0", "shard:", "shard:x", "shard: 1", "shard:99999999999999999999",
		"guild:", "guild:x", "guild:-1", "guild:+1", "guild:1.5", "guild:18446744073709551616", "guild: 1",
		"Guild:1", "SHARD:1", "cluster:1", "**", "all",
	} {
		got, err := topo.Resolve(target)
		if err == nil {
			t.Errorf("Resolve(%q) = %d, want an error", target, got)
			continue
		}
		if !errors.Is(err, generation.ErrUnknownTarget) {
			t.Errorf("Resolve(%q) error %v does not wrap ErrUnknownTarget", target, err)
		}
	}
}

// TestResolveAgreesWithRanges checks that every shard and guild target lands on
// the cluster whose range holds that shard.
func TestResolveAgreesWithRanges(t *testing.T) {
	for _, topo := range []generation.Topology{{Total: 16, PerCluster: 4}, {Total: 10, PerCluster: 3}, {Total: 7, PerCluster: 7}} {
		for s := range topo.Total {
			c, err := topo.Resolve(fmt.Sprintf("shard:%d", s))
			if err != nil {
				t.Fatal(err)
			}
			if first, last := topo.Range(c); s < first || s > last {
				t.Errorf("%v: shard %d resolved to cluster %d [%d, %d]", topo, s, c, first, last)
			}
			guild := uint64(s)<<22 | 12345 // a guild on shard s
			if g, err := topo.Resolve(fmt.Sprintf("guild:%d", guild)); err != nil || g != c {
				t.Errorf("%v: guild on shard %d resolved to %d, %v; want %d", topo, s, g, err, c)
			}
		}
	}
}

func TestTopologyString(t *testing.T) {
	if got := (generation.Topology{Total: 16, PerCluster: 4}).String(); got != "16 shards / 4 per cluster" {
		t.Errorf("String() = %q", got)
	}
}
