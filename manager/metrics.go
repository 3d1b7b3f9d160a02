package manager

import (
	"context"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sm-supervisor/sm/supervise"
)

// metrics are the manager's Prometheus instruments. Counters and the latency
// histogram are updated on the paths they count; per-cluster gauges are
// read from a status snapshot at scrape time (see collector).
type metrics struct {
	forwarded prometheus.Counter
	failed    *prometheus.CounterVec // by error code
	latency   prometheus.Histogram
	restarts  prometheus.Counter
	deploys   *prometheus.CounterVec // by final state
	deployDur prometheus.Histogram

	identifyGranted prometheus.Counter
	identifyRefused prometheus.Counter
	loopEvents      prometheus.Counter
	reshardChecks   *prometheus.CounterVec // by result (reshard.go)
	recycles        *prometheus.CounterVec // by reason
	meshDropped     *prometheus.CounterVec // by reason (meshroute.go)
}

func newMetrics(reg prometheus.Registerer, m *Manager) *metrics {
	mt := &metrics{
		forwarded: counter("sm_requests_forwarded_total", "Business ops forwarded to a cluster process."),
		failed: counterVec("sm_requests_failed_total", "Requests answered with an error by the manager or a cluster, by error code.",
			"code"),
		latency: histogram("sm_request_duration_seconds", "Time from a request's arrival to its reply leaving the manager.",
			prometheus.ExponentialBuckets(50e-6, 2.5, 12)),
		restarts:  counter("sm_cluster_restarts_total", "Cluster processes respawned after an exit."),
		deploys:   counterVec("sm_deploys_total", "Finished deploys by final state.", "state"),
		deployDur: histogram("sm_deploy_duration_seconds", "Wall time of finished deploys.", prometheus.ExponentialBuckets(0.5, 2, 12)),

		identifyGranted: counter("sm_identify_granted_total", "IDENTIFY slots granted by the identify gate (each spends a session start)."),
		identifyRefused: counter("sm_identify_refused_total", "IDENTIFYs refused by the session-start budget governor."),
		loopEvents:      counter("sm_loop_events_total", "Events the manager's event loop handled; a steady cluster's heartbeats are not events."),
		reshardChecks: counterVec("sm_reshard_checks_total", "Checks of Discord's recommended shard count by the [reshard] schedule, by result: unchanged, resharded, deferred, error.",
			"result"),
		recycles: counterVec("sm_recycles_total", "Recycles started, by the limit the cluster stayed over: rss, heap or lag.", "reason"),
		meshDropped: counterVec("sm_mesh_dropped_total", "Cross-host routing's NATS messages or records dropped as garbage or impostors, by reason.",
			"reason"),
	}
	if reg != nil {
		reg.MustRegister(mt.forwarded, mt.failed, mt.latency, mt.restarts, mt.deploys, mt.deployDur,
			mt.identifyGranted, mt.identifyRefused, mt.loopEvents, mt.reshardChecks, mt.recycles, mt.meshDropped, collector{m})
	}
	return mt
}

// counter, counterVec and histogram make the manager's instruments from
// their name and help (and labels, or buckets).
func counter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
}

func counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
}

func histogram(name, help string, buckets []float64) prometheus.Histogram {
	return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets})
}

// collector reports per-cluster state from a snapshot taken on the loop.
type collector struct{ m *Manager }

