package mesh

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Store is a mesh's JetStream key-value buckets, each named after the mesh:
// NAME_hosts (a record per live host, by host id) and NAME_leases (a lease
// per cluster, key "c.<id>"). Both keep one revision per key, expire an
// entry a lease after its last write (the server's clock, not a host's), and
// leave a marker when they do, so that watchers hear of the expiry.
type Store struct {
	js     jetstream.JetStream
	hosts  jetstream.KeyValue
	leases jetstream.KeyValue
	// Timing is the mesh's lease arithmetic.
	Timing Timing
}

// ErrLeaseMismatch is matched (errors.Is) by Open's error when the mesh's
// buckets were made with another lease than this host's: hosts that disagree
// on the lease would fence by different clocks.
var ErrLeaseMismatch = errors.New("the mesh's buckets were made with another lease")

// Open opens the buckets of mesh name on nc, making them if they do not exist
// yet (the first host to start does), and checks that they expire entries
// after lease, as this host counts.
func Open(ctx context.Context, nc *nats.Conn, name string, lease time.Duration) (*Store, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("mesh: jetstream: %w", err)
	}
	if _, err := js.AccountInfo(ctx); err != nil {
		if errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) {
			return nil, fmt.Errorf("mesh: the NATS server has no JetStream for this account (start it with -js): %w", err)
		}
		return nil, fmt.Errorf("mesh: jetstream: %w", err)
	}
	s := &Store{js: js, Timing: TimingFor(lease)}
	if s.hosts, err = bucket(ctx, js, name+"_hosts", lease, "sm: a record per live host"); err != nil {
		return nil, err
	}
	if s.leases, err = bucket(ctx, js, name+"_leases", lease, "sm: a lease per cluster"); err != nil {
		return nil, err
	}
	return s, nil
}

func bucket(ctx context.Context, js jetstream.JetStream, name string, ttl time.Duration, what string) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, name)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: name, Description: what, History: 1, TTL: ttl, LimitMarkerTTL: ttl,
			Storage: jetstream.FileStorage,
		})
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, name) // another host made it first
		}
	}
	if err != nil {
		return nil, fmt.Errorf("mesh: bucket %s: %w", name, err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("mesh: bucket %s: %w", name, err)
	}
	if st.TTL() != ttl {
		return nil, fmt.Errorf("mesh: bucket %s: %w: %v, and mesh.lease here is %v; every host of a mesh must use the same lease",
			name, ErrLeaseMismatch, st.TTL(), ttl)
	}
	return kv, nil
}

// op bounds one request to the server by the timing's Op.
func (s *Store) op(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.Timing.Op)
}
