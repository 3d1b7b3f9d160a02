package manager

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Counters are the fleet's totals since the manager started, read from the
// same instruments as the Prometheus metrics (docs/metrics.md), so STATUS and
// a scrape never disagree. A restarted manager starts them from zero again.
type Counters struct {
	// Since is when this manager started counting.
	Since time.Time `json:"since"`
	// RequestsForwarded: business ops (and broadcast parts) written to a
	// cluster (sm_requests_forwarded_total).
	RequestsForwarded uint64 `json:"requests_forwarded"`
	// RequestsFailed: those that ended in an error, by code and in all
	// (sm_requests_failed_total).
	RequestsFailed       uint64            `json:"requests_failed"`
	RequestsFailedByCode map[string]uint64 `json:"requests_failed_by_code"`
	// Restarts: respawns the restart policy carried out, all clusters
	// (sm_cluster_restarts_total).
	Restarts uint64 `json:"restarts"`
	// Deploys: finished deploys by final state, and in all (sm_deploys_total).
	Deploys        uint64            `json:"deploys"`
	DeploysByState map[string]uint64 `json:"deploys_by_state"`
	// IdentifiesGranted and IdentifiesRefused: IDENTIFY slots the gate
	// granted (each a session start) and the budget governor refused.
	IdentifiesGranted uint64 `json:"identifies_granted"`
	IdentifiesRefused uint64 `json:"identifies_refused"`
}

// counters reads the fleet counters from the instruments.
func (m *Manager) counters() *Counters {
	mt := m.metrics
	c := &Counters{
		Since:             m.started,
		RequestsForwarded: counterValue(mt.forwarded),
		Restarts:          counterValue(mt.restarts),
		IdentifiesGranted: counterValue(mt.identifyGranted),
		IdentifiesRefused: counterValue(mt.identifyRefused),
	}
	c.RequestsFailedByCode, c.RequestsFailed = vecValues(mt.failed, "code")
	c.DeploysByState, c.Deploys = vecValues(mt.deploys, "state")
	return c
}

// counterValue is a counter's value (they only count whole events).
func counterValue(c prometheus.Counter) uint64 {
	var d dto.Metric
	if c.Write(&d) != nil {
		return 0
	}
	return uint64(d.GetCounter().GetValue())
}

// vecValues is a one-label counter vector's values by that label, and their sum.
func vecValues(v *prometheus.CounterVec, label string) (map[string]uint64, uint64) {
	ch := make(chan prometheus.Metric, 16)
	go func() {
		v.Collect(ch)
		close(ch)
	}()
	out, total := map[string]uint64{}, uint64(0)
	for met := range ch {
		var d dto.Metric
		if met.Write(&d) != nil {
			continue
		}
		for _, l := range d.GetLabel() {
			if l.GetName() == label {
				n := uint64(d.GetCounter().GetValue())
				out[l.GetValue()] += n
				total += n
			}
		}
	}
	return out, total
}
