package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// FleetStats is GET /v1/stats: the numeric fields the clusters report in
// their heartbeats, summed over the fleet and cluster by cluster, beside the
// manager's fleet counters.
type FleetStats struct {
	At time.Time `json:"at"`
	// Clusters is how many the topology has; Reporting how many of them have
	// a process whose last heartbeat had a payload.
	Clusters  int `json:"clusters"`
	Reporting int `json:"clusters_reporting"`
	// Totals has, for each numeric top-level field of any payload, its sum
	// over the reporting clusters, their min, max and mean, and how many
	// reported it.
	Totals map[string]FieldTotal `json:"totals"`
	// PerCluster is every cluster, in order, with its values.
	PerCluster []ClusterValues `json:"per_cluster"`
	// FieldsDropped counts fields past api.stats_max_fields, left out of
	// Totals and PerCluster: the well-known fields (docs/protocol.md) are
	// kept first, then the others by name.
	FieldsDropped int `json:"fields_dropped,omitempty"`
	// Counters are the manager's fleet counters since it started (STATUS's).
	Counters json.RawMessage `json:"counters,omitempty"`
	// Source: "status" (the STATUS reply's payloads), or "status+watch"
	// when STATUS left them out to fit a frame and sm-api's copy of the
	// feed supplied them.
	Source string `json:"source"`
}

// FieldTotal aggregates one heartbeat field over the reporting clusters.
type FieldTotal struct {
	Sum      float64 `json:"sum"`
	Min      float64 `json:"min"`
	Max      float64 `json:"max"`
	Mean     float64 `json:"mean"`
	Clusters int     `json:"clusters"`
}

// ClusterValues is one cluster's line in FleetStats.
type ClusterValues struct {
	Cluster     int    `json:"cluster"`
	Generation  int64  `json:"generation"`
	State       string `json:"state"`
	PID         int    `json:"pid,omitempty"`
	HeartbeatMS int64  `json:"heartbeat_age_ms"`
	// Values are the numeric top-level fields of the last heartbeat's
	// payload; absent with no process or no payload.
	Values map[string]float64 `json:"values,omitempty"`
}

// numericFields returns the top-level fields of payload that are JSON
// numbers. Anything else (a payload that is no object, strings, nested
// objects, arrays, booleans) is not a number to add up and is skipped.
func numericFields(payload json.RawMessage) map[string]float64 {
	if p := bytes.TrimSpace(payload); len(p) == 0 || p[0] != '{' {
		return nil
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(payload, &obj) != nil {
		return nil
	}
	var out map[string]float64
	for k, v := range obj {
		if len(v) == 0 || v[0] != '-' && (v[0] < '0' || v[0] > '9') {
			continue
		}
		f, err := strconv.ParseFloat(string(v), 64)
		if err != nil || math.IsInf(f, 0) {
			continue
		}
		if out == nil {
			out = map[string]float64{}
		}
		out[k] = f
	}
	return out
}

// wellKnownFields are the heartbeat fields docs/protocol.md names, in its
// order: kept first when api.stats_max_fields cuts.
var wellKnownFields = []string{"guilds", "users", "memory_bytes", "heap_bytes", "ping_ms", "loop_lag_ms"}

// fieldRank orders field names for the cut: the well-known ones first.
func fieldRank(name string) int {
	if i := slices.Index(wellKnownFields, name); i >= 0 {
		return i
	}
	return len(wellKnownFields)
}

// aggregate builds FleetStats from the clusters' states and their last
// heartbeat payloads (payloads[i] for cluster i; nil for none), keeping at
// most maxFields distinct fields.
func aggregate(clusters []clusterState, payloads []json.RawMessage, maxFields int) FleetStats {
	st := FleetStats{Clusters: len(clusters), Totals: map[string]FieldTotal{}, PerCluster: make([]ClusterValues, len(clusters))}
	values := make([]map[string]float64, len(clusters))
	seen := map[string]bool{}
	for i, cs := range clusters {
		st.PerCluster[i] = ClusterValues{Cluster: cs.ID, Generation: cs.Generation, State: cs.State, PID: cs.PID, HeartbeatMS: cs.HeartbeatMS}
		if i < len(payloads) && alive(cs) {
			values[i] = numericFields(payloads[i])
		}
		for k := range values[i] {
			seen[k] = true
		}
	}
	names := make([]string, 0, len(seen))
	for k := range seen {
		names = append(names, k)
	}
	slices.SortFunc(names, func(a, b string) int {
		ra, rb := fieldRank(a), fieldRank(b)
		if ra != rb {
			return ra - rb
		}
		return strings.Compare(a, b)
	})
	if len(names) > maxFields {
		st.FieldsDropped = len(names) - maxFields
		for _, k := range names[maxFields:] {
			delete(seen, k)
		}
	}
	for i, vs := range values {
		if len(vs) == 0 {
			continue
		}
		st.Reporting++
		for k, v := range vs {
			if !seen[k] {
				delete(vs, k)
				continue
			}
			t, ok := st.Totals[k]
			if !ok {
				t.Min, t.Max = v, v
			}
			t.Sum += v
			t.Min, t.Max = min(t.Min, v), max(t.Max, v)
			t.Clusters++
			st.Totals[k] = t
		}
		st.PerCluster[i].Values = vs
	}
	for k, t := range st.Totals {
		t.Mean = t.Sum / float64(t.Clusters)
		st.Totals[k] = t
	}
	return st
}

// stats is GET /v1/stats. It reads one STATUS: the clusters, their last
// heartbeat payloads and the fleet counters, all of one instant. When STATUS
// left the payloads out (a fleet too big for one frame), sm-api's copy of
// the feed supplies them, if it is in sync.
func (s *Server) stats(w http.ResponseWriter, r *http.Request) error {
	raw, err := s.fetchStatus(r.Context())
	if err != nil {
		return err
	}
	var doc struct {
		statusDoc
		HeartbeatsOmitted bool            `json:"heartbeats_omitted"`
		Counters          json.RawMessage `json:"counters"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		return fmt.Errorf("read STATUS reply: %w", err)
	}
	payloads := make([]json.RawMessage, len(doc.Clusters))
	for i, c := range doc.Clusters {
		payloads[i] = c.Heartbeat
	}
	source := "status"
	if doc.HeartbeatsOmitted {
		source = "status+watch"
		s.state.payloads(doc.Clusters, payloads)
	}
	st := aggregate(doc.Clusters, payloads, s.cfg.StatsMaxFields)
	st.At, st.Counters, st.Source = doc.At, doc.Counters, source
	writeJSON(w, http.StatusOK, st)
	return nil
}
