package mesh

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sm-supervisor/sm/discord"
)

// The shared resume store: NAME_resume, a key per shard ("s.<n>") holding
// the shard's last reported resume state, written behind by the host that
// runs the shard and read by the host that takes its cluster over, so that
// the moved cluster RESUMEs. The server drops an entry resume_max_age after
// its last write. Writes are compare-and-sets at the revision the writer
// last saw, so a host that lost a cluster never overwrites the entries of
// the host that runs it now.

func resumeKey(shard int) string { return "s." + strconv.Itoa(shard) }

// ResumeEntry is one shard's entry in the store.
type ResumeEntry struct {
	State discord.ResumeState
	// Rev is the revision to write the shard's next entry at.
	Rev uint64
}

// Resume reads the entries of shards first..last (inclusive) in one pass,
// by shard. A shard with no entry, or one that does not decode, is left out
// (its next write is then a create, or an update at Rev for one that does
// not decode: see PutResume).
func (d *DiscordStore) Resume(ctx context.Context, first, last int) (map[int]ResumeEntry, error) {
	ctx, cancel := d.opCtx(ctx)
	defer cancel()
	keys := make([]string, 0, last-first+1)
	for s := first; s <= last; s++ {
		keys = append(keys, resumeKey(s))
	}
	w, err := d.resume.WatchFiltered(ctx, keys, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("mesh: reading resume state: %w", err)
	}
	defer w.Stop()
	out := map[int]ResumeEntry{}
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return nil, fmt.Errorf("mesh: reading resume state: watcher closed")
			}
			if e == nil {
				return out, nil // the initial values are all in
			}
			shard, err := strconv.Atoi(strings.TrimPrefix(e.Key(), "s."))
			if err != nil {
				continue
			}
			var st discord.ResumeState
			if json.Unmarshal(e.Value(), &st) != nil || st.Shard != shard {
				continue
			}
			out[shard] = ResumeEntry{State: st, Rev: e.Revision()}
		case <-ctx.Done():
			return nil, fmt.Errorf("mesh: reading resume state: %w", ctx.Err())
		}
	}
}

// PutResume writes st as its shard's entry at rev, the revision of the
// entry this host read or last wrote (0: there was none), and returns the
// new revision. An entry that expired or was removed since is made anew.
// If another host wrote the entry since, nothing is written and the error
// is ErrConflict: that host runs the shard now.
func (d *DiscordStore) PutResume(ctx context.Context, st discord.ResumeState, rev uint64) (uint64, error) {
	ctx, cancel := d.opCtx(ctx)
	defer cancel()
	key := resumeKey(st.Shard)
	v, err := json.Marshal(st)
	if err != nil {
		return 0, fmt.Errorf("mesh: writing resume state of shard %d: %w", st.Shard, err)
	}
	var n uint64
	if rev == 0 {
		n, err = d.resume.Create(ctx, key, v)
	} else {
		n, err = d.resume.Update(ctx, key, v, rev)
	}
	if err == nil {
		return n, nil
	}
	if !conflict(err) {
		return 0, fmt.Errorf("mesh: writing resume state of shard %d: %w", st.Shard, err)
	}
	// Not at rev: expired (make it anew), or written by another host.
	if _, gerr := d.resume.Get(ctx, key); absent(gerr) {
		if n, err = d.resume.Create(ctx, key, v); err == nil {
			return n, nil
		}
	} else if gerr != nil {
		err = gerr
	}
	if conflict(err) || err == nil {
		return 0, fmt.Errorf("mesh: writing resume state of shard %d: %w", st.Shard, ErrConflict)
	}
	return 0, fmt.Errorf("mesh: writing resume state of shard %d: %w", st.Shard, err)
}

// ResumePushed is what a host last wrote of a shard's resume state, and when.
type ResumePushed struct {
	State discord.ResumeState
	At    time.Time
}

// ResumeDue reports whether a host that runs a shard should write its
// current resume state cur behind, having last written last (ok false:
// never). The caller asks at most once a second per shard (and at
// QUIESCED). A changed session, sequence or URL is written; an unchanged
// one that was reported again (the bot is alive but quiet) is written again
// only every maxAge / 4, so that the server, which drops an entry maxAge
// after its last write, keeps it; a report not renewed is not written
// again.
func ResumeDue(last ResumePushed, ok bool, cur discord.ResumeState, now time.Time, maxAge time.Duration) bool {
	switch {
	case !ok:
		return true
	case cur.SessionID != last.State.SessionID || cur.Seq != last.State.Seq ||
		cur.ResumeURL != last.State.ResumeURL || cur.ShardCount != last.State.ShardCount:
		return true
	case !cur.UpdatedAt.After(last.State.UpdatedAt):
		return false
	}
	return now.Sub(last.At) >= maxAge/4
}
