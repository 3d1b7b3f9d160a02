package api

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// HostInfo is one host of the mesh in GET /v1/hosts, as the manager's
// STATUS shows it.
type HostInfo struct {
	ID string `json:"id"`
	// Capacity is its mesh.max_clusters; 0 is no limit.
	Capacity int `json:"capacity"`
	// Clusters are the clusters it holds, in id order.
	Clusters []int `json:"clusters"`
	// LeaseAgeMS is how long ago it last renewed its host record.
	LeaseAgeMS int64 `json:"lease_age_ms"`
	// Self marks the host whose manager sm-api talks to.
	Self bool `json:"self,omitempty"`
}

// HostsInfo is GET /v1/hosts.
type HostsInfo struct {
	// Mesh is false on a single host ([mesh] not set): Hosts is then empty.
	Mesh  bool       `json:"mesh"`
	Hosts []HostInfo `json:"hosts"`
}

// hosts is GET /v1/hosts: the mesh's hosts, their capacity, the clusters
// each holds and how fresh its record is, from a STATUS asked for it.
func (s *Server) hosts(w http.ResponseWriter, r *http.Request) error {
	raw, err := s.fetchStatus(r.Context())
	if err != nil {
		return err
	}
	var st struct {
		Hosts []HostInfo `json:"hosts"`
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		return fmt.Errorf("read STATUS reply: %w", err)
	}
	out := HostsInfo{Mesh: len(st.Hosts) > 0, Hosts: st.Hosts}
	if out.Hosts == nil {
		out.Hosts = []HostInfo{}
	}
	for i := range out.Hosts {
		if out.Hosts[i].Clusters == nil {
			out.Hosts[i].Clusters = []int{}
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
