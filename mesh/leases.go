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

// Leases reads every cluster's lease, ended ones included (Gone): one pass
// of a bucket watch, then a direct read of each of clusters 0..clusters-1
// that the pass did not show (read.go: the pass can miss keys written during
// it), so a lease that exists is never missing from the answer. Entries that
// do not decode are skipped.
func (s *Store) Leases(ctx context.Context, clusters int) (map[int]Lease, error) {
	out := map[int]Lease{}
	add := func(e entry) {
		if c, l, ok := leaseEntry(e); ok {
			out[c] = l
		}
	}
	if err := s.readAll(ctx, s.leases, "leases", add); err != nil {
		return nil, err
	}
	for c := range clusters {
		if _, ok := out[c]; ok {
			continue
		}
		e, found, err := s.readKey(ctx, s.leasesStream, s.leases.Bucket(), leaseKey(c))
		if err != nil {
			return nil, fmt.Errorf("mesh: reading lease of cluster %d: %w", c, err)
		}
		if found {
			add(e)
		}
	}
	return out, nil
}

func leaseEntry(e entry) (int, Lease, bool) {
	id, ok := strings.CutPrefix(e.key, "c.")
	if !ok {
		return 0, Lease{}, false
	}
	c, err := strconv.Atoi(id)
	if err != nil || c < 0 {
		return 0, Lease{}, false
	}
	if e.gone() {
		return c, Lease{Rev: e.rev, Gone: true}, true
	}
	r, err := decodeLease(e.value)
	if err != nil {
		return 0, Lease{}, false
	}
	return c, Lease{Holder: r.Holder, Rev: e.rev}, true
}
