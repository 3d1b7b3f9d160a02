package mesh

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The shared identify gate. A host grants an IDENTIFY of rate-limit bucket b
// only after it created key "b.<b>" in NAME_identify, which the server keeps
// for IdentifyHold after it stored it, by its own clock: so no two creates
// of one key, whichever hosts made them, are stored less than a hold apart.
// A host grants only within GrantWindow of sending its create; the grant
// therefore comes at most a window after the store, and two grants of one
// bucket, on any hosts, are at least IdentifyHold - GrantWindow = the
// spacing apart. The server expires entries late (its expiry timer runs
// every 250 ms at the most often), never early, which only widens the gap.

// GrantWindow is how long after sending its claim of a bucket's slot a host
// may still grant it: a twentieth of the spacing, at least 100 ms (the
// server keeps nothing for less). A claim answered later (a slow server, a
// stalled host) is given up, and its slot left unused.
func GrantWindow(spacing time.Duration) time.Duration {
	return max(spacing/20, 100*time.Millisecond)
}

// IdentifyHold is how long the server keeps a bucket's grant: the spacing
// plus the grant window (5.775 s for the default 5.5 s spacing).
func IdentifyHold(spacing time.Duration) time.Duration { return spacing + GrantWindow(spacing) }

// IdentifyClaim is a bucket's slot won in the shared gate.
type IdentifyClaim struct {
	Bucket int
	// Rev is the grant's revision, for ReleaseIdentify.
	Rev uint64
	// Sent is when the create was sent (monotonic clock): the host may
	// grant until Sent + GrantWindow.
	Sent time.Time
}

// BusyError is ClaimIdentify's error when another host holds the bucket's
// slot: its grant was stored less than a hold ago.
type BusyError struct {
	Bucket int
	// Retry is when to claim again: when the other grant should expire.
	Retry time.Time
}

// Error says which bucket is busy and for how long.
func (e *BusyError) Error() string {
	return fmt.Sprintf("mesh: identify bucket %d granted by another host; retry in %v", e.Bucket, time.Until(e.Retry).Round(time.Millisecond))
}

// identifyGrant is the value of a bucket's grant, for people reading the
// bucket: nothing reads it back.
type identifyGrant struct {
	Holder
	Shard int `json:"shard"`
}

func identifyKey(bucket int) string { return "b." + strconv.Itoa(bucket) }

// ClaimIdentify claims bucket's slot for h's grant to shard: a create of the
// bucket's key, which succeeds only if no grant of the bucket is kept (none
// stored within a hold). If another host's is, the error is a *BusyError
// saying when to try again; any other error means the shared gate could not
// be asked, and the caller must not grant.
func (d *DiscordStore) ClaimIdentify(ctx context.Context, bucket int, h Holder, shard int) (IdentifyClaim, error) {
	ctx, cancel := d.opCtx(ctx)
	defer cancel()
	key := identifyKey(bucket)
	v, _ := json.Marshal(identifyGrant{Holder: h, Shard: shard}) // a plain struct always encodes
	sent := time.Now()
	rev, err := d.identify.Create(ctx, key, v)
	if err == nil {
		return IdentifyClaim{Bucket: bucket, Rev: rev, Sent: sent}, nil
	}
	if !conflict(err) {
		return IdentifyClaim{}, fmt.Errorf("mesh: claiming identify bucket %d: %w", bucket, err)
	}
	// Busy: read when the other grant was stored, to know when it expires.
	e, gerr := d.identify.Get(ctx, key)
	hold := IdentifyHold(d.Settings.Spacing)
	switch {
	case absent(gerr):
		return IdentifyClaim{}, &BusyError{Bucket: bucket, Retry: IdentifyRetry(time.Now(), time.Time{}, false, hold)}
	case gerr != nil:
		return IdentifyClaim{}, fmt.Errorf("mesh: claiming identify bucket %d: %w", bucket, gerr)
	}
	return IdentifyClaim{}, &BusyError{Bucket: bucket, Retry: IdentifyRetry(time.Now(), e.Created(), true, hold)}
}

// IdentifyRetry is when a host that found another host's grant in a bucket
// (stored at created by the server's clock, if found) should claim again:
// when that grant expires, a hold after created. The server's clock and
// this host's agree to NTP's milliseconds, and a retry that comes too early
// costs one round trip, so the estimate need not be exact; but the server
// removes expired entries late (up to a few hundred ms), so retries are at
// least a fiftieth of the hold apart (10 ms at the least), and never more
// than a hold away, however wrong a clock. A grant gone already (expired or
// released between the create and the read) is claimed again at once.
func IdentifyRetry(now, created time.Time, found bool, hold time.Duration) time.Time {
	if !found {
		return now
	}
	poll := max(hold/50, 10*time.Millisecond)
	at := created.Add(hold)
	if earliest := now.Add(poll); at.Before(earliest) {
		return earliest
	}
	if latest := now.Add(hold); at.After(latest) {
		return latest
	}
	return at
}

// ReleaseIdentify gives back a slot won but not used (no IDENTIFY was
// granted for it: nobody waited any more, or the grant window passed), so
// that other hosts need not wait out its hold. A grant changed since the
// claim is left alone.
func (d *DiscordStore) ReleaseIdentify(ctx context.Context, c IdentifyClaim) error {
	ctx, cancel := d.opCtx(ctx)
	defer cancel()
	err := d.identify.Delete(ctx, identifyKey(c.Bucket), jetstream.LastRevision(c.Rev))
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("mesh: releasing identify bucket %d: %w", c.Bucket, err)
	}
	return nil
}