var (
	descState = prometheus.NewDesc("sm_clusters", "Clusters by state.", []string{"state"}, nil)
	descBeat  = prometheus.NewDesc("sm_cluster_heartbeat_age_seconds", "Time since the cluster's last heartbeat.", []string{"cluster"}, nil)
	descRest  = prometheus.NewDesc("sm_cluster_restarts", "Restarts of the cluster since the manager started.", []string{"cluster"}, nil)
	descLoop  = prometheus.NewDesc("sm_cluster_crash_loop", "1 while the cluster is in a crash loop.", []string{"cluster"}, nil)
	descWait  = prometheus.NewDesc("sm_cluster_waiting_requests", "Requests queued while the cluster has no routed process.", []string{"cluster"}, nil)
	descGen   = prometheus.NewDesc("sm_cluster_generation", "Generation the cluster's process runs.", []string{"cluster"}, nil)
	descPend  = prometheus.NewDesc("sm_requests_in_flight", "Requests forwarded and awaiting a reply.", nil, nil)
	descSubs  = prometheus.NewDesc("sm_feed_subscribers", "State feed subscribers (status page, sm-api).", nil, nil)
	descConns = prometheus.NewDesc("sm_connections", "Registered or registering socket connections.", nil, nil)
	descDepl  = prometheus.NewDesc("sm_deploy_running", "1 while a deploy is running.", nil, nil)
	descWaitI = prometheus.NewDesc("sm_identify_waiting", "IDENTIFY requests waiting for their slot.", nil, nil)
	descBudg  = prometheus.NewDesc("sm_session_starts_remaining", "Discord session starts left (known only with a token).", nil, nil)
	descBlock = prometheus.NewDesc("sm_identify_budget_blocking", "1 while the budget governor refuses restarts' identifies.", nil, nil)
)

func (collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descState, descBeat, descRest, descLoop, descWait, descGen, descPend, descSubs, descConns, descDepl, descWaitI, descBudg, descBlock} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	m := c.m
	m.pmu.Lock()
	inflight := len(m.pending)
	m.pmu.Unlock()
	m.cmu.Lock()
	conns := len(m.conns)
	m.cmu.Unlock()
	ch <- prometheus.MustNewConstMetric(descPend, prometheus.GaugeValue, float64(inflight))
	ch <- prometheus.MustNewConstMetric(descSubs, prometheus.GaugeValue, float64(m.feed.count()))
	ch <- prometheus.MustNewConstMetric(descConns, prometheus.GaugeValue, float64(conns))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, err := m.Status(ctx)
	if err != nil {
		return // the loop is stopped or wedged: per-cluster gauges are absent
	}
	running := 0.0
	if st.Deploy != nil && st.Deploy.Finished.IsZero() {
		running = 1
	}
	ch <- prometheus.MustNewConstMetric(descDepl, prometheus.GaugeValue, running)
	if d := st.Discord; d != nil {
		ch <- prometheus.MustNewConstMetric(descWaitI, prometheus.GaugeValue, float64(d.IdentifyWaiting))
		if d.Budget.Known {
			ch <- prometheus.MustNewConstMetric(descBudg, prometheus.GaugeValue, float64(d.Budget.Remaining))
		}
		block := 0.0
		if d.Budget.Blocking {
			block = 1
		}
		ch <- prometheus.MustNewConstMetric(descBlock, prometheus.GaugeValue, block)
	}
	states := map[supervise.State]int{}
	for _, cs := range st.Clusters {
		states[cs.State]++
		id := strconv.Itoa(cs.ID)
		if cs.HeartbeatMS >= 0 {
			ch <- prometheus.MustNewConstMetric(descBeat, prometheus.GaugeValue, float64(cs.HeartbeatMS)/1000, id)
		}
		ch <- prometheus.MustNewConstMetric(descRest, prometheus.CounterValue, float64(cs.Restarts), id)
		loop := 0.0
		if cs.CrashLoop {
			loop = 1
		}
		ch <- prometheus.MustNewConstMetric(descLoop, prometheus.GaugeValue, loop, id)
		ch <- prometheus.MustNewConstMetric(descWait, prometheus.GaugeValue, float64(cs.Waiting), id)
		ch <- prometheus.MustNewConstMetric(descGen, prometheus.GaugeValue, float64(cs.Generation), id)
	}
	for _, s := range []supervise.State{supervise.StateStarting, supervise.StateRegistered, supervise.StateReady,
		supervise.StateQuiescing, supervise.StateStopping, supervise.StateRestarting, supervise.StateCrashLoop} {
		ch <- prometheus.MustNewConstMetric(descState, prometheus.GaugeValue, float64(states[s]), string(s))
	}
}
