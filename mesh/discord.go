package mesh

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// DiscordStore is what the hosts of a mesh share of Discord's limits, which
// are per bot, not per host (docs/multihost.md): the identify gate's grants
// (NAME_identify, a key per rate-limit bucket, kept for IdentifyHold), the
// session-start budget (NAME_budget, one key) and the shards' resume state
// (NAME_resume, a key per shard, kept for discord.resume_max_age). Every
// request is bounded by the mesh's Timing.Op.
type DiscordStore struct {
	identify jetstream.KeyValue
	budget   jetstream.KeyValue
	resume   jetstream.KeyValue
	op       time.Duration
	// Settings are what the buckets were opened with.
	Settings DiscordSettings
}

// DiscordSettings are the [discord] keys the buckets are made with; every
// host of a mesh must use the same.
type DiscordSettings struct {
	// Spacing is discord.identify_spacing: the time between two grants of
	// one rate-limit bucket, across every host.
	Spacing time.Duration
	// ResumeMaxAge is discord.resume_max_age: how long a shard's resume
	// state lasts after its last report.
	ResumeMaxAge time.Duration
}

// ErrDiscordMismatch is matched (errors.Is) by OpenDiscord's error when the
// mesh's buckets were made with another identify_spacing or resume_max_age
// than this host's: hosts that space identifies differently would break
// each other's spacing.
var ErrDiscordMismatch = errors.New("the mesh's buckets were made with other [discord] settings")

// OpenDiscord opens the Discord buckets of mesh name beside st's, making
// them if they do not exist yet, and checks that they were made with set.
func OpenDiscord(ctx context.Context, st *Store, name string, set DiscordSettings) (*DiscordStore, error) {
	if set.Spacing <= 0 || set.ResumeMaxAge <= 0 {
		return nil, fmt.Errorf("mesh: identify spacing %v and resume max age %v must be positive", set.Spacing, set.ResumeMaxAge)
	}
	d := &DiscordStore{op: st.Timing.Op, Settings: set}
	var err error
	if d.identify, err = discordBucket(ctx, st, jetstream.KeyValueConfig{
		Bucket: name + "_identify", Description: "sm: the identify grant of each rate-limit bucket",
		TTL: IdentifyHold(set.Spacing),
	}, "discord.identify_spacing", set.Spacing); err != nil {
		return nil, err
	}
	if d.budget, err = discordBucket(ctx, st, jetstream.KeyValueConfig{
		Bucket: name + "_budget", Description: "sm: the bot's session-start budget",
	}, "", 0); err != nil {
		return nil, err
	}
	if d.resume, err = discordBucket(ctx, st, jetstream.KeyValueConfig{
		Bucket: name + "_resume", Description: "sm: each shard's resume state",
		TTL: set.ResumeMaxAge,
	}, "discord.resume_max_age", set.ResumeMaxAge); err != nil {
		return nil, err
	}
	return d, nil
}

// discordBucket opens (or makes) the bucket cfg describes, one revision per
// key on disk, and checks its max age: key names the setting it comes from,
// set its value here (for the error).
func discordBucket(ctx context.Context, st *Store, cfg jetstream.KeyValueConfig, key string, set time.Duration) (jetstream.KeyValue, error) {
	cfg.History, cfg.Storage, cfg.Replicas = 1, jetstream.FileStorage, st.replicas
	kv, err := keyValue(ctx, st.js, cfg)
	if err != nil {
		return nil, fmt.Errorf("mesh: bucket %s: %w", cfg.Bucket, err)
	}
	bs, err := settled(ctx, kv)
	if err != nil {
		return nil, fmt.Errorf("mesh: bucket %s: %w", cfg.Bucket, err)
	}
	if bs.TTL() != cfg.TTL {
		return nil, fmt.Errorf("mesh: bucket %s: %w: it keeps entries %v, and %s = %v here would keep them %v; every host of a mesh must use the same",
			cfg.Bucket, ErrDiscordMismatch, bs.TTL(), key, set, cfg.TTL)
	}
	return kv, nil
}

// opCtx bounds one operation by the mesh's Timing.Op.
func (d *DiscordStore) opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, d.op)
}

// conflict reports whether err is the server refusing a write because the
// key is not at the revision the writer named (or exists, for a create).
func conflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) || wrongLast(err)
}

// absent reports whether a read found no live entry: never written,
// deleted, or expired.
func absent(err error) bool {
	return errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted)
}
