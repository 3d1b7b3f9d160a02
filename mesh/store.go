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
	// replicas is how many JetStream servers keep each bucket it makes.
	replicas int
	// The buckets' streams, for reading one key's latest entry, marker
	// included (read.go).
	hostsStream, leasesStream jetstream.Stream
	// Timing is the mesh's lease arithmetic.
	Timing Timing
}

// An OpenOption shapes the buckets Open makes.
type OpenOption func(*Store)

// Replicas has every bucket the mesh makes kept by n servers of a JetStream
// cluster (mesh.replicas): with 3, losing one NATS server loses nothing and
// stops nothing (docs/multihost.md). 1, the default, suits a single server.
// A bucket that exists already keeps the replicas it was made with.
func Replicas(n int) OpenOption { return func(s *Store) { s.replicas = max(n, 1) } }

// ErrLeaseMismatch is matched (errors.Is) by Open's error when the mesh's
// buckets were made with another lease than this host's: hosts that disagree
// on the lease would fence by different clocks.
var ErrLeaseMismatch = errors.New("the mesh's buckets were made with another lease")

// Open opens the buckets of mesh name on nc, making them if they do not exist
// yet (the first host to start does), and checks that they expire entries
// after lease, as this host counts.
func Open(ctx context.Context, nc *nats.Conn, name string, lease time.Duration, opts ...OpenOption) (*Store, error) {
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
	s := &Store{js: js, Timing: TimingFor(lease), replicas: 1}
	for _, o := range opts {
		o(s)
	}
	if s.hosts, err = bucket(ctx, js, name+"_hosts", lease, s.replicas, "sm: a record per live host"); err != nil {
		return nil, err
	}
	if s.leases, err = bucket(ctx, js, name+"_leases", lease, s.replicas, "sm: a lease per cluster"); err != nil {
		return nil, err
	}
	if s.hostsStream, err = js.Stream(ctx, "KV_"+name+"_hosts"); err != nil {
		return nil, fmt.Errorf("mesh: bucket %s_hosts: %w", name, err)
	}
	if s.leasesStream, err = js.Stream(ctx, "KV_"+name+"_leases"); err != nil {
		return nil, fmt.Errorf("mesh: bucket %s_leases: %w", name, err)
	}
	return s, nil
}

func bucket(ctx context.Context, js jetstream.JetStream, name string, ttl time.Duration, replicas int, what string) (jetstream.KeyValue, error) {
	kv, err := keyValue(ctx, js, jetstream.KeyValueConfig{
		Bucket: name, Description: what, History: 1, TTL: ttl, LimitMarkerTTL: ttl,
		Storage: jetstream.FileStorage, Replicas: replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("mesh: bucket %s: %w", name, err)
	}
	st, err := settled(ctx, kv)
	if err != nil {
		return nil, fmt.Errorf("mesh: bucket %s: %w", name, err)
	}
	if st.TTL() != ttl {
		return nil, fmt.Errorf("mesh: bucket %s: %w: %v, and mesh.lease here is %v; every host of a mesh must use the same lease",
			name, ErrLeaseMismatch, st.TTL(), ttl)
	}
	return kv, nil
}

// attemptTimeout bounds one lookup or creation of a bucket, within Open's
// context: a JetStream cluster leaves a request about a stream that another
// host is making at this moment unanswered until its leader is elected, so
// the request is asked again rather than waited on to the end.
const attemptTimeout = 2 * time.Second

// keyValue opens the bucket cfg names, making it if it does not exist yet
// (another host making it at the same moment is fine), asking again while
// the servers do not answer in time.
func keyValue(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	for {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		kv, err := js.KeyValue(actx, cfg.Bucket)
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			kv, err = js.CreateKeyValue(actx, cfg)
			if errors.Is(err, jetstream.ErrBucketExists) {
				kv, err = js.KeyValue(actx, cfg.Bucket) // another host made it first
			}
		}
		cancel()
		if err == nil || !transient(err) || !pause(ctx) {
			return kv, err
		}
	}
}

// pause waits the 50 ms between two attempts at a bucket; false if ctx
// ended first.
func pause(ctx context.Context) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(50 * time.Millisecond):
		return true
	}
}

// transient says whether err is a JetStream cluster settling (a leader being
// elected) rather than an answer.
func transient(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse)
}

// settled waits until kv answers: its status and a read. A bucket just
// made on a JetStream cluster (mesh.replicas > 1) is not served until its
// raft group settles, a moment later: until then the servers answer that
// the stream is not found, or nothing at all.
func settled(ctx context.Context, kv jetstream.KeyValue) (jetstream.KeyValueStatus, error) {
	for {
		actx, cancel := context.WithTimeout(ctx, attemptTimeout)
		st, err := kv.Status(actx)
		if err == nil {
			if _, err = kv.Get(actx, "probe"); absent(err) {
				err = nil
			}
		}
		cancel()
		if err == nil {
			return st, nil
		}
		var api *jetstream.APIError
		notYet := errors.As(err, &api) && api.ErrorCode == jetstream.JSErrCodeStreamNotFound
		if !(transient(err) || notYet) || !pause(ctx) {
			return nil, err
		}
	}
}

// op bounds one request to the server by the timing's Op.
func (s *Store) op(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.Timing.Op)
}
