package mesh

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrHostIDInUse is matched (errors.Is) by Announce's error when another
// live boot has this host id: two machines configured with one host_id.
var ErrHostIDInUse = errors.New("another running manager has this host id")

// Announce writes this boot's host record. rev is the revision of its last
// announcement, 0 for the first: the first is a create, so a host id that a
// live record of another boot holds is refused (ErrHostIDInUse; a host that
// restarted waits until its old boot's record expires, at most a lease), and
// every later one an update at rev, so two boots never take turns renewing
// one record; an update that finds the record changed is ErrConflict. It
// returns the new revision.
func (s *Store) Announce(ctx context.Context, r HostRecord, rev uint64) (uint64, error) {
	ctx, cancel := s.op(ctx)
	defer cancel()
	if rev == 0 {
		n, err := s.hosts.Create(ctx, r.Host, encode(r))
		if errors.Is(err, jetstream.ErrKeyExists) {
			if cur, gerr := s.hosts.Get(ctx, r.Host); gerr == nil {
				if old, derr := decodeHost(cur.Value()); derr == nil && old.Boot != r.Boot {
					return 0, fmt.Errorf("mesh: host %s: %w (boot %s)", r.Host, ErrHostIDInUse, old.Boot)
				}
			}
		}
		if err != nil {
			return 0, fmt.Errorf("mesh: announcing host %s: %w", r.Host, err)
		}
		return n, nil
	}
	n, err := s.hosts.Update(ctx, r.Host, encode(r), rev)
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || wrongLast(err) {
		// Expired while this host was cut off, or taken by another boot:
		// announce anew (rev 0), which tells the two apart.
		return 0, fmt.Errorf("mesh: renewing host %s: %w", r.Host, ErrConflict)
	}
	if err != nil {
		return 0, fmt.Errorf("mesh: renewing host %s: %w", r.Host, err)
	}
	return n, nil
}

// Leave removes this boot's host record (at rev, so never another boot's).
func (s *Store) Leave(ctx context.Context, host string, rev uint64) error {
	ctx, cancel := s.op(ctx)
	defer cancel()
	if err := s.hosts.Delete(ctx, host, jetstream.LastRevision(rev)); err != nil {
		return fmt.Errorf("mesh: leaving: %w", err)
	}
	return nil
}

// Hosts lists the live host records, in host id order: one pass of a bucket
// watch, then a direct read of each host of known (the hosts last seen) that
// the pass did not show (read.go). A record that does not decode is skipped:
// it is no host this version can place clusters on.
func (s *Store) Hosts(ctx context.Context, known ...string) ([]HostRecord, error) {
	var out []HostRecord
	seen := map[string]bool{}
	add := func(e entry) {
		seen[e.key] = true
		if e.gone() {
			return // left, or expired
		}
		if r, err := decodeHost(e.value); err == nil {
			r.Written = e.created
			out = append(out, r)
		}
	}
	if err := s.readAll(ctx, s.hosts, "hosts", add); err != nil {
		return nil, err
	}
	for _, h := range known {
		if seen[h] {
			continue
		}
		e, found, err := s.readKey(ctx, s.hostsStream, s.hosts.Bucket(), h)
		if err != nil {
			return nil, fmt.Errorf("mesh: reading host %s: %w", h, err)
		}
		if found {
			add(e)
		}
	}
	slices.SortFunc(out, func(a, b HostRecord) int { return cmp.Compare(a.Host, b.Host) })
	return out, nil
}
