package mesh

import "context"

// LeaseDirect reads cluster c's lease with a direct read of its key, as
// Leases does for a key its bucket pass did not show.
func LeaseDirect(ctx context.Context, s *Store, c int) (Lease, bool, error) {
	e, found, err := s.readKey(ctx, s.leasesStream, s.leases.Bucket(), leaseKey(c))
	if err != nil || !found {
		return Lease{}, found, err
	}
	_, l, ok := leaseEntry(e)
	return l, ok, nil
}

// LeasesPass is Leases without the direct reads: the bucket pass alone.
func LeasesPass(ctx context.Context, s *Store) (map[int]Lease, error) {
	out := map[int]Lease{}
	err := s.readAll(ctx, s.leases, "leases", func(e entry) {
		if c, l, ok := leaseEntry(e); ok {
			out[c] = l
		}
	})
	return out, err
}
