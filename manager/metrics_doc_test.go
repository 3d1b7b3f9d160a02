package manager_test

import (
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/sm-supervisor/sm/discord"
	"github.com/sm-supervisor/sm/manager"
)

const metricsDoc = "../docs/metrics.md"

// metricsDocConditional are sm_* metrics docs/metrics.md lists that this
// test's manager does not expose, each with the reason; every other row must
// be in the scrape.
var metricsDocConditional = map[string]string{
	// A CounterVec has no series until its first label value; a finished
	// deploy costs a whole new generation of processes, too much for this check.
	"sm_deploys_total": "no series until the first deploy finishes",
	// TestReshardWhenDiscordAsks checks its series.
	"sm_reshard_checks_total": "no series while [reshard] is off",
	// Likewise until the first recycle; TestRecycleRSSUnderLoad reads it.
	"sm_recycles_total": "no series until the first recycle",
	// Its reasons are made at 0 only in a mesh: this test's manager is one host.
	"sm_mesh_dropped_total": "only with [mesh] (TestMeshForwardTimeoutAndImpostors scrapes it)",
}

// docRow is one metric row of a table in docs/metrics.md:
// | `name` | type | labels | ... |.
type docRow struct {
	typ    string
	labels []string // backquoted names in the third cell; sm_* rows only
}

var backquoted = regexp.MustCompile("`([^`]+)`")

// readMetricsDoc returns docs/metrics.md, its metric rows by name, and the
// first cells of its other backquoted rows (the label table's, for one).
func readMetricsDoc(t *testing.T) (doc string, rows map[string]docRow, other map[string]bool) {
	t.Helper()
	b, err := os.ReadFile(metricsDoc)
	if err != nil {
		t.Fatal(err)
	}
	rows, other = map[string]docRow{}, map[string]bool{}
	for line := range strings.Lines(string(b)) {
		cells := strings.Split(strings.TrimSpace(line), "|")
		if len(cells) < 4 || cells[0] != "" {
			continue // not a table row of at least two columns
		}
		cells = cells[1:]
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		m := backquoted.FindStringSubmatch(cells[0])
		if m == nil || m[0] != cells[0] {
			continue // a header, a rule, or prose
		}
		name := m[1]
		switch cells[1] {
		case "counter", "gauge", "histogram", "summary":
		default:
			other[name] = true
			continue
		}
		if _, dup := rows[name]; dup {
			t.Errorf("%s: %s has two rows", metricsDoc, name)
		}
		r := docRow{typ: cells[1]}
		if strings.HasPrefix(name, "sm_") {
			for _, l := range backquoted.FindAllStringSubmatch(cells[2], -1) {
				r.labels = append(r.labels, l[1])
			}
			slices.Sort(r.labels)
		}
		rows[name] = r
	}
	return string(b), rows, other
}

// docs/metrics.md lists every metric sm-manager exposes, with its type and
// labels, and every sm_* metric it lists is exposed.
func TestMetricsDocumented(t *testing.T) {
	doc, rows, other := readMetricsDoc(t)

	// A known budget, so that sm_session_starts_remaining is exposed.
	gw := &discord.GatewayBot{Shards: 8, Fetched: time.Now(), SessionStartLimit: discord.SessionStartLimit{
		Total: 1000, Remaining: 1000, ResetAfter: time.Hour, MaxConcurrency: 1,
	}}
	e := startWith(t, testConfig(t), manager.Options{Gateway: gw})
	// cmd/sm-manager registers these on the manager's registry; so do we.
	e.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	e.WaitReady() // the per-cluster gauges need clusters with processes
	c := e.client("doc")
	request(t, c, "ping", "0", nil, 3*time.Second)
	request(t, c, "ping", "99", nil, 3*time.Second) // unknown_target: sm_requests_failed_total's first series

	// Scraped as Prometheus would, kept by family: a histogram is one name.
	srv := httptest.NewServer(promhttp.HandlerFor(e.reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("scrape does not parse: %v", err)
	}

	for name, f := range fams {
		if !strings.Contains(doc, "`"+name+"`") {
			t.Errorf("%s is exposed but not in %s", name, metricsDoc)
			continue
		}
		typ := strings.ToLower(f.GetType().String())
		r, ok := rows[name]
		switch {
		case !ok && strings.HasPrefix(name, "sm_"):
			t.Errorf("%s has no table row in %s", name, metricsDoc)
			continue
		case !ok:
			continue // the Go and process collectors' rest, listed in prose
		case r.typ != typ:
			t.Errorf("%s is a %s, %s says %s", name, typ, metricsDoc, r.typ)
		}
		if !strings.HasPrefix(name, "sm_") {
			continue
		}
		var labels []string
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if !slices.Contains(labels, l.GetName()) {
					labels = append(labels, l.GetName())
				}
			}
		}
		slices.Sort(labels)
		if !slices.Equal(labels, r.labels) {
			t.Errorf("%s has labels %v, %s says %v", name, labels, metricsDoc, r.labels)
		}
		for _, l := range labels {
			if !other[l] {
				t.Errorf("label %q of %s is not in %s's label table (what may it carry?)", l, name, metricsDoc)
			}
		}
	}

	for name := range rows {
		if _, ok := fams[name]; ok || !strings.HasPrefix(name, "sm_") {
			continue
		}
		if why, ok := metricsDocConditional[name]; ok {
			t.Logf("%s not exposed here: %s", name, why)
			continue
		}
		t.Errorf("%s lists %s, which sm-manager does not expose", metricsDoc, name)
	}
	for name := range metricsDocConditional {
		if _, ok := rows[name]; !ok {
			t.Errorf("metricsDocConditional names %s, which %s does not list", name, metricsDoc)
		}
	}
}
