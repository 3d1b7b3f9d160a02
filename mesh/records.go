package mesh

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"
)

// Holder names one boot of one host: what a lease records as its owner. The
// boot id is new at every start, so a manager that restarted is a different
// holder from its previous boot, and nothing the old boot held passes to the
// new one by accident.
type Holder struct {
	Host string `json:"host"`
	Boot string `json:"boot"`
}

// String is host/boot, for logs.
func (h Holder) String() string { return h.Host + "/" + h.Boot }

// NewBootID returns a random boot id (128 bits, hex).
func NewBootID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24)
	return hex.EncodeToString(b[:])
}

// HostRecord is what a host publishes about itself in the hosts bucket,
// renewed every Timing.Renew and gone a lease after its last renewal.
type HostRecord struct {
	Holder
	// Capacity is the host's max_clusters; 0 is no limit.
	Capacity int `json:"capacity"`
	// Clusters are the clusters it holds leases for, in id order.
	Clusters []int `json:"clusters"`
	// Topology is the shard split the host runs: hosts of a mesh must agree.
	Topology Topology `json:"topology"`
	// Cluster is the host's [cluster] table as ClusterDigest gives it.
	Cluster map[string]string `json:"cluster,omitempty"`
	// Started is when this boot started (the host's wall clock, for people).
	Started time.Time `json:"started"`
	// Written is when the server stored the record as last read (its
	// clock): not part of the record, filled in by Store.Hosts.
	Written time.Time `json:"-"`
}

// Topology is a host's [topology], as far as the mesh needs it.
type Topology struct {
	TotalShards      int `json:"total_shards"`
	ShardsPerCluster int `json:"shards_per_cluster"`
}

// Clusters is how many clusters the topology makes.
func (t Topology) Clusters() int {
	if t.ShardsPerCluster < 1 {
		return 0
	}
	return (t.TotalShards + t.ShardsPerCluster - 1) / t.ShardsPerCluster
}

// LeaseRecord is the value of a cluster's lease: who holds it.
type LeaseRecord struct {
	Holder
	Cluster int `json:"cluster"`
}

func encode(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("mesh: encoding %T: %v", v, err)) // plain structs always encode
	}
	return b
}

func decodeHost(b []byte) (HostRecord, error) {
	var r HostRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("host record: %w", err)
	}
	if r.Host == "" || r.Boot == "" {
		return r, fmt.Errorf("host record: no host or boot id")
	}
	return r, nil
}

func decodeLease(b []byte) (LeaseRecord, error) {
	var r LeaseRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("lease record: %w", err)
	}
	if r.Host == "" || r.Boot == "" {
		return r, fmt.Errorf("lease record: no host or boot id")
	}
	return r, nil
}
