package mesh

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrConflict is matched (errors.Is) by Take's and Renew's error when the
// lease was not as the caller believed: another holder wrote it first, or it
// ended. Only a compare-and-set on the entry's revision decides who holds a
// lease, never a host's view.
var ErrConflict = errors.New("the lease changed since it was read")

func leaseKey(c int) string { return "c." + strconv.Itoa(c) }

// Take acquires cluster c's lease for h: with rev 0 a create, which succeeds
// only if nobody holds it (never leased, released or expired), else an update
// at rev of an entry that still names h (see Take in Decide). The returned
// Held counts from the moment the request was sent, on the monotonic clock.
func (s *Store) Take(ctx context.Context, c int, h Holder, rev uint64) (Held, error) {
	return s.writeLease(ctx, c, h, rev, "taking")
}

// Renew writes cluster c's lease again, at rev, the revision of the holder's
// last write.
func (s *Store) Renew(ctx context.Context, c int, h Holder, rev uint64) (Held, error) {
	return s.writeLease(ctx, c, h, rev, "renewing")
}

// writeLease writes c's lease for h: a create with rev 0, else an update at
// rev. what names the operation in its error.
func (s *Store) writeLease(ctx context.Context, c int, h Holder, rev uint64, what string) (Held, error) {
	ctx, cancel := s.op(ctx)
	defer cancel()
	sent := time.Now()
	v := encode(LeaseRecord{Holder: h, Cluster: c})
	var n uint64
	var err error
	if rev == 0 {
		n, err = s.leases.Create(ctx, leaseKey(c), v)
	} else {
		n, err = s.leases.Update(ctx, leaseKey(c), v, rev)
	}
	if err != nil {
		return Held{}, leaseErr(what, c, err)
	}
	return Held{Rev: n, Sent: sent}, nil
}

// Release ends cluster c's lease at rev, for a holder that has stopped the
// cluster's process and hands it over without making others wait out the
// lease. A lease changed since rev is left alone (ErrConflict).
func (s *Store) Release(ctx context.Context, c int, rev uint64) error {
	ctx, cancel := s.op(ctx)
	defer cancel()
	if err := s.leases.Delete(ctx, leaseKey(c), jetstream.LastRevision(rev)); err != nil {
		return leaseErr("releasing", c, err)
	}
	return nil
}

func leaseErr(what string, c int, err error) error {
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) || wrongLast(err) {
		return fmt.Errorf("mesh: %s lease of cluster %d: %w", what, c, ErrConflict)
	}
	return fmt.Errorf("mesh: %s lease of cluster %d: %w", what, c, err)
}

// wrongLast recognises the server's "wrong last sequence" answer, which a
// delete at a revision gets and the client does not map to a sentinel.
func wrongLast(err error) bool {
	var api *jetstream.APIError
	return errors.As(err, &api) && (api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// Leases reads every cluster's lease, ended ones included (Gone), as one
// consistent pass over the bucket. Entries that do not decode are skipped.
func (s *Store) Leases(ctx context.Context) (map[int]Lease, error) {
	out := map[int]Lease{}
	err := s.readAll(ctx, s.leases, "leases", func(e jetstream.KeyValueEntry) {
		if c, l, ok := leaseEntry(e); ok {
			out[c] = l
		}
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// readAll hands each entry of bucket kv (its latest revision, delete and
// purge markers included) to fn, read in one pass of one watch rather than a
// request per key. what names the bucket in errors.
func (s *Store) readAll(ctx context.Context, kv jetstream.KeyValue, what string, fn func(jetstream.KeyValueEntry)) error {
	ctx, cancel := s.op(ctx)
	defer cancel()
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("mesh: reading %s: %w", what, err)
	}
	defer w.Stop()
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return fmt.Errorf("mesh: reading %s: watcher closed", what)
			}
			if e == nil {
				return nil // the initial values are all in
			}
			fn(e)
		case <-ctx.Done():
			return fmt.Errorf("mesh: reading %s: %w", what, ctx.Err())
		}
	}
}

func leaseEntry(e jetstream.KeyValueEntry) (int, Lease, bool) {
	id, ok := strings.CutPrefix(e.Key(), "c.")
	if !ok {
		return 0, Lease{}, false
	}
	c, err := strconv.Atoi(id)
	if err != nil || c < 0 {
		return 0, Lease{}, false
	}
	if op := e.Operation(); op == jetstream.KeyValueDelete || op == jetstream.KeyValuePurge {
		return c, Lease{Rev: e.Revision(), Gone: true}, true
	}
	r, err := decodeLease(e.Value())
	if err != nil {
		return 0, Lease{}, false
	}
	return c, Lease{Holder: r.Holder, Rev: e.Revision()}, true
}
