package mesh

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Reading a whole bucket. One pass of a bucket watch (WatchAll, up to its
// "initial values done" marker) costs one request however many keys there
// are, but it can miss a key written during the pass: the watcher counts
// the messages the consumer had pending when it was made, and a key written
// twice during the pass stands in for one whose message was replaced before
// it was delivered (with one revision per key the old message is gone, the
// new one comes after the marker). A key whose entry is missing from a pass
// is therefore read again directly (readKey) by whoever knows it should be
// there: the clusters' leases by their ids, the host records by the hosts
// last seen. (TestLeasesUnderRenewal.)

// entry is one key's latest entry, from a watch or a direct read.
type entry struct {
	key     string
	op      jetstream.KeyValueOp
	rev     uint64
	value   []byte
	created time.Time // the server's store time
}

// entryOf is a watch's entry as an entry.
func entryOf(e jetstream.KeyValueEntry) entry {
	return entry{key: e.Key(), op: e.Operation(), rev: e.Revision(), value: e.Value(), created: e.Created()}
}

// gone reports a delete or purge marker: released, removed or expired.
func (e entry) gone() bool {
	return e.op == jetstream.KeyValueDelete || e.op == jetstream.KeyValuePurge
}

// readAll hands each entry of bucket kv (its latest revision, delete and
// purge markers included) to fn, read in one pass of one watch rather than a
// request per key; the pass may miss keys written during it (above). what
// names the bucket in errors.
func (s *Store) readAll(ctx context.Context, kv jetstream.KeyValue, what string, fn func(entry)) error {
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
			fn(entryOf(e))
		case <-ctx.Done():
			return fmt.Errorf("mesh: reading %s: %w", what, ctx.Err())
		}
	}
}

// readKeyTries is how many times readKey asks before it gives up.
const readKeyTries = 3

// readKey reads key's latest entry in bucket (whose stream is st), markers
// included, which kv.Get hides; found is false if the bucket has no entry
// for it at all. A failed request is asked again, up to readKeyTries times
// within ctx, each bounded by the timing's Op.
func (s *Store) readKey(ctx context.Context, st jetstream.Stream, bucket, key string) (e entry, found bool, err error) {
	for try := 1; ; try++ {
		var m *jetstream.RawStreamMsg
		rctx, cancel := s.op(ctx)
		m, err = st.GetLastMsgForSubject(rctx, "$KV."+bucket+"."+key)
		cancel()
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return entry{}, false, nil
		}
		if err == nil {
			return entry{key: key, op: markerOp(m), rev: m.Sequence, value: m.Data, created: m.Time}, true, nil
		}
		if try == readKeyTries || ctx.Err() != nil {
			return entry{}, false, err
		}
		select {
		case <-ctx.Done():
			return entry{}, false, err
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// markerOp is the bucket operation a raw message stands for, read from its
// headers as the KV client reads them: a delete or purge (KV-Operation), an
// expiry or removal marker the server wrote (Nats-Marker-Reason), else a put.
func markerOp(m *jetstream.RawStreamMsg) jetstream.KeyValueOp {
	switch m.Header.Get("KV-Operation") {
	case "DEL":
		return jetstream.KeyValueDelete
	case "PURGE":
		return jetstream.KeyValuePurge
	}
	switch m.Header.Get(jetstream.MarkerReasonHeader) {
	case "MaxAge", "Purge":
		return jetstream.KeyValuePurge
	case "Remove":
		return jetstream.KeyValueDelete
	}
	return jetstream.KeyValuePut
}
