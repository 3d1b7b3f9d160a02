package manager_test

import (
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sm-supervisor/sm/internal/testenv"
	"github.com/sm-supervisor/sm/ipc"
)

// scrape fetches /metrics as Prometheus would and parses the text format.
func (e *env) scrape() map[string]float64 {
	e.t.Helper()
	srv := httptest.NewServer(promhttp.HandlerFor(e.reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := testenv.Metrics(resp.Body)
	if err != nil {
		e.t.Fatalf("scrape does not parse: %v", err)
	}
	return out
}

func TestMetricsMove(t *testing.T) {
	e := start(t, testConfig(t))
	st := e.WaitReady()
	before := e.scrape()
	if before["sm_clusters{state=ready}"] != 4 {
		t.Fatalf("sm_clusters{ready} = %v", before["sm_clusters{state=ready}"])
	}
	c := e.client("m")
	for range 10 {
		if _, err := request(t, c, "ping", "0", nil, 3*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	request(t, c, "ping", "99", nil, 3*time.Second)
	syscall.Kill(st.Clusters[2].PID, syscall.SIGKILL)
	testenv.WaitFor(t, 10*time.Second, "cluster 2 back", func() bool { return e.MustStatus().Clusters[2].Restarts == 1 && e.MustStatus().Clusters[2].Routed })
	after := e.scrape()
	for key, min := range map[string]float64{
		"sm_requests_forwarded_total":                                  before["sm_requests_forwarded_total"] + 10,
		"sm_request_duration_seconds_count":                            10,
		"sm_requests_failed_total{code=" + ipc.CodeUnknownTarget + "}": 1,
		"sm_cluster_restarts_total":                                    1,
		"sm_cluster_restarts{cluster=2}":                               1,
		"sm_connections":                                               5,
	} {
		if after[key] < min {
			t.Errorf("%s = %v, want at least %v", key, after[key], min)
		}
	}
	if !strings.Contains(strings.Join(keys(after), " "), "sm_cluster_heartbeat_age_seconds{cluster=3}") {
		t.Error("no heartbeat age for cluster 3")
	}

	// STATUS's counters are the same instruments: they agree with the scrape.
	cn := e.MustStatus().Counters
	if cn == nil || cn.Since.IsZero() {
		t.Fatalf("STATUS counters %+v", cn)
	}
	for name, pair := range map[string][2]float64{
		"requests_forwarded": {float64(cn.RequestsForwarded), after["sm_requests_forwarded_total"]},
		"requests_failed":    {float64(cn.RequestsFailedByCode[ipc.CodeUnknownTarget]), after["sm_requests_failed_total{code="+ipc.CodeUnknownTarget+"}"]},
		"restarts":           {float64(cn.Restarts), after["sm_cluster_restarts_total"]},
		"identifies_granted": {float64(cn.IdentifiesGranted), after["sm_identify_granted_total"]},
	} {
		if pair[0] != pair[1] || pair[0] == 0 {
			t.Errorf("counters.%s = %v, the scrape says %v (both must be above 0 here)", name, pair[0], pair[1])
		}
	}
	if cn.RequestsFailed != 1 || cn.Deploys != 0 || len(cn.DeploysByState) != 0 {
		t.Errorf("counters %+v: want 1 failure and no deploy", cn)
	}
}

func keys(m map[string]float64) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
