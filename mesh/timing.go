package mesh

import "time"

// Timing is the lease arithmetic every host of a mesh shares. All of it
// derives from the lease, so hosts that agree on the lease agree on the rest.
//
// The server counts a lease from the moment it stored the holder's last write,
// which is after the holder sent it. A holder that counts from the send time,
// on its own monotonic clock, therefore never believes in a lease the server
// has already expired. Of the lease it keeps Lease − Margin for itself and
// leaves Margin to stop the process: past FenceAt it kills the cluster, so
// the process is gone before the server can hand the cluster to anyone else.
type Timing struct {
	// Lease is how long the server keeps a lease or host record that is not
	// renewed (the buckets' max age).
	Lease time.Duration
	// Renew is how often a holder renews: Lease / 4, so that two renewals
	// in a row may fail (a NATS hiccup, a slow server) before the fence.
	Renew time.Duration
	// Margin is Lease / 4: the time left, after the fence, to kill the
	// process group and have the kernel confirm it (milliseconds), absorb
	// the holder's clock running slow against the server's (a few hundred
	// parts per million: 5 ms over 10 s) and the delay of the fence's own
	// timer on a loaded host.
	Margin time.Duration
	// Op bounds one request to the server (Renew / 2), so that a renewal
	// has ended, one way or the other, before the next is due.
	Op time.Duration
}

// TimingFor derives the timing from the lease.
func TimingFor(lease time.Duration) Timing {
	return Timing{Lease: lease, Renew: lease / 4, Margin: lease / 4, Op: lease / 8}
}

// FenceAt is when the holder of a lease whose last successful write was sent
// at sent must stop the cluster, unless a later write succeeded: Lease −
// Margin after the send, three renewal intervals.
func (t Timing) FenceAt(sent time.Time) time.Time { return sent.Add(t.Lease - t.Margin) }

// RenewDue reports whether a lease last written at sent should be renewed at
// now. A tenth of an interval of slack keeps a ticker that fires a little
// early from skipping a renewal.
func (t Timing) RenewDue(sent, now time.Time) bool { return now.Sub(sent) >= t.Renew-t.Renew/10 }
